#!/bin/bash
# The GPU-only test suites on the GPU machine, one file at a time, each file's summary line
# printed as soon as it ends (run 29 piped one pytest run of all of them into `tail` and lost
# everything when the session's device time ran out first). Carry .whl and .deb
# (device_wheels.sh); SKIP_WHEELS=1 PY=.venv/bin/python runs it here.
#   benchmarks/gpu_tests.sh                       # every GPU suite
#   benchmarks/gpu_tests.sh tests/kernels/test_gpu_nsa.py -k "not variants"   # one, with options
# Full output per file in $OUT (default /tmp/kgrade-gpu-tests); exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-python3}
OUT=${OUT:-/tmp/kgrade-gpu-tests}
WORK=$OUT
mkdir -p "$OUT"
# the pipeline's set-up: .whl into $WORK/site on PYTHONPATH, .deb unpacked, the import check
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh
run() {  # one pytest run: its summary line as soon as it ends, failures listed
  local name=$1 log
  shift
  log="$OUT/$(echo "$name" | tr -c 'A-Za-z0-9_.' '_' | cut -c1-80).log"
  local t0
  t0=$(date +%s)
  "$PY" -m pytest -q -p no:cacheprovider -rfE "$@" >"$log" 2>&1 || status=1
  echo "$(date +%H:%M:%S) $name: $(tail -1 "$log") ($(($(date +%s) - t0)) s)"
  grep -E "^(FAILED|ERROR) " "$log" | head -20
}
status=0
if [ $# -gt 0 ]; then
  run "$1" "$@"
else
  # every file whose tests need CUDA (they skip on a CPU); the ring's needs two GPUs and
  # skips on one. The NSA Gluon and benchmark-script files were missing until run 89.
  for f in tests/kernels/test_gpu_attention.py tests/kernels/test_gpu_nsa.py \
    tests/kernels/test_gpu_nsa_gluon.py tests/benchmarks/test_nsa_scripts_gpu.py \
    tests/workers/test_raw_format.py tests/workers/test_gpu.py \
    tests/kernels/test_ring_distributed.py; do
    run "$f" "$f"
  done
fi
exit $status
