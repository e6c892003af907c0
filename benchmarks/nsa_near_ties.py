"""How often NSA's top-n block choice is a near tie, and what scoring on k̃'s 16-bit hi part
alone would get wrong (issue 19: the "exact arithmetic only near ties" idea, measured before
anyone builds it).

Our forward scores the compressed keys k̃ as two fp16 parts (hi + lo,
``attention._split_fp16``), so that its top-n matches an fp32 reference on at least 99.95 % of
rows. Dropping the lo part would save about a third of the compressed branch's second pass,
but only pays if the rows whose choice it could change are few enough to re-score exactly
afterwards (under about 0.5 %). This script computes,
for random inputs of the paper configuration (as ``bench_nsa.py``), each row's block scores
twice: in fp64 from fp32 k̃ (the truth) and in fp32 from k̃'s hi part alone (``--hi``: fp16,
the kernel's part; bf16 the first measurement's), and prints

- the rows whose top-n (forced blocks aside) differs between the two: what hi-only would get
  wrong without a re-score;
- the largest score error of hi-only, relative to the row's n-th score (the bound a re-score
  test would use), and the share of rows whose gap between the n-th and (n+1)-th exact score is
  under 1, 2 and 4 times it: what a sound flag would send to the exact path.

``--lo`` adds a lo part back the way a kernel could compute it: ``fp16`` as the kernel does
today (hi + lo, two fp16 dots), ``fp8`` as a cheaper dot would (k̃'s lo part and q both
rounded to fp8 e4m3 under a power-of-two scale, the product accumulated in fp32): whether
an fp8 lo dot keeps the choice as exact as the fp16 one. ``--lse hi`` models the kernel's two
passes more closely: each head's softmax normaliser from the hi product alone (pass 1), the
probabilities' numerators from hi + lo (pass 2).

    .venv/bin/python benchmarks/nsa_near_ties.py --device cpu --seqs 2048 4096
    .venv/bin/python benchmarks/nsa_near_ties.py --device cpu --seqs 4096 --lo fp8
    .venv/bin/python benchmarks/nsa_near_ties.py --device cpu --seqs 16384 --lo fp8 --lse hi
    python benchmarks/nsa_near_ties.py --seqs 16384 65536          # on the GPU machine
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import commit, nsa_shape_args  # noqa: E402
from kernels.nsa.config import NSAConfig  # noqa: E402
from kernels.nsa.naive import _masked_softmax, block_scores, compress_mean  # noqa: E402

HI_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
LO_PARTS = ("none", "fp16", "fp8")
P_DTYPES = {"fp32": None, "fp16": torch.float16}


def round_fp8(x: torch.Tensor) -> torch.Tensor:
    """x rounded to fp8 e4m3 under a power-of-two scale that puts max |x| near the format's
    top (448), back in fp32: what an fp8 tensor-core operand would hold."""
    amax = float(x.abs().max())
    if amax == 0.0:
        return x.float()
    scale = 2.0 ** math.floor(math.log2(448.0 / amax))
    return (x.float() * scale).to(torch.float8_e4m3fn).float() / scale


def row_scores(
    q: torch.Tensor,
    kc: torch.Tensor,
    rows: torch.Tensor,
    cfg: NSAConfig,
    seq: int,
    dtype: torch.dtype,
    lo: tuple[torch.Tensor, torch.Tensor] | None = None,
    lse_hi: bool = False,
    p_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Block scores s [R, Hkv, Ts] of query rows ``rows`` (positions) as the naive reference
    makes them (forced blocks +inf, ineligible -inf), in ``dtype``; q [T, Hq, D] bf16, kc
    [Tc, Hkv, D] (fp32, or its hi part); ``lo``: (q as the lo dot reads it [T, Hq, D], k̃'s
    lo part [Tc, Hkv, D]), a second product added to the logits; ``lse_hi``: each head's
    softmax normaliser (the kernel's pass 1) from the hi product alone, its numerators (pass 2)
    from hi + lo."""
    hq, d = q.shape[1], q.shape[2]
    hkv, tc = kc.shape[1], kc.shape[0]
    scale = cfg.scale if cfg.scale is not None else d**-0.5

    def dot(qq: torch.Tensor, kk: torch.Tensor) -> torch.Tensor:  # [Hq, R, Tc]
        qr = qq[rows].to(dtype).permute(1, 0, 2)  # [Hq, R, D]
        return torch.bmm(qr, kk.to(dtype).repeat_interleave(hq // hkv, dim=1).permute(1, 2, 0))

    hi = dot(q, kc)
    logits = hi if lo is None else hi + dot(*lo)
    i = torch.arange(tc, device=q.device)
    visible = (i[None, :] * cfg.cmp_stride + cfg.cmp_block - 1) <= rows[:, None]  # [R, Tc]
    p, lse = _masked_softmax(scale * logits, visible)  # [Hq, R, Tc], [Hq, R]
    if lse_hi:  # p · exp(lse − lse_hi): the numerators kept, the normaliser pass 1's
        _, lse1 = _masked_softmax(scale * hi, visible)
        shift = torch.where(torch.isfinite(lse), lse - lse1, torch.zeros_like(lse))
        p = p * torch.exp(shift)[..., None]
    if p_dtype is not None:  # the probabilities as the P·ṽ product reads them
        p = p.to(p_dtype).to(p.dtype)
    return block_scores(p[None], seq, hkv, cfg, pos=rows)[0]  # [R, Hkv, Ts]


def measure(seq: int, args: argparse.Namespace, cfg: NSAConfig) -> dict[str, float]:
    dev = torch.device(args.device)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    q = torch.randn(seq, args.hq, args.dim, generator=gen).to(dev, torch.bfloat16)
    k = torch.randn(seq, args.hkv, args.dim, generator=gen).to(dev, torch.bfloat16)
    kc = compress_mean(k[None], cfg)[0]  # [Tc, Hkv, D] fp32
    kc_hi = kc.to(HI_DTYPES[args.hi]).float()
    lo: tuple[torch.Tensor, torch.Tensor] | None = None
    if args.lo == "fp16":  # the kernel's split: q exact in fp16, lo = k̃ - hi in fp16
        lo = (q, (kc - kc_hi).half().float())
    elif args.lo == "fp8":
        lo = (round_fp8(q), round_fp8(kc - kc_hi))
    n = cfg.sel_count
    decided = differ = 0
    near = {1: 0, 2: 0, 4: 0}
    worst = 0.0
    gaps: list[torch.Tensor] = []
    errs: list[torch.Tensor] = []
    # rows with more eligible blocks than slots: the only ones whose choice is a decision
    first = n * cfg.sel_block
    for start in range(first, seq, args.chunk):
        rows = torch.arange(start, min(seq, start + args.chunk), device=dev)
        exact = row_scores(q, kc, rows, cfg, seq, torch.float64)
        hi = row_scores(
            q, kc_hi, rows, cfg, seq, torch.float32, lo, args.lse == "hi", P_DTYPES[args.p]
        ).double()
        top_e = exact.topk(n, dim=-1)
        top_h = hi.topk(n, dim=-1).indices.sort(dim=-1).values
        differ += int((top_e.indices.sort(dim=-1).values != top_h).any(-1).sum())
        decided += exact.shape[0] * exact.shape[1]
        nth = top_e.values[..., -1]  # [R, Hkv] the n-th exact score (finite: a free slot)
        nxt = exact.masked_fill(exact >= nth[..., None], -math.inf).amax(-1)
        gap = (nth - nxt) / nth.abs()
        finite = torch.isfinite(exact)
        err = ((hi - exact).abs().masked_fill(~finite, 0.0).amax(-1)) / nth.abs()
        gaps.append(gap.flatten().cpu())
        errs.append(err.flatten().cpu())
        worst = max(worst, float(err.max()))
    gap_all, err_all = torch.cat(gaps), torch.cat(errs)
    for m in near:
        near[m] = int((gap_all < m * worst).sum())
    return {
        "seq": seq,
        "rows": decided,
        "differ": differ,
        "worst_err": worst,
        "p999_err": float(err_all.quantile(0.999)) if err_all.numel() < 2**24 else float("nan"),
        "gap_p01": float(gap_all.quantile(0.01)) if gap_all.numel() < 2**24 else float("nan"),
        **{f"near{m}": near[m] for m in near},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    nsa_shape_args(ap, [16384, 65536])
    ap.add_argument("--chunk", type=int, default=1024, help="query rows scored at once")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hi", choices=list(HI_DTYPES), default="fp16", help="k̃'s hi part")
    ap.add_argument("--lo", choices=LO_PARTS, default="none", help="k̃'s lo part, and its dot")
    ap.add_argument(
        "--lse",
        choices=["same", "hi"],
        default="same",
        help="hi: each head's softmax normaliser from the hi product alone (a pass 1 without "
        "the lo dot), the probabilities' numerators from hi + lo",
    )
    ap.add_argument(
        "--p",
        choices=list(P_DTYPES),
        default="fp32",
        help="fp16: the block scores summed from the probabilities rounded to fp16, as a "
        "tensor-core product P·Ω beside P·ṽ would read them",
    )
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: pass --device cpu (small --seqs)")
    cfg = NSAConfig()
    print(
        f"# nsa_near_ties.py, commit {commit()}, {args.device}, Hq {args.hq} / Hkv {args.hkv} / "
        f"D {args.dim}, paper config (n {cfg.sel_count}, l' {cfg.sel_block}), seed {args.seed}, "
        f"hi part {args.hi}, lo part {args.lo}, normaliser from {args.lse}, p in {args.p}"
    )
    print(
        "| T | rows x KV heads decided | top-n differs | worst score error "
        "(of the n-th score) | 99.9th pct | exact gap, 1st pct | gap < 1x / 2x / 4x worst |"
    )
    print("|---|---|---|---|---|---|---|")
    for seq in args.seqs:
        r = measure(seq, args, cfg)
        pct = [100.0 * r[f"near{m}"] / r["rows"] for m in (1, 2, 4)]
        print(
            f"| {seq} | {r['rows']} | {r['differ']} ({100.0 * r['differ'] / r['rows']:.3f} %) "
            f"| {r['worst_err']:.2e} | {r['p999_err']:.2e} | {r['gap_p01']:.2e} "
            f"| {pct[0]:.2f} / {pct[1]:.2f} / {pct[2]:.2f} % |"
        )


if __name__ == "__main__":
    main()
