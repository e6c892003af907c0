"""What would the selection branch save if it gathered no forced blocks? (issue 19, a probe)

The selection kernel (v2) gathers each (position, KV head)'s n selected K/V blocks from L2,
and is bound by that (runs 91-92: 88-90 % of L2 bandwidth). Of the n = 16 blocks, 3 are
forced: block 0 and the two local blocks (the position's own and the one before). Those are
the same for every position of a 64-position block, so another kernel could attend to them
densely, with the tile's key loads shared by all its positions, as the window kernel does
(the local blocks lie inside the 512-key window), and hand the selection kernel a partial
softmax to merge. Before anyone builds that, this script measures the gain it is bounded by:
the default selection kernel on the default top-n's blocks (all n), on the picked blocks only
(forced ones removed, n − 3 slots: a kernel that skips them) and on the forced blocks only,
gathered per position as today. Round-robin, one call of each mode per round; the ratios are
paired medians against the full call.

    python benchmarks/nsa_forced_probe.py                    # 16k and 64k, paper config
    python benchmarks/nsa_forced_probe.py --seqs 65536 --rounds 20
"""

from __future__ import annotations

import dataclasses
import os
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


def split_forced(idx: torch.Tensor, cfg: NSAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """idx [B, T, Hkv, n] (ascending, −1 padded) → (the picked blocks [.., n − f], the forced
    ones [.., f]), each ascending and −1 padded, f = sel_init + sel_local: the forced blocks
    are j < sel_init and j > t // l′ − sel_local, as the top-n kernel forces them."""
    t = idx.shape[1]
    cur = (torch.arange(t, device=idx.device) // cfg.sel_block).view(1, t, 1, 1)
    valid = idx >= 0
    forced = valid & ((idx < cfg.sel_init) | (idx > cur - cfg.sel_local))
    big = torch.iinfo(torch.int32).max
    f = cfg.sel_init + cfg.sel_local

    def compact(keep: torch.Tensor, width: int) -> torch.Tensor:
        x = torch.where(keep, idx, big).sort(dim=-1).values[..., :width]
        return torch.where(x == big, -1, x).to(torch.int32).contiguous()

    return compact(valid & ~forced, idx.shape[-1] - f), compact(forced, f)


def main() -> None:
    args = round_robin_args(__doc__, [16384, 65536])
    cfg = NSAConfig()
    names = {b: variant(b) for b in ("compressed", "selection", "topn")}
    print(
        f"# nsa_forced_probe.py, commit {commit()}, {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}, Hq {args.hq} / Hkv {args.hkv}, D {args.dim}, bf16, "
        f"paper config, {args.rounds} rounds, variants {names}"
    )
    print("| T | selection over | blocks a row, mean | ms, median (p10-p90) | of all n, paired |")
    print("|---|---|---|---|---|")
    for t in args.seqs:
        one(t, args.hq, args.hkv, args.dim, args.rounds, cfg)
        torch.cuda.empty_cache()


def one(t: int, hq: int, hkv: int, dim: int, rounds: int, cfg: NSAConfig) -> None:
    """The table's rows at length t (a function: its tensors are freed on return)."""
    q, k, v, _gates = nsa_inputs(t, hq, hkv, dim, "cuda")
    scale = dim**-0.5
    kc_hi, kc_lo, vc, o_dtype = stored_compressed(k, v, cfg)
    _, _, idx = COMPRESSED_IMPLS[variant("compressed")](
        q, kc_hi, vc, cfg, scale, True, kc_lo=kc_lo, out_dtype=o_dtype, topn_form=variant("topn")
    )
    assert idx is not None
    del kc_hi, kc_lo, vc
    picked, forced = split_forced(idx, cfg)
    # the count check: every valid block of a row is in exactly one of the two
    assert torch.equal((idx >= 0).sum(-1), (picked >= 0).sum(-1) + (forced >= 0).sum(-1))
    slc_fn = SELECTION_IMPLS[variant("selection")]
    lists = {"all n (today)": (idx, cfg)}
    lists["picked only (n - forced)"] = (
        picked,
        dataclasses.replace(cfg, sel_count=picked.shape[-1]),
    )
    lists["forced only"] = (forced, dataclasses.replace(cfg, sel_count=forced.shape[-1]))
    modes: dict[str, Callable[[], object]] = {
        name: (lambda ix=ix, c=c: slc_fn(q, k, v, ix, c, scale, torch.empty, o_dtype))
        for name, (ix, c) in lists.items()
    }
    for fn in modes.values():  # compiles once per slot count
        fn()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {m: [] for m in modes}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(rounds):
        for name, fn in modes.items():
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            times[name].append(e0.elapsed_time(e1))
    base = times["all n (today)"]
    for name, (ix, _c) in lists.items():
        mean_blocks = float((ix >= 0).sum(-1).float().mean())
        print(
            f"| {t} | {name} | {mean_blocks:.2f} | {spread(times[name])} "
            f"| {paired_median(times[name], base):.4f} |"
        )


if __name__ == "__main__":
    main()
