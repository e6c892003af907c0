"""Top-n block selection from the compressed branch's banded block scores (Triton).

The compressed kernel writes, per (position, KV head), the ω-weighted scores of its own
selection block (SA) and the spill into the next one (SB); this kernel adds them (SB shifted
by one block while loading), forces the initial and local blocks, masks the blocks not yet
complete at the position, and picks the n best: the forced ones directly, the rest in rounds
of (max, smallest index attaining it), so ties go to the smaller block index exactly. The
picks are sorted in registers and written ascending, −1 padded.

A position p can choose only blocks j ≤ p // l′, so rows may be launched in bands of
positions, each as wide as its last row needs (16, 32, …, the full power of two ≥ Ts; a band
ends where the next width starts): at 64k, paper config, the average row is then 683 blocks
wide instead of 1024, and a band's narrower rows go more to a program. The picks are the same
either way (tested). On the H200 the banded launch took 0.83 of the unbanded one's time at
64k and 0.72 at 16k (run 37), so it is the default (``BANDED``).

``PACKED`` folds each round's two reductions into one: a block's score, made an
order-preserving int32, goes into the high half of an int64 key and ``BLOCK_TS − j`` into the
low half, so the largest key is the largest score at its smallest index, and its low half
names the pick. ``CHUNK`` first picks the rows' best chunks of a few blocks by their maxima,
then runs the rounds over those chunks' blocks alone: a chunk that holds a pick has its best
block among the picks, so the picks are the same. The picks are identical in every form
(tested); the forms (``TOPN_FORMS``; nsa_attention's variant "topn", ``KGRADE_NSA_TOPN``)
differ in these two choices and in the scores a program holds.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.nsa._triton_common import interpreting, pow2
from kernels.nsa.config import NSAConfig

#: Launch the rows in bands of their own width (``_bands``) unless a caller says otherwise
#: (``bench_nsa.py --variants`` times both and checks their picks equal).
BANDED = True


class TopnForm(NamedTuple):
    """How the kernel picks: ``packed`` (PACKED) int64 keys; ``tile`` scores a program holds;
    ``chunk`` > 0 (CHUNK, float rounds only): first the rounds' worth of chunks of ``chunk``
    blocks with the best maxima, then the rounds over those chunks' blocks alone, in bands at
    least 8 times that many blocks wide (narrower ones pick as ``chunk`` = 0 does)."""

    packed: bool
    tile: int
    chunk: int = 0


#: The kernel's forms; nsa_attention takes the one its variant "topn" names
#: (``KGRADE_NSA_TOPN=<name>``). chunk4k is the default: float4k with chunks of 4 blocks (at
#: the paper's n, 13 rounds over the 128 or 256 chunk maxima, then over 64 blocks, instead of
#: over 512 or 1024 in the 64k forward's widest bands). Alone at 64k it took 1.16 ms against
#: float4k's 1.47, float8k's 1.52, float16k's 1.76 and the packed forms' 2.11-2.16, picks equal
#: to float16k's in every form (run 103, 2026-12-06, one H100, paper config; at 16k 0.15 ms,
#: as float4k). Chunks of 16 need a 3-D tile that took 255 registers and spilled (Triton 3.6,
#: sm_90). float4k was the default from run 86 to run 103.
TOPN_FORMS: dict[str, TopnForm] = {
    "float16k": TopnForm(False, 16384),
    "float8k": TopnForm(False, 8192),
    "float4k": TopnForm(False, 4096),
    "packed8k": TopnForm(True, 8192),
    "packed4k": TopnForm(True, 4096),
    "chunk4k": TopnForm(False, 4096, 4),
}
DEFAULT_TOPN_FORM = "chunk4k"


@triton.jit
def _scores_at(SA, SB, base, jj, ok, imax, cur, TS, RATIO: tl.constexpr, N_INIT: tl.constexpr,
               N_LOCAL: tl.constexpr):  # fmt: skip
    """Scores of blocks jj ([BLOCK_R, W] or [1, W]) where ok: SA plus SB shifted by one block,
    the halves of compressed blocks past imax (the last one visible to the row; they may be
    unwritten) read as 0; and whether each is a candidate for the rounds (eligible at cur,
    the row's own block, and not forced; ok not applied)."""
    sa = ok & (jj * RATIO <= imax[:, None]) & (jj < TS)
    sb = ok & (jj >= 1) & ((jj - 1) * RATIO <= imax[:, None])
    sb = sb & (jj < TS)
    s = tl.load(SA + base + jj, mask=sa, other=0.0)
    s += tl.load(SB + base + jj - 1, mask=sb, other=0.0)
    eligible = jj <= cur[:, None]
    forced = eligible & ((jj < N_INIT) | (jj > cur[:, None] - N_LOCAL))
    return s, eligible & ~forced


@triton.jit
def _float_rounds(s, jj, picks, kk, N_FORCED: tl.constexpr, N_SEL: tl.constexpr,
                  BIG: tl.constexpr, PAST: tl.constexpr):  # fmt: skip
    """Slots N_FORCED..N_SEL of picks from scores s [BLOCK_R, W] (−inf: not a candidate) of
    blocks jj (broadcast to s), each round the max at its smallest block index; PAST is above
    every block index (no pick is PAST: a row with no candidate left gets BIG)."""
    for k in range(N_FORCED, N_SEL):
        best = tl.max(s, axis=1)  # [BLOCK_R]
        # smallest index attaining the max: ties go to the smaller block index
        pick = tl.min(tl.where(s == best[:, None], jj, PAST), axis=1)
        got = tl.where(best > float("-inf"), pick, BIG)
        picks = tl.where(kk[None, :] == k, got[:, None], picks)
        s = tl.where(jj == pick[:, None], float("-inf"), s)
    return picks


@triton.jit
def nsa_topn_kernel(
    SA,  # [B, Hkv, T, Ts] fp32
    SB,  # [B, Hkv, T, Ts] fp32
    IDX,  # [B, T, Hkv, n] int32: ascending, −1 padded at the end
    ss_b,
    ss_h,
    ss_t,
    si_b,
    si_t,
    si_h,
    T0,  # the band's first position
    T_HI,  # one past its last (≤ T)
    TS,
    HKV: tl.constexpr,
    L_CMP: tl.constexpr,
    D_STRIDE: tl.constexpr,
    RATIO: tl.constexpr,
    L_SEL: tl.constexpr,
    N_SEL: tl.constexpr,
    N_INIT: tl.constexpr,
    N_LOCAL: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_TS: tl.constexpr,
    N_PAD: tl.constexpr,  # pow2 ≥ n
    PACKED: tl.constexpr,  # one int64 (score, index) reduction a round instead of two
    CHUNK: tl.constexpr,  # > 0: the rounds over the best chunks' blocks only (TopnForm)
):
    pid_r = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = pid_bg // HKV
    g = pid_bg % HKV
    t = T0 + pid_r * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    j = tl.arange(0, BLOCK_TS)  # [BLOCK_TS]
    # Last compressed block visible to t; groups beyond it contribute exactly 0 (and may be
    # unwritten by the compressed kernel), so they are masked rather than loaded (_scores_at).
    num = t + 1 - L_CMP
    imax = tl.where(num >= 0, num // D_STRIDE, -1)
    row_ok = t < T_HI
    base = b * ss_b + g * ss_h + t[:, None] * ss_t
    cur = t // L_SEL
    s, cand = _scores_at(SA, SB, base, j[None, :], row_ok[:, None], imax, cur,
                         TS, RATIO, N_INIT, N_LOCAL)  # fmt: skip
    out = IDX + b * si_b + t * si_t + g * si_h
    # The n picks kept in registers ([BLOCK_R, N_PAD], unused slots BIG) and sorted there, so
    # rows are written ascending with −1 last and no sort runs on the host.
    BIG: tl.constexpr = 2147483647
    kk = tl.arange(0, N_PAD)
    picks = tl.full([BLOCK_R, N_PAD], BIG, tl.int32)
    # The forced blocks go straight into the first slots instead of costing a round of
    # (max, argmin) each: init block i where i ≤ cur, local block cur − i where it is neither
    # negative nor an init block. A row with fewer than N_INIT + N_LOCAL distinct forced
    # blocks (cur < N_INIT + N_LOCAL) has no other eligible block, so N_SEL − N_INIT −
    # N_LOCAL rounds over the rest always suffice and pick what rounds over all of them did.
    N_FORCED: tl.constexpr = N_INIT + N_LOCAL
    tl.static_assert(N_FORCED <= N_SEL)  # NSAConfig checks it: forced blocks count towards n
    for i in tl.static_range(N_INIT):
        picks = tl.where(kk[None, :] == i, tl.where(cur >= i, i, BIG)[:, None], picks)
    for i in tl.static_range(N_LOCAL):
        jl = cur - i
        jl = tl.where((jl >= N_INIT) & (jl >= 0), jl, BIG)
        picks = tl.where(kk[None, :] == N_INIT + i, jl[:, None], picks)
    if PACKED:
        # fp32 bits → int32 in the same order (negative floats: magnitude bits flipped); −0
        # made +0 first, as tl.max treats them equal. Low half BLOCK_TS − j ∈ [1, BLOCK_TS]:
        # equal scores → the smaller j has the larger key. NONE is below every real key.
        NONE: tl.constexpr = -9223372036854775808
        bits = tl.where(s == 0.0, 0.0, s).to(tl.int32, bitcast=True)
        mono = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
        key = (mono.to(tl.int64) << 32) | (BLOCK_TS - j[None, :]).to(tl.int64)
        key = tl.where(cand, key, NONE)
        for k in range(N_FORCED, N_SEL):
            best = tl.max(key, axis=1)  # [BLOCK_R]: the best score at its smallest index
            pick = BLOCK_TS - (best & 0xFFFFFFFF).to(tl.int32)
            got = tl.where(best > NONE, pick, BIG)
            picks = tl.where(kk[None, :] == k, got[:, None], picks)
            key = tl.where(key == best[:, None], NONE, key)  # keys are unique in a row
    elif CHUNK > 0:
        # The picks (the n − forced largest under (score desc, index asc), a prefix of that
        # order) lie in the n − forced chunks whose best blocks come first in it: a chunk
        # holding a pick has its best block among the picks too, and chunks are contiguous,
        # so (chunk max desc, chunk index asc) orders them as their best blocks. Rounds over
        # the chunk maxima choose them; the rounds proper then run over their N_PAD · CHUNK
        # blocks, reloaded (this program just read them: L1/L2) instead of over BLOCK_TS.
        NCH: tl.constexpr = BLOCK_TS // CHUNK
        W: tl.constexpr = N_PAD * CHUNK
        s = tl.where(cand, s, float("-inf"))
        cmax = tl.max(tl.reshape(s, [BLOCK_R, NCH, CHUNK]), axis=2)  # [BLOCK_R, NCH]
        c = tl.arange(0, NCH)
        u = tl.arange(0, W)
        jj = tl.zeros([BLOCK_R, W], tl.int32) - 1  # candidate slots' blocks, −1: none
        for k in range(0, N_SEL - N_FORCED):
            best = tl.max(cmax, axis=1)
            pc = tl.min(tl.where(cmax == best[:, None], c[None, :], NCH), axis=1)
            here = ((u // CHUNK)[None, :] == k) & (best > float("-inf"))[:, None]
            jj = tl.where(here, (pc * CHUNK)[:, None] + (u % CHUNK)[None, :], jj)
            cmax = tl.where(c[None, :] == pc[:, None], float("-inf"), cmax)
        ok = row_ok[:, None] & (jj >= 0)
        sc, cand_c = _scores_at(SA, SB, base, jj, ok, imax, cur, TS, RATIO, N_INIT, N_LOCAL)
        sc = tl.where(ok & cand_c, sc, float("-inf"))
        picks = _float_rounds(sc, jj, picks, kk, N_FORCED, N_SEL, BIG, BLOCK_TS)
    else:
        s = tl.where(cand, s, float("-inf"))
        picks = _float_rounds(s, j[None, :], picks, kk, N_FORCED, N_SEL, BIG, BLOCK_TS)
    picks = tl.sort(picks, dim=1)
    picks = tl.where(picks == BIG, -1, picks)
    tl.store(out[:, None] + kk[None, :], picks, mask=row_ok[:, None] & (kk[None, :] < N_SEL))


def topn_triton(
    sa: torch.Tensor,
    sb: torch.Tensor,
    t: int,
    hkv: int,
    cfg: NSAConfig,
    alloc: object = torch.empty,
    banded: bool | None = None,
    form: str | None = None,
) -> torch.Tensor:
    """Top-n from the banded score halves → [B, T, Hkv, n] int32 ascending, −1 padded
    (written in that order by the kernel: no sort on the host). banded: launch the rows in
    bands of their width (None: ``BANDED``); form: one of ``TOPN_FORMS`` (None:
    ``DEFAULT_TOPN_FORM``)."""
    form = form or DEFAULT_TOPN_FORM
    if form not in TOPN_FORMS:
        raise ValueError(f"top-n form {form!r}: use one of {', '.join(TOPN_FORMS)}")
    b, ts = sa.shape[0], sa.shape[3]
    n = cfg.sel_count
    picks = alloc((b, t, hkv, n), dtype=torch.int32, device=sa.device)  # type: ignore[operator]
    use_bands = BANDED if banded is None else banded
    bands = _bands(t, ts, cfg.sel_block) if use_bands else [(0, t, pow2(ts, 16))]
    # A program's tile (sm_90: 16k int64 keys spill 700-12,000 bytes under Triton 3.6 and
    # 3.9, 8k none; 16k fp32 scores 724 bytes at width 256 under 3.6, 8k none), ≥ 1 row.
    use_packed, tile, chunk = TOPN_FORMS[form]
    for t0, t_hi, width in bands:
        block_r = max(1, min(64, tile // width))
        if interpreting():
            block_r = max(block_r, 16)
        nsa_topn_kernel[(triton.cdiv(t_hi - t0, block_r), b * hkv)](
            sa,
            sb,
            picks,
            sa.stride(0),
            sa.stride(1),
            sa.stride(2),
            picks.stride(0),
            picks.stride(1),
            picks.stride(2),
            t0,
            t_hi,
            ts,
            HKV=hkv,
            L_CMP=cfg.cmp_block,
            D_STRIDE=cfg.cmp_stride,
            RATIO=cfg.sel_block // cfg.cmp_stride,
            L_SEL=cfg.sel_block,
            N_SEL=n,
            N_INIT=cfg.sel_init,
            N_LOCAL=cfg.sel_local,
            BLOCK_R=block_r,
            BLOCK_TS=width,
            N_PAD=pow2(n, 1),
            PACKED=use_packed,
            # chunks only where the candidates are at most an eighth of the band: 80 and 128
            # registers at widths 1024 and 512 (chunks of 4, n 16), 255 at 256
            CHUNK=chunk if chunk and width >= 8 * pow2(n, 1) * chunk else 0,
            num_warps=4 if width <= 1024 else 8,
        )
    return picks


def _bands(t: int, ts: int, sel_block: int) -> list[tuple[int, int, int]]:
    """(first position, one past the last, blocks loaded per row) of each launch: positions
    whose eligible blocks j ≤ p // l′ fit in width w, from w = 16 up to pow2(Ts)."""
    full = pow2(ts, 16)
    bands = []
    lo, width = 0, 16
    while lo < t:
        hi = t if width >= full else min(t, width * sel_block)  # p // l′ < width
        if hi > lo:
            bands.append((lo, hi, width))
        lo, width = hi, width * 2
    return bands


__all__ = ["DEFAULT_TOPN_FORM", "TOPN_FORMS", "TopnForm", "nsa_topn_kernel", "topn_triton"]
