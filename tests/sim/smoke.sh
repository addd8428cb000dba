#!/usr/bin/env bash
# smoke.sh - end-to-end checks of mirza-sim over real loopback HTTP, with
# curl as the client (independent of mirza's own client, so a bug in one
# cannot hide a bug in the other). Needs curl, jq and python3.
#
#   tests/sim/smoke.sh [path/to/mirza-sim]     (default: $MIRZA_SIM or build/mirza-sim)
#
# Each check prints "ok" or "FAIL"; the exit status is the number of
# failures. The last lines report the --tok-rate 0 throughput.
set -u
SIM=${1:-${MIRZA_SIM:-build/mirza-sim}}
TMP=$(mktemp -d)
PIDS=()
FAILS=0
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT

ok() { printf 'ok    %s\n' "$1"; }
bad() { printf 'FAIL  %s\n' "$1"; FAILS=$((FAILS + 1)); }
check() { local what=$1; shift; if "$@" >/dev/null; then ok "$what"; else bad "$what"; fi; }
# Milliseconds since the epoch: GNU date's %N, else perl (macOS's date has no
# %N: it prints an N). MIRZA_TEST_NO_GNU_DATE=1 takes perl here too.
now_ms() {
  local ns
  ns=$(date +%s%N)
  case $ns${MIRZA_TEST_NO_GNU_DATE:+x} in
  *[!0-9]*) perl -MTime::HiRes=time -e 'printf "%d\n", time * 1000' ;;
  *) echo $((ns / 1000000)) ;;
  esac
}

# start_sim NAME ARGS... : run mirza-sim --port 0, set PORT_<NAME> and PID_<NAME>.
start_sim() {
  local name=$1; shift
  "$SIM" --port 0 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 100); do
    grep -q '^mirza-sim listening on http://' "$TMP/$name.out" 2>/dev/null && break
    sleep 0.05
  done
  local port
  port=$(sed -n 's|^mirza-sim listening on http://.*:\([0-9]*\)$|\1|p' "$TMP/$name.out")
  [ -n "$port" ] || { echo "mirza-sim $name did not start:"; cat "$TMP/$name.err"; exit 100; }
  printf -v "PORT_$name" '%s' "$port"
  printf -v "PID_$name" '%s' "$pid"
}

# sse_check FILE MODE : validate an SSE body with python (MODE selects the rules).
sse_check() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
path, mode = sys.argv[1], sys.argv[2]
raw = open(path, 'rb').read()
events = [e for e in raw.split(b'\n\n') if e.strip()]
datas = [e[len(b'data: '):] for e in events]
def fail(msg):
    print('   ', msg, file=sys.stderr); sys.exit(1)
if mode == 'cut':
    if b'[DONE]' in raw: fail('stream was not cut')
    sys.exit(0)
if datas[-1] != b'[DONE]' and mode != 'llama-error': fail('no [DONE] at the end')
frames = [json.loads(d.decode('utf-8', 'replace')) for d in datas if d != b'[DONE]']
if mode == 'thinking':
    kinds = []
    for f in frames:
        d = f['choices'][0]['delta']
        k = 'role' if 'role' in d else 'r' if 'reasoning_content' in d else 'c' if 'content' in d else 'x'
        if k != 'x' and (not kinds or kinds[-1] != k): kinds.append(k)
        if 'error' in f: fail('error frame')
    if kinds != ['role', 'r', 'c']: fail('order %s' % kinds)
    last = frames[-1]
    if last['choices'][0]['finish_reason'] != 'stop': fail('finish')
    u, s = last['usage'], last['mtplx_stats']
    if u['completion_tokens'] != s['reasoning_tokens'] + s['answer_tokens']: fail('usage')
    if not any('mtplx_progress' in f for f in frames): fail('no progress frame')
elif mode == 'llama-usage':
    if frames[0]['choices'][0]['delta'] != {'role': 'assistant', 'content': None}: fail('role')
    fin, use = frames[-2], frames[-1]
    if fin['choices'][0]['finish_reason'] not in ('stop', 'length') or 'timings' in fin: fail('finish frame')
    if use['choices'] != [] or 'usage' not in use or 'timings' not in use: fail('usage frame')
    if use['usage']['completion_tokens'] != len(frames) - 3: fail('token count')
