#!/usr/bin/env bash
# leftovers.sh - no process the test suite started may outlive it (issue 19).
#
#   tests/leftovers.sh start BUILD_DIR   note when this ctest run began
#   tests/leftovers.sh check BUILD_DIR   fail naming every process of this run still alive
#
# ctest runs `start` first (FIXTURES_SETUP) and `check` after every other test
# (FIXTURES_CLEANUP), also under -j and -R. A process belongs to this run when
# its environment holds MIRZA_BUILD_DIR=BUILD_DIR (every test gets it, and the
# sims and child mirzas they start inherit it) and it started after `start`:
# other build trees' runs and leftovers of earlier runs are not counted. What
# is found is named (with the test that started it, from MIRZA_TEST_NAME) and
# stopped (TERM, then KILL), so the next run starts clean. Linux only (/proc):
# skipped (77) elsewhere.
set -u
mode=${1:-}
build=${2:-}
if [ -z "$mode" ] || [ -z "$build" ]; then
  echo "usage: tests/leftovers.sh start|check BUILD_DIR" >&2
  exit 2
fi
if [ ! -r /proc/self/stat ]; then
  echo "leftovers: no /proc here: the leftover-process check is skipped"
  exit 77
fi
stamp=$build/Testing/leftovers-start
# This script's own children must not look like the suite's.
unset MIRZA_BUILD_DIR MIRZA_TEST_NAME

# Start time of a process, in clock ticks since boot (field 22 of /proc/PID/stat).
starttime() {
  local stat
  read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
  stat=${stat##*) } # the fields after "(comm) "
  # shellcheck disable=SC2086
  set -- $stat
  [ "$1" = Z ] && return 1 # a zombie is gone already
  echo "${20}"
}

case $mode in
start)
  mkdir -p "$build/Testing"
  since=$(starttime $$)
  echo "$since" >"$stamp"
  # Return only once the clock has ticked past our own start: every process
  # of the run then started after `since`, every earlier one at or before it.
  until [ "$(awk '{ print $22 }' /proc/self/stat)" -gt "$since" ]; do
    sleep 0.005
  done
  exit 0
  ;;
check) ;;
*)
  echo "leftovers: unknown mode '$mode' (start or check)" >&2
  exit 2
  ;;
esac

if [ ! -s "$stamp" ]; then
  echo "leftovers: $stamp is missing: run the suite through ctest (hygiene.start runs first)" >&2
  exit 1
fi
since=$(cat "$stamp")
marker="MIRZA_BUILD_DIR=$build"

# The pids of this run's processes still alive.
ours() {
  local dir pid t
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    [ "$pid" = $$ ] && continue
    t=$(starttime "$pid") || continue
    [ "$t" -gt "$since" ] || continue
    tr '\0' '\n' <"$dir/environ" 2>/dev/null | grep -qxF "$marker" || continue
    echo "$pid"
  done
}

# A process that is exiting (a daemon taken down with its supervisor) gets a
# few seconds to go.
left=
for _ in $(seq 1 30); do
  left=$(ours)
  [ -z "$left" ] && break
  sleep 0.1
done
if [ -z "$left" ]; then
  echo "leftovers: no process of this run is left"
  exit 0
fi

echo "leftovers: processes the suite started are still running (a test without cleanup: give it finally(...)):"
for pid in $left; do
  test=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^MIRZA_TEST_NAME=//p')
  args=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)
  echo "  pid $pid, started by ${test:-?}: $args"
done
# shellcheck disable=SC2086
kill $left 2>/dev/null
for _ in $(seq 1 50); do
  [ -z "$(ours)" ] && break
  sleep 0.1
done
left=$(ours)
# shellcheck disable=SC2086
[ -n "$left" ] && kill -9 $left 2>/dev/null
echo "leftovers: stopped them"
exit 1
