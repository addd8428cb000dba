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
# stopped (TERM, then KILL), so the next run starts clean.
# Where /proc is (Linux) it is read: start times in clock ticks, environments.
# Elsewhere (macOS; MIRZA_TEST_NO_PROC=1 here) `ps` tells the same: `start`
# notes every process then alive (pid and start time: `ps -o lstart`), so a
# process of the run is one not in that list; the environments come from
# `ps -E` (macOS) or `ps e` (procps).
set -u
mode=${1:-}
build=${2:-}
if [ -z "$mode" ] || [ -z "$build" ]; then
  echo "usage: tests/leftovers.sh start|check BUILD_DIR" >&2
  exit 2
fi
use_proc=1
[ -r /proc/self/stat ] && [ "${MIRZA_TEST_NO_PROC:-}" != 1 ] || use_proc=0
stamp=$build/Testing/leftovers-start
# This script's own children must not look like the suite's.
unset MIRZA_BUILD_DIR MIRZA_TEST_NAME

# Start time of a process, in clock ticks since boot (field 22 of
# /proc/PID/stat), into $st: no subshell, so a scan of every process forks
# nothing for the many that started before the run.
starttime() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) } # the fields after "(comm) "
  # shellcheck disable=SC2086
  set -- $stat
  [ "$1" = Z ] && return 1 # a zombie is gone already
  st=${20}
}

# Without /proc: "PID STAT LSTART(5 words) COMMAND ENVIRONMENT" of every
# process (the environment shown after the command: -E on macOS, e in procps).
ps_all() {
  if [ "$(uname -s)" = Darwin ]; then
    ps -A -E -ww -o pid=,stat=,lstart=,command=
  else
    ps -A -ww -o pid=,stat=,lstart=,args= e
  fi
}

# Without /proc: "PID LSTART" of every live process, one a line (who was
# there at `start`).
ps_known() {
  ps -A -o pid=,lstart= | awk '{ print $1, $2, $3, $4, $5, $6 }'
}

case $mode in
start)
  mkdir -p "$build/Testing"
  if [ "$use_proc" = 0 ]; then
    { echo ps; ps_known; } >"$stamp.tmp" && mv "$stamp.tmp" "$stamp"
    exit 0
  fi
  starttime $$
  since=$st
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
since=$(head -n 1 "$stamp")
if { [ "$since" = ps ] && [ "$use_proc" = 1 ]; } || { [ "$since" != ps ] && [ "$use_proc" = 0 ]; }; then
  echo "leftovers: $stamp was written by start the other way (/proc or ps): run both with the same MIRZA_TEST_NO_PROC" >&2
  exit 1
fi
marker="MIRZA_BUILD_DIR=$build"

# The pids of this run's processes still alive.
ours() {
  if [ "$use_proc" = 0 ]; then
    ours_ps
    return
  fi
  local dir pid st
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    [ "$pid" = $$ ] && continue
    starttime "$pid" || continue
    [ "$st" -gt "$since" ] || continue
    { tr '\0' '\n' <"$dir/environ"; } 2>/dev/null | grep -qxF "$marker" || continue
    echo "$pid"
  done
}

# The same from `ps`: marked, not a zombie, not alive at `start` (its pid and
# start time are not in the list `start` wrote).
ours_ps() {
  local pid stat w1 w2 w3 w4 w5 rest
  ps_all | while read -r pid stat w1 w2 w3 w4 w5 rest; do
    [ "$pid" = $$ ] && continue
    case $stat in Z*) continue ;; esac
    case " $rest " in *" $marker "*) ;; *) continue ;; esac
    grep -qxF "$pid $w1 $w2 $w3 $w4 $w5" "$stamp" && continue
    printf '%s\n' "$pid"
  done
}

# What a leftover was started by (MIRZA_TEST_NAME in its environment) and its
# command line.
test_of() {
  if [ "$use_proc" = 1 ]; then
    { tr '\0' '\n' <"/proc/$1/environ"; } 2>/dev/null | sed -n 's/^MIRZA_TEST_NAME=//p'
  else
    ps_all | awk -v pid="$1" '$1 == pid { for (i = 8; i <= NF; i++) if ($i ~ /^MIRZA_TEST_NAME=/) { sub(/^MIRZA_TEST_NAME=/, "", $i); print $i; exit } }'
  fi
}
args_of() {
  if [ "$use_proc" = 1 ]; then
    { tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null
  else
    ps -ww -o args= -p "$1" 2>/dev/null
  fi
}

# A process that is exiting (a daemon taken down with its supervisor) gets a
# few seconds to go: 3 s by the clock, not a count of scans (one scan of
# /proc takes seconds on a loaded machine).
left=
t0=$SECONDS
while :; do
  left=$(ours)
  [ -z "$left" ] && break
  [ $((SECONDS - t0)) -ge 3 ] && break
  sleep 0.1
done
if [ -z "$left" ]; then
  echo "leftovers: no process of this run is left"
  exit 0
fi

echo "leftovers: processes the suite started are still running (a test without cleanup: give it finally(...)):"
for pid in $left; do
  echo "  pid $pid, started by $(test_of "$pid" | grep . || echo ?): $(args_of "$pid")"
done
# shellcheck disable=SC2086
kill $left 2>/dev/null
t0=$SECONDS
while [ -n "$(ours)" ] && [ $((SECONDS - t0)) -lt 5 ]; do
  sleep 0.1
done
left=$(ours)
# shellcheck disable=SC2086
[ -n "$left" ] && kill -9 $left 2>/dev/null
echo "leftovers: stopped them"
exit 1
