#!/bin/sh
# setup.sh - install what is missing (Debian packages) and build mirza.
#   scripts/setup.sh [build-dir] [extra cmake args...]
#   scripts/setup.sh --packages PKG...   (install only; scripts/check-install)
# Sourced by scripts/demo and scripts/test; safe to run again (no-op when
# everything is installed and the build is up to date). MIRZA_EXTRA_PACKAGES
# adds packages only some jobs need (scripts/fuzz: clang).
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-build}
[ $# -gt 0 ] && shift

PACKAGES="build-essential cmake pkg-config liblua5.4-dev lua5.4 libcurl4-openssl-dev libcjson-dev libcmocka-dev lua-busted procps curl jq python3 valgrind openssl ${MIRZA_EXTRA_PACKAGES:-}"
PACKAGES="$PACKAGES libreadline-dev" # line editing in the interactive prompt
# Node.js and npm for the OpenAI SDK conformance test (tests/sdk): only when
# missing, so a Node.js that ships its own npm is left alone.
command -v node >/dev/null 2>&1 || PACKAGES="$PACKAGES nodejs"
command -v npm >/dev/null 2>&1 || PACKAGES="$PACKAGES npm"
# scripts/setup.sh --packages P...: install just these (check tools), no build.
[ "$BUILD" = "--packages" ] && PACKAGES="$*"
missing=""
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing$missing" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

[ "$BUILD" = "--packages" ] && exit 0
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$BUILD" -j"$(nproc)" >/dev/null
