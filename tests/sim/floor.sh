#!/usr/bin/env bash
# floor.sh - tests/c/curl_floor (libcurl alone on a batch's traffic, the
# floor scripts/bench.lua prints under the batch rows) against mirza-sim,
# briefly, so that it cannot rot: every item answered with bytes counted,
# and a refused connection counted as a failure (exit 1), not as an item.
#
#   tests/sim/floor.sh path/to/mirza-sim path/to/curl_floor
set -u
SIM=$1 FLOOR=$2
TMP=$(mktemp -d)
PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$TMP"' EXIT
"$SIM" --port 0 --port-file "$TMP/port" --quiet >"$TMP/sim.out" 2>&1 &
PID=$!
for _ in $(seq 200); do [ -s "$TMP/port" ] && break; sleep 0.05; done
PORT=$(cat "$TMP/port" 2>/dev/null)
[ -n "$PORT" ] || { echo "mirza-sim did not start:"; cat "$TMP/sim.out"; exit 1; }
URL="http://127.0.0.1:$PORT/v1/chat/completions"
printf '%s' '{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":20,"mirza_sim":{"answer_tokens":20,"tok_rate":400,"ttft_ms":0}}' >"$TMP/body.json"
FAILS=0
out=$("$FLOOR" "$URL" "$TMP/body.json" 40 8 50); rc=$?
echo "$out"
if [ $rc -eq 0 ] && [[ $out == *'"items":40,"ok":40,'* ]] && ! [[ $out == *'"bytes":0,'* ]]; then echo "ok    40 items through 8 kept connections"
else echo "FAIL  40 items (rc $rc)"; FAILS=$((FAILS + 1)); fi
kill "$PID"; wait "$PID" 2>/dev/null; PID=
out=$("$FLOOR" "$URL" "$TMP/body.json" 4 2 0); rc=$?
echo "$out"
if [ $rc -eq 1 ] && [[ $out == *'"items":4,"ok":0,'* ]]; then echo "ok    a refused connection is a failure"
else echo "FAIL  refused connection (rc $rc)"; FAILS=$((FAILS + 1)); fi
"$FLOOR" "$URL" 2>/dev/null; rc=$?
if [ $rc -eq 2 ]; then echo "ok    bad arguments: exit 2"; else echo "FAIL  bad arguments (rc $rc)"; FAILS=$((FAILS + 1)); fi
exit $FAILS