elif mode == 'mtplx-error':
    last = frames[-1]
    if last['choices'][0]['finish_reason'] != 'error' or last['error']['code'] != 'SimulatedError': fail('error frame')
    n = sum(1 for f in frames if f['choices'][0]['delta'].get('content'))
    if n != 3: fail('%d tokens before the error' % n)
elif mode == 'llama-error':
    if b'[DONE]' in raw: fail('[DONE] after a llama error')
    if 'choices' in frames[-1] or frames[-1]['error']['code'] != 500: fail('error event')
elif mode == 'utf8':
    parts = [f['choices'][0]['delta'].get('content', '') for f in frames]
    # json.loads already replaced broken bytes: look at the raw bytes instead.
    raw_parts = []
    for d in datas:
        i = d.find(b'"content":"')
        if i >= 0 and b'"role"' not in d:
            raw_parts.append(d[i + 11:d.index(b'"}', i)])
    broken = 0
    for p in raw_parts:
        try: p.decode('utf-8')
        except UnicodeDecodeError: broken += 1
    if broken < 2: fail('no split character (%d broken frames)' % broken)
    joined = b''.join(raw_parts).decode('utf-8')
    if '€' not in joined or '🙂' not in joined: fail('joined text %r' % joined[:60])
print('   ', mode, len(frames), 'frames')
EOF
}

chat() { # chat PORT JSON [curl args...]
  local port=$1 body=$2; shift 2
  curl -sN "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "$body" "$@"
}

start_sim m --tok-rate 2000 --ttft-ms 20
start_sim l --dialect llama --tok-rate 2000 --ttft-ms 20 --model-id tiny-random
M=$PORT_m L=$PORT_l
U='"messages":[{"role":"system","content":"You are terse. You are terse. You are terse."},{"role":"user","content":"Bonjour"}]'

# --- health and models
check "port line format" grep -qE '^mirza-sim listening on http://127\.0\.0\.1:[0-9]+$' "$TMP/m.out"
curl -s "http://127.0.0.1:$M/health" >"$TMP/h.json"
check "mtplx /health" jq -e ".ok == true and .model == \"mirza-sim\" and .startup.pid == $PID_m" "$TMP/h.json"
check "llama /health" test "$(curl -s "http://127.0.0.1:$L/health")" = '{"status":"ok"}'
curl -s "http://127.0.0.1:$M/v1/models" >"$TMP/mod.json"
check "mtplx /v1/models" jq -e '.data[0].id == "mirza-sim" and .data[0].context_length == 32768' "$TMP/mod.json"
curl -s "http://127.0.0.1:$L/v1/models" >"$TMP/mod.json"
check "llama /v1/models meta.n_ctx" jq -e '.data[0].meta.n_ctx == 32768' "$TMP/mod.json"
check "unknown path -> 404" test "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$M/nope")" = 404

# --- streams
chat "$M" "{$U,\"stream\":true,\"enable_thinking\":true}" -H 'X-MTPLX-Allow-Client-Controls: 1' >"$TMP/think.sse"
check "mtplx thinking stream: role, reasoning, content, usage+stats, [DONE]" sse_check "$TMP/think.sse" thinking
check "mtplx_control_owner client" grep -q '"mtplx_control_owner":"client"' "$TMP/think.sse"
chat "$L" "{$U,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"chat_template_kwargs\":{\"enable_thinking\":false}}" >"$TMP/lu.sse"
check "llama stream with include_usage" sse_check "$TMP/lu.sse" llama-usage
chat "$M" "{$U,\"max_tokens\":5}" >"$TMP/ns.json"
check "non-stream max_tokens -> length" jq -e '.choices[0].finish_reason == "length" and .usage.completion_tokens == 5' "$TMP/ns.json"
a=$(chat "$M" "{$U}" | jq -r .choices[0].message.content)
b=$(chat "$M" "{$U}" | jq -r .choices[0].message.content)
c=$(chat "$M" '{"messages":[{"role":"user","content":"Something else"}]}' | jq -r .choices[0].message.content)
check "deterministic text" test "$a" = "$b" -a "$a" != "$c"
check "exact text override" test "$(chat "$M" "{$U,\"mirza_sim\":{\"text\":\"Il fait beau.\"}}" | jq -r .choices[0].message.content)" = "Il fait beau."

