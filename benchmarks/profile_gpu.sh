#!/bin/bash
# Where a grading's seconds go, on the GPU machine (issue 18): the capture files' cost
# (benchmarks/capture_io.py), then a few gradings in-process with the batch ends' split
# (benchmarks/grade_profile.py; JSON in $OUT/profile.json). Needs .whl and .deb carried.
# Usage: benchmarks/profile_gpu.sh [grade_profile.py targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-python3}
WORK=${KGRADE_PIPELINE_DIR:-/tmp/kgrade-profile}
OUT=${OUT:-$WORK/out}
mkdir -p "$WORK" "$OUT"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh
export PYTHONUNBUFFERED=1
"$PY" benchmarks/capture_io.py
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(attention-merge:reference attention-merge:correct/stable_fp32:ranked
    block-attention:correct/dense_fp32:ranked nsa-attention:reference)
fi
"$PY" benchmarks/grade_profile.py "${targets[@]}" --out "$OUT/profile.json"
