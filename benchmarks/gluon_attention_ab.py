"""Block attention forward: the Gluon kernel (kernels/attention/gluon_fwd.py) beside our Triton
kernel and cuDNN, in one process on the same inputs. Prints a table last.

    python benchmarks/gluon_attention_ab.py [--rounds 3]

Each round times every kernel once per shape (triton.testing.do_bench medians), starting one
kernel later each round, so slow drift of the machine's clock and order effects fall on all of
them alike; the table gives the median over rounds and
each kernel's ratio to cuDNN (cuDNN's time over ours; 1.0 = as fast).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

from benchmarks._common import commit  # noqa: E402
from benchmarks.bench_attention import flops, sdpa  # noqa: E402
from kernels.attention.block_attention import block_attention_triton  # noqa: E402
from kernels.attention.gluon_fwd import block_attention_gluon  # noqa: E402

SHAPES = [  # (B, S, H, D, causal)
    (2, 8192, 16, 128, False),
    (2, 8192, 16, 128, True),
    (1, 16384, 16, 128, False),
    (1, 16384, 16, 128, True),
    (2, 8192, 16, 64, False),
    (2, 8192, 16, 64, True),
]
GLUON = [(128, 2), (128, 3), (64, 2)]  # (block_n, stages) pinned, beside the timed pick


def candidates(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> dict:
    """Name -> zero-argument call of every kernel timed on one input."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, S, D] views
    scale = q.shape[-1] ** -0.5
    fns = {
        "cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION, qt, kt, vt, causal),
        "triton (ptr)": lambda: block_attention_triton(
            q, k, v, causal=causal, scale=scale, use_tma=False
        ),
        "triton (tma)": lambda: block_attention_triton(
            q, k, v, causal=causal, scale=scale, use_tma=True
        ),
    }
    fns["gluon (timed pick)"] = lambda: block_attention_gluon(q, k, v, causal=causal)
    for bn, st in GLUON:
        fns[f"gluon n{bn} s{st}"] = lambda bn=bn, st=st: block_attention_gluon(
            q, k, v, causal=causal, block_n=bn, stages=st
        )
    return fns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"commit {commit()}  torch {torch.__version__}  triton {triton.__version__}", flush=True)
    times: dict[tuple, dict[str, list[float]]] = {}
    for rnd in range(args.rounds):
        for shape in SHAPES:
            b, s, h, d, causal = shape
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (
                torch.randn(b, s, h, d, device="cuda", generator=gen, dtype=torch.bfloat16)
                for _ in range(3)
            )
            fns = candidates(q, k, v, causal)
            if shape not in times:  # the first round also checks every output against ours
                ref = fns["triton (ptr)"]()[0].float()
                for name in (n for n in fns if n.startswith("gluon")):
                    out = fns[name]()[0].float()
                    err = ((out - ref).norm() / ref.norm()).item()
                    print(f"{shape} {name}: rel diff to triton {err:.2e}", flush=True)
            row = times.setdefault(shape, {})
            # Each round starts one kernel later: a kernel timed right after a hot one ran
            # slower in run 78, and the rotation spreads that over every kernel.
            names = list(fns)
            for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                ms = triton.testing.do_bench(fns[name], warmup=25, rep=100, return_mode="median")
                row.setdefault(name, []).append(ms)
    print("\n| shape | kernel | ms | TFLOP/s | of cuDNN |\n|---|---|---|---|---|")
    for shape, row in times.items():
        b, s, h, d, causal = shape
        fl = flops(b, h, s, s, d, causal)
        ref = statistics.median(row["cudnn"])
        label = f"B{b} S{s} D{d} {'causal' if causal else 'full'}"
        for name, ms_list in row.items():
            ms = statistics.median(ms_list)
            print(f"| {label} | {name} | {ms:.3f} | {fl / ms / 1e9:.0f} | {ref / ms:.3f} |")


if __name__ == "__main__":
    main()