# --- errors
check "missing messages -> 400" test "$(chat "$M" '{}' -o /dev/null -w '%{http_code}')" = 400
check "llama invalid JSON -> 500" test "$(chat "$L" '{"messages":[' -o /dev/null -w '%{http_code}')" = 500
check "bad reasoning_effort -> 400" test "$(chat "$M" "{$U,\"reasoning_effort\":\"max\"}" -o /dev/null -w '%{http_code}')" = 400

# --- faults
chat "$M" "{$U,\"stream\":true}" -H 'X-Mirza-Sim-Fault: error-after=3' >"$TMP/err.sse"
check "fault error-after=3 (mtplx)" sse_check "$TMP/err.sse" mtplx-error
chat "$L" "{$U,\"stream\":true,\"mirza_sim\":{\"fault\":\"error-after=3\"}}" >"$TMP/lerr.sse"
check "fault error-after=3 (llama)" sse_check "$TMP/lerr.sse" llama-error
chat "$M" "{$U,\"stream\":true}" -H 'X-Mirza-Sim-Fault: cut-after=5' >"$TMP/cut.sse"
rc=$?
check "fault cut-after=5: curl sees a cut transfer (rc=$rc)" test "$rc" = 18
check "fault cut-after=5: no [DONE]" sse_check "$TMP/cut.sse" cut
curl -s -D "$TMP/h429" -o /dev/null "http://127.0.0.1:$M/v1/chat/completions" -d "{$U}" \
  -H 'X-Mirza-Sim-Fault: http=429:slow down'
check "fault http=429 with Retry-After" grep -qi '^Retry-After: 1' "$TMP/h429"
chat "$M" "{$U,\"stream\":true}" -H 'X-Mirza-Sim-Fault: utf8-split' >"$TMP/u8.sse"
check "fault utf8-split" sse_check "$TMP/u8.sse" utf8

# --- issue 18: embeddings, structured answers, completions, the slots' prefix cache
emb() { curl -s "http://127.0.0.1:$1/v1/embeddings" -d "$2"; }
emb "$M" '{"input":["a b","c","a b"]}' >"$TMP/e.json"
check "embeddings: 3 unit vectors, equal texts equal" python3 -c '
import json, math, sys
r = json.load(open(sys.argv[1]))
v = [d["embedding"] for d in r["data"]]
assert [d["index"] for d in r["data"]] == [0, 1, 2] and all(len(x) == 16 for x in v)
assert all(abs(math.sqrt(sum(c * c for c in x)) - 1) < 1e-5 for x in v) and v[0] == v[2] != v[1]
' "$TMP/e.json"
emb "$L" '{"input":"x","encoding_format":"base64","dimensions":3}' >"$TMP/e64.json"
check "embeddings (llama): base64 of 3 float32" python3 -c '
import base64, json, sys
r = json.load(open(sys.argv[1]))
assert list(r) == ["model", "object", "usage", "data"] and len(base64.b64decode(r["data"][0]["embedding"])) == 12
' "$TMP/e64.json"
RF='"response_format":{"type":"json_schema","json_schema":{"name":"t","schema":{"type":"object","properties":{"n":{"type":"integer","minimum":5,"maximum":6},"l":{"type":"array","items":{"type":"boolean"},"minItems":4}},"required":["n","l"]}}}'
chat "$M" "{$U,$RF}" >"$TMP/rf.json"
check "response_format: JSON in shape" jq -e '.choices[0].message.content | fromjson | (.n >= 5 and .n <= 6 and (.l | length) == 4)' "$TMP/rf.json"
chat "$M" "{$U,$RF}" -H 'X-Mirza-Sim-Fault: schema-break' >"$TMP/rfb.json"
check "schema-break: the required n missing" jq -e '.choices[0].message.content | fromjson | has("n") | not' "$TMP/rfb.json"
curl -s "http://127.0.0.1:$L/v1/completions" -d '{"prompt":"Once","max_tokens":3}' >"$TMP/cmpl.json"
check "llama /v1/completions" jq -e '.object == "text_completion" and .choices[0].finish_reason == "length" and (.choices[0].text | length) > 0' "$TMP/cmpl.json"
P="\"messages\":[{\"role\":\"system\",\"content\":\"$(printf 'preamble %.0s' $(seq 100))\"},{\"role\":\"user\",\"content\":\"q\"}]"
chat "$L" "{$P}" >/dev/null
chat "$L" "{$P}" >"$TMP/pc.json"
check "prefix cache: a repeated prompt is cached but its last token" jq -e '.timings.cache_n == .usage.prompt_tokens - 1' "$TMP/pc.json"

