#!/bin/bash
# Run a long command on the device machine across several device calls (each call is capped at
# 10 minutes; a process in its own session outlives the call while the machine stays warm).
#
#   benchmarks/detach.sh start DIR SECONDS [--copy] -- COMMAND [ARGS...]
#       start COMMAND detached (setsid) with its output in DIR/run.log and its exit status in
#       DIR/rc once it ends, then wait as `wait` does. --copy: first copy this repository's
#       tree (symlinks such as .whl and .deb followed; .git, .venv and out/ left out) to
#       DIR/tree and run COMMAND there, so relative paths keep working (see below)
#   benchmarks/detach.sh wait DIR SECONDS
#       wait up to SECONDS for DIR/rc, copy DIR's files to $OUT (when set), print the log's tail;
#       exits with the command's status, or 124 while it still runs
# Each device call copies the working tree afresh, so a detached command's working directory is
# deleted under it by the next call (run 26: a script's second step, a relative path, was not
# found). Files keep their paths and contents; a command of several steps should either run
# from a copy (--copy; run 27 did so by hand) or name its files by absolute path.
# SECONDS is how long this call waits (start waits too), not a limit on COMMAND: keep it under
# the device call's 600 s, or the call is cut with nothing returned (run 54 asked 1500).
set -uo pipefail
verb=${1:?start|wait}
dir=${2:?DIR}
secs=${3:?SECONDS}
shift 3
if [ "$secs" -gt 590 ]; then
  echo "detach: waiting $secs s outlasts a device call (600 s): its output would not come back;" \
    "wait in several calls instead" >&2
fi
if [ "$verb" = start ]; then
  copy=0
  [ "${1:-}" = "--copy" ] && { copy=1; shift; }
  [ "${1:-}" = "--" ] && shift
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)  # absolute: the command may run elsewhere (--copy)
  rm -f "$dir/rc"
  if [ "$copy" = 1 ]; then
    root=$(cd "$(dirname "$0")/.." && pwd)
    rm -rf "$dir/tree" && mkdir -p "$dir/tree"
    tar -C "$root" --exclude=./.git --exclude=./.venv --exclude=./out -chf - . |
      tar -C "$dir/tree" -xf - || { echo "detach: copying $root failed" >&2; exit 2; }
    cd "$dir/tree" || exit 2
  fi
  # shellcheck disable=SC2016  # $@ and $1 expand in the inner shell
  setsid bash -c '"${@:2}" >"$1/run.log" 2>&1 </dev/null; echo $? >"$1/rc"' _ "$dir" "$@" &
  disown
elif [ "$verb" != wait ]; then
  echo "usage: $0 start|wait DIR SECONDS [[--copy] -- COMMAND...]" >&2
  exit 2
fi
end=$(($(date +%s) + secs))
while [ ! -f "$dir/rc" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 2; done
if [ -n "${OUT:-}" ]; then
  for f in "$dir"/*; do [ -f "$f" ] && cp -f "$f" "$OUT/"; done
fi
tail -c 10000 "$dir/run.log" 2>/dev/null
if [ -f "$dir/rc" ]; then exit "$(cat "$dir/rc")"; fi
echo "== still running after ${secs} s: call '$0 wait $dir SECONDS' again"
exit 124
