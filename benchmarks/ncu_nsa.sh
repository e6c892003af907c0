#!/bin/bash
# Hardware counters of one NSA forward's kernels (issue 19), with Nsight Compute: where each
# branch kernel's time goes (tensor, MUFU and FMA pipes, stall reasons) rather than only how
# long it takes. One warm-up forward, then one profiled forward at T (default 65536), paper
# config, Hq 64 / Hkv 4 / D 128, bf16, each kernel of it replayed under `--set full`.
#   OUT=/tmp/ncu benchmarks/ncu_nsa.sh [T]
# Writes $OUT/nsa_fwd.ncu-rep, its details page (ncu_details.txt), the SASS-level source page
# of one kernel (ncu_source.csv and its summary ncu_source_summary.txt; SOURCE_KERNEL,
# default the compressed Gluon kernel) and a short per-kernel table of the pipe and stall
# metrics (ncu_summary.txt, printed). Needs ncu with hardware counters: the Firecracker
# machines have them, gVisor ones do not (the tool library's KINDS.md).
# `--clock-control none`: the clocks stay as the timed benchmarks see them.
set -uo pipefail
cd "$(dirname "$0")/.."
T=${1:-65536}
OUT=${OUT:-/tmp/kgrade-ncu}
PY=${PY:-python3}
mkdir -p "$OUT"
NCU=$(command -v ncu || find /opt/nvidia /usr/local/cuda* -name ncu -type f 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu_nsa: no ncu found" >&2; exit 2; }
export NSA_AUTOTUNE=0 PYTHONUNBUFFERED=1
"$NCU" --clock-control none --set full --profile-from-start off -f -o "$OUT/nsa_fwd" \
  "$PY" - "$T" <<'EOF' || exit 1
import sys

import torch

sys.path.insert(0, ".")
from benchmarks._common import nsa_inputs  # noqa: E402
from kernels.nsa import NSAConfig, nsa_attention  # noqa: E402

t = int(sys.argv[1])
q, k, v, gates = nsa_inputs(t, 64, 4, 128, "cuda")
with torch.no_grad():
    nsa_attention(q, k, v, gates, NSAConfig())  # compiles every kernel outside the profile
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    nsa_attention(q, k, v, gates, NSAConfig())
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
print(f"profiled one forward at T={t} on {torch.cuda.get_device_name()}")
EOF
"$NCU" -i "$OUT/nsa_fwd.ncu-rep" --page details >"$OUT/ncu_details.txt"
"$NCU" -i "$OUT/nsa_fwd.ncu-rep" --page raw --csv >"$OUT/ncu_raw.csv"
# Per-instruction samples (stall reasons by SASS line) of one kernel, to place its stalls:
# run 91 found the compressed kernel's largest stall at CTA barriers but not which barrier.
SOURCE_KERNEL=${SOURCE_KERNEL:-nsa_compressed_gluon_fwd_kernel}
# Run 92 read it: the barrier stalls were idle padding warps, see ncu_summary.py --source.
if "$NCU" -i "$OUT/nsa_fwd.ncu-rep" --page source --print-source sass --csv \
  --kernel-name "$SOURCE_KERNEL" >"$OUT/ncu_source.csv"; then
  "$PY" benchmarks/ncu_summary.py --source "$OUT/ncu_source.csv" --top 12 |
    tee "$OUT/ncu_source_summary.txt"
else
  echo "ncu_nsa: no source page for $SOURCE_KERNEL (this ncu may lack --page source)" >&2
fi
"$PY" benchmarks/ncu_summary.py "$OUT/ncu_raw.csv" | tee "$OUT/ncu_summary.txt"