# --- keep-alive: two requests on one curl invocation share the connection
curl -sv "http://127.0.0.1:$M/health" "http://127.0.0.1:$M/v1/models" >/dev/null 2>"$TMP/ka.txt"
check "keep-alive (plain)" grep -q 'Re-using existing connection' "$TMP/ka.txt"
curl -svN "http://127.0.0.1:$M/v1/chat/completions" -d "{$U,\"stream\":true}" --next \
  "http://127.0.0.1:$M/v1/chat/completions" -d "{$U,\"stream\":true}" >/dev/null 2>"$TMP/ka2.txt"
check "keep-alive after a chunked stream" grep -q 'Re-using existing connection' "$TMP/ka2.txt"

# --- session cache: the second turn shares the prefix of the first
H='X-MTPLX-Session-Id: conv-1'
chat "$M" "{$U}" -H "$H" >/dev/null
chat "$M" "{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse. You are terse. You are terse.\"},{\"role\":\"user\",\"content\":\"Encore\"}]}" -H "$H" >"$TMP/c2.json"
check "session cache hit" jq -e '.mtplx_stats.session_cache_hit == true and .usage.prompt_tokens_details.cached_tokens > 0' "$TMP/c2.json"
chat "$L" "{$U}" >/dev/null
chat "$L" "{$U}" >"$TMP/lc.json"
check "llama cache_n" jq -e '.timings.cache_n > 0 and .usage.prompt_tokens_details.cached_tokens == .timings.cache_n' "$TMP/lc.json"

# --- SIGTERM: exit 0 promptly
start_sim t
t0=$(now_ms)
kill -TERM "$PID_t"
wait "$PID_t"
rc=$?
ms=$(($(now_ms) - t0))
check "SIGTERM -> exit 0 in ${ms} ms" test "$rc" = 0 -a "$ms" -lt 500

# --- throughput at --tok-rate 0
start_sim f --tok-rate 0 --ttft-ms 0 --context-window 1000000
N=200000
t0=$(now_ms)
chat "$PORT_f" "{$U,\"stream\":true,\"mirza_sim\":{\"answer_tokens\":$N}}" >"$TMP/big.sse"
t1=$(now_ms)
got=$(grep -c '"content"' "$TMP/big.sse")
check "200k-token stream complete ($got content frames)" test "$got" = "$N"
ms=$((t1 - t0))
echo "throughput: $N tokens in $ms ms = $((N * 1000 / (ms > 0 ? ms : 1))) tokens/s ($(wc -c <"$TMP/big.sse" | tr -d ' ') bytes)"

# --- sanitizer reports (when run against an ASan/UBSan build)
if grep -l -E 'Sanitizer|runtime error' "$TMP"/*.err >/dev/null 2>&1; then
  grep -h -A20 -E 'Sanitizer|runtime error' "$TMP"/*.err | head -60
  bad "sanitizer reports in mirza-sim's stderr"
fi

echo "failures: $FAILS"
exit "$FAILS"
