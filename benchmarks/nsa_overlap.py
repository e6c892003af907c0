"""Can the NSA forward's compressed and selection branches share the GPU? (issue 19, a probe)

The compressed branch is tensor-core bound (≈ 540 fp16-equivalent TFLOP/s at 64k) and the
selection branch is bound by its K/V gathers from L2 (≈ 6 TB/s, ≈ 100 TFLOP/s), so running
them at the same time could hide much of one under the other. The forward cannot overlap them
as it stands (the selection needs the compressed branch's top-n), but a pipeline over chunks
of positions could: selection of chunk c beside the compressed branch of chunk c + 1. Before
building that, this script asks whether the GPU runs the two kernels side by side at all: it
times the default kernels of both branches on identical inputs (the selection on the top-n
computed once beforehand), alone, one after the other on one stream, and launched together on
two streams with each priority order. Round-robin, one call of each mode per round, so clock
drift hits all alike; the outputs of the concurrent runs are checked equal to the serial ones.

    python benchmarks/nsa_overlap.py                      # 16k and 64k, paper config
    python benchmarks/nsa_overlap.py --seqs 65536 --rounds 20

``of serial`` below 1 in the table is overlap won; ≈ 1 means the second kernel waited for the
first one's grid to drain (the block scheduler fills the SMs in launch order).
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

os.environ.setdefault("NSA_AUTOTUNE", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (  # noqa: E402
    commit,
    nsa_inputs,
    paired_median,
    round_robin_args,
    spread,
    stored_compressed,
)
from kernels.nsa import NSAConfig  # noqa: E402
from kernels.nsa.attention import (  # noqa: E402
    COMPRESSED_IMPLS,
    SELECTION_IMPLS,
    variant,
)

Outs = tuple[torch.Tensor, ...]


def main() -> None:
    args = round_robin_args(__doc__, [16384, 65536])
    cfg = NSAConfig()
    names = {b: variant(b) for b in ("compressed", "selection", "topn")}
    print(
        f"# nsa_overlap.py, commit {commit()}, {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}, Hq {args.hq} / Hkv {args.hkv}, D {args.dim}, bf16, "
        f"paper config, {args.rounds} rounds, variants {names}"
    )
    print("| T | mode | ms, median (p10-p90) | of serial, paired |")
    print("|---|---|---|---|")
    for t in args.seqs:
        one(t, args.hq, args.hkv, args.dim, args.rounds, cfg)
        torch.cuda.empty_cache()


def one(t: int, hq: int, hkv: int, dim: int, rounds: int, cfg: NSAConfig) -> None:
    """The table's rows at length t (a function: its tensors are freed on return)."""
    q, k, v, _gates = nsa_inputs(t, hq, hkv, dim, "cuda")
    scale = dim**-0.5
    kc_hi, kc_lo, vc, o_dtype = stored_compressed(k, v, cfg)
    cmp_fn = COMPRESSED_IMPLS[variant("compressed")]
    slc_fn = SELECTION_IMPLS[variant("selection")]
    form = variant("topn")

    def cmp() -> Outs:
        o, lse, idx = cmp_fn(
            q, kc_hi, vc, cfg, scale, True, kc_lo=kc_lo, out_dtype=o_dtype, topn_form=form
        )
        assert idx is not None
        return o, lse, idx

    idx = cmp()[2]

    def slc() -> Outs:
        return slc_fn(q, k, v, idx, cfg, scale, torch.empty, o_dtype)

    lo, hi = 0, -1  # stream priorities: the default, and a higher one (lower is higher)
    side = {p: (torch.cuda.Stream(priority=p), torch.cuda.Stream(priority=p)) for p in (lo, hi)}

    def together(cmp_priority: int, slc_priority: int) -> Callable[[], Outs]:
        a, b = side[cmp_priority][0], side[slc_priority][1]

        def run() -> Outs:
            main_stream = torch.cuda.current_stream()
            a.wait_stream(main_stream)
            b.wait_stream(main_stream)
            with torch.cuda.stream(a):
                c = cmp()
            with torch.cuda.stream(b):
                s = slc()
            main_stream.wait_stream(a)
            main_stream.wait_stream(b)
            for outs, stream in ((c, a), (s, b)):  # memory not reused before the streams end
                for x in outs:
                    x.record_stream(stream)
            return (*c, *s)

        return run

    modes: dict[str, Callable[[], Outs]] = {
        "serial (cmp then slc, one stream)": lambda: (*cmp(), *slc()),
        "cmp alone": cmp,
        "slc alone": slc,
        "two streams, equal priority": together(lo, lo),
        "two streams, slc high priority": together(lo, hi),
        "two streams, cmp high priority": together(hi, lo),
    }
    serial = "serial (cmp then slc, one stream)"
    ref = modes[serial]()
    for name, fn in modes.items():  # warm-up (compiles once) and the check
        out = fn()
        torch.cuda.synchronize()
        if name.startswith("two streams"):
            same = all(torch.equal(x, y) for x, y in zip(out, ref, strict=True))
            assert same, f"{name}: outputs differ from the serial run's"
    del ref

    times: dict[str, list[float]] = {m: [] for m in modes}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(rounds):
        for name, fn in modes.items():
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            times[name].append(e0.elapsed_time(e1))

    for name in modes:
        paired = paired_median(times[name], times[serial])
        print(f"| {t} | {name} | {spread(times[name])} | {paired:.4f} |")
    alone = statistics.median(times["cmp alone"]) + statistics.median(times["slc alone"])
    best = min(statistics.median(times[m]) for m in modes if m.startswith("two streams"))
    print(f"# T {t}: cmp alone + slc alone {alone:.2f} ms; best two-stream run {best:.2f} ms")


if __name__ == "__main__":
    main()
