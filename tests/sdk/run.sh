#!/usr/bin/env bash
# run.sh - the OpenAI SDK conformance test (ctest sdk.conformance): installs
# the official `openai` npm package into the build tree, then runs
# tests/sdk/conformance.mjs against mirza-sim in each dialect.
#
#   tests/sdk/run.sh path/to/mirza-sim BUILD_DIR
#
# The package is pinned (OPENAI_VERSION) and installed once into
# BUILD_DIR/npm (`npm install --no-audit --no-fund --ignore-scripts`); a
# second run finds it there and does not reinstall.
#   - no node or npm on the machine: SKIP (exit 77, which ctest shows as
#     "Skipped") with a message naming the Debian packages, except on CI
#     (CI set), where that is a failure: scripts/setup.sh installs them.
#   - the registry cannot be reached: FAIL, loudly, never a skip.
#   - MIRZA_SDK_TEST=skip: an explicit SKIP (77), for a machine kept offline.
# Every sim is started on a free port (--port 0 and --port-file) and killed
# by the EXIT trap, whatever happens; node runs under scripts/timeout (GNU
# timeout, or what stands for it on macOS).
set -u
SIM=${1:?usage: run.sh MIRZA_SIM BUILD_DIR}
BUILD=$(cd "${2:?usage: run.sh MIRZA_SIM BUILD_DIR}" && pwd) || exit 1
HERE=$(cd "${0%/*}" && pwd)
TIMEOUT=$HERE/../../scripts/timeout
OPENAI_VERSION=6.49.0
NPM_DIR=$BUILD/npm
KEY=sdk-test-key

skip() {
  echo "SKIP sdk.conformance: $1"
  exit 77
}
fail() {
  echo "FAIL sdk.conformance: $1"
  exit 1
}

[ "${MIRZA_SDK_TEST:-}" = skip ] && skip "MIRZA_SDK_TEST=skip is set; unset it to run the OpenAI SDK conformance test"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  msg="node and npm are needed (Debian packages nodejs and npm, Homebrew's node; scripts/setup.sh installs them)"
  [ -n "${CI:-}" ] && fail "$msg; on CI this test must run"
  skip "$msg"
fi

# ---- the SDK, pinned, cached in the build tree
installed() {
  node -e 'process.exit(require(process.argv[1]).version === process.argv[2] ? 0 : 1)' \
    "$NPM_DIR/node_modules/openai/package.json" "$OPENAI_VERSION" 2>/dev/null
}
if ! installed; then
  mkdir -p "$NPM_DIR" || fail "cannot create $NPM_DIR"
  [ -f "$NPM_DIR/package.json" ] || echo '{"private": true, "description": "mirza: the SDK conformance test"}' >"$NPM_DIR/package.json"
  echo "installing openai@$OPENAI_VERSION into $NPM_DIR"
  if ! (cd "$NPM_DIR" && "$TIMEOUT" 300 npm install --no-audit --no-fund --ignore-scripts --save-exact \
    --fetch-retries=2 --fetch-timeout=60000 "openai@$OPENAI_VERSION"); then
    fail "cannot install openai@$OPENAI_VERSION from the npm registry (npm's message above): connect this machine to the registry once (the package is then cached in $NPM_DIR), or set MIRZA_SDK_TEST=skip to skip this test explicitly"
  fi
  installed || fail "npm finished but $NPM_DIR/node_modules/openai is not version $OPENAI_VERSION"
fi

# ---- the simulators
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start_sim NAME ARGS... : mirza-sim on a free port; sets PORT.
start_sim() {
  local name=$1
  shift
  "$SIM" --port 0 --port-file "$TMP/$name.port" --quiet "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  PIDS+=("$!")
  for _ in $(seq 200); do
    [ -s "$TMP/$name.port" ] && break
    kill -0 "$!" 2>/dev/null || break
    sleep 0.05
  done
  PORT=$(cat "$TMP/$name.port" 2>/dev/null)
  [ -n "$PORT" ] || {
    cat "$TMP/$name.err"
    fail "mirza-sim $name did not start (its stderr is above)"
  }
}

FAILS=0
for dialect in mtplx llama; do
  common=(--dialect "$dialect" --model-id sdk-model --tok-rate 0 --ttft-ms 0)
  start_sim "$dialect" "${common[@]}" --api-key "$KEY" --tool-script "$HERE/tools.json"
  base=http://127.0.0.1:$PORT/v1
  start_sim "$dialect-retry" "${common[@]}" --api-key "$KEY" --fail-first 1
  retry=http://127.0.0.1:$PORT/v1
  MIRZA_SDK_DIR=$NPM_DIR MIRZA_SDK_DIALECT=$dialect MIRZA_SDK_BASE=$base MIRZA_SDK_KEY=$KEY \
    MIRZA_SDK_RETRY_BASE=$retry "$TIMEOUT" 120 node "$HERE/conformance.mjs" || FAILS=$((FAILS + 1))
done
[ "$FAILS" = 0 ] || fail "$FAILS dialect(s) with failed checks (the 'not ok' lines above)"
echo "sdk.conformance: openai@$OPENAI_VERSION passed in both dialects"
