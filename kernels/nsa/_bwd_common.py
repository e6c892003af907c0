"""Pieces shared by the NSA backward kernels (window, selection, compressed).

Every backward kernel reads the same per-row quantities of its branch X (channel CH of the
gates and of D): the forward's lse_X, the gate g_X and D_X = rowsum(dout · o_X). With
dO_X = g_X · dout, FlashAttention-2's backward reads, per visible (row, key) pair,

    p  = exp(scale·q·k − lse_X)
    dv += g_X·p · dout            (= p · dO_X)
    ds = g_X·p · (dout·v − D_X)   (= p · (dO_X·v − rowsum(dO_X·o_X)))
    dq += scale · ds · k,  dk += scale · ds · q

so the gate multiplies p (a value in [0, 1], in registers) rather than dout, and the kernels
read the raw upstream gradient: scaling dout by g first and rounding it to 16 bits would
lose precision for free, and three scaled copies of dout would cost memory traffic.

Kernels address every [B, T, H, ·] tensor as contiguous (the autograd wrapper makes them so):
row (b, t, h) is ``(b·T + t)·H + h``, computed in int64 so B·T·H·D may exceed 2^31.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.nsa._triton_common import interpreting

LOG2E = 1.4426950408889634


@triton.jit
def row_stats(LSE, DD, GATES, ridx, ok, CH: tl.constexpr):
    """(lse in base 2, gate, D) of rows ``ridx`` for branch channel CH; 0 where not ok.

    LSE [B, T, Hq] fp32, DD [B, T, Hq, 3] fp32, GATES [B, T, Hq, 3] any float dtype, all
    contiguous. A row whose lse is −inf (nothing visible) gets lse 0: its p is masked to 0
    by the caller's visibility test anyway, and 0 keeps exp2 away from inf − inf.
    """
    lse = tl.load(LSE + ridx, mask=ok, other=0.0)
    lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
    gate = tl.load(GATES + ridx * 3 + CH, mask=ok, other=0.0).to(tl.float32)
    dd = tl.load(DD + ridx * 3 + CH, mask=ok, other=0.0)
    return lse2, gate, dd


@triton.jit
def load_rows(
    Q,
    DO,
    ridx,
    ok,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    """q [M, BLOCK_DK] and dout [M, BLOCK_DV] of rows ``ridx`` (0 where not ok, and past the
    head dims), converted to fp32 when the dots are exact (DOT_F32)."""
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(
        Q + ridx[:, None] * DK + offs_dk[None, :],
        mask=ok[:, None] & (offs_dk[None, :] < DK),
        other=0.0,
    )
    do = tl.load(
        DO + ridx[:, None] * DV + offs_dv[None, :],
        mask=ok[:, None] & (offs_dv[None, :] < DV),
        other=0.0,
    )
    if DOT_F32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    return q, do


@triton.jit
def nsa_bwd_preprocess_kernel(
    DO,  # [R, Dv] upstream gradient (q's dtype), R = B·T·Hq rows
    OC,  # [R, Dv] o_cmp (fp32, or fp16: attention.branch_dtype)
    OS,  # [R, Dv] o_slc
    OW,  # [R, Dv] o_win
    DD,  # [R, 3] fp32 out: D_j = rowsum(dout · o_j), which is also dL/dgate_j
    R,
    DV: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_DV)
    ok = r < R
    m = ok[:, None] & (d[None, :] < DV)
    off = r[:, None] * DV + d[None, :]
    do = tl.load(DO + off, mask=m, other=0.0).to(tl.float32)
    oc = tl.load(OC + off, mask=m, other=0.0).to(tl.float32)
    tl.store(DD + r * 3, tl.sum(do * oc, 1), mask=ok)
    os_ = tl.load(OS + off, mask=m, other=0.0).to(tl.float32)
    tl.store(DD + r * 3 + 1, tl.sum(do * os_, 1), mask=ok)
    ow = tl.load(OW + off, mask=m, other=0.0).to(tl.float32)
    tl.store(DD + r * 3 + 2, tl.sum(do * ow, 1), mask=ok)


def bwd_preprocess(
    dout: torch.Tensor,
    o_cmp: torch.Tensor,
    o_slc: torch.Tensor,
    o_win: torch.Tensor,
    alloc: object = torch.empty,
) -> torch.Tensor:
    """D [B, T, Hq, 3] fp32 with D[..., j] = Σ_Dv dout · o_j (all inputs contiguous).

    One pass over dout serves the three branches: D_j is both the gate gradient dL/dg_j and,
    times g_j, the FlashAttention-2 delta rowsum(dO_j · o_j) of branch j.
    """
    b, t, hq, dv = dout.shape
    dd = alloc((b, t, hq, 3), dtype=torch.float32, device=dout.device)  # type: ignore[operator]
    rows = b * t * hq
    block_dv = triton.next_power_of_2(max(dv, 1))
    block_r = max(1, min(64, 8192 // block_dv))
    if interpreting():
        block_r = max(block_r, 32)  # fewer (slow) interpreted programs
    nsa_bwd_preprocess_kernel[(triton.cdiv(rows, block_r),)](
        dout, o_cmp, o_slc, o_win, dd, rows, DV=dv, BLOCK_R=block_r, BLOCK_DV=block_dv
    )
    return dd
