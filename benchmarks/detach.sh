#!/bin/bash
# Run a long command on the device machine across several device calls (each call is capped at
# 10 minutes; a process in its own session outlives the call while the machine stays warm).
#
#   benchmarks/detach.sh start DIR SECONDS -- COMMAND [ARGS...]
#       start COMMAND detached (setsid) with its output in DIR/run.log and its exit status in
#       DIR/rc once it ends, then wait as `wait` does
#   benchmarks/detach.sh wait DIR SECONDS
#       wait up to SECONDS for DIR/rc, copy DIR's files to $OUT (when set), print the log's tail;
#       exits with the command's status, or 124 while it still runs
# Each device call copies the working tree afresh, so a detached command's working directory is
# deleted under it by the next call (run 26: a script's second step, a relative path, was not
# found). Files keep their paths and contents; a command of several steps should name them by
# absolute path (say "$ROOT/benchmarks/...") instead of relying on its working directory.
set -uo pipefail
verb=${1:?start|wait}
dir=${2:?DIR}
secs=${3:?SECONDS}
shift 3
if [ "$verb" = start ]; then
  [ "${1:-}" = "--" ] && shift
  mkdir -p "$dir"
  rm -f "$dir/rc"
  # shellcheck disable=SC2016  # $@ and $1 expand in the inner shell
  setsid bash -c '"${@:2}" >"$1/run.log" 2>&1 </dev/null; echo $? >"$1/rc"' _ "$dir" "$@" &
  disown
elif [ "$verb" != wait ]; then
  echo "usage: $0 start|wait DIR SECONDS [-- COMMAND...]" >&2
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
