"""The gated combine out = g_cmp·o_cmp + g_slc·o_slc + g_win·o_win as a kernel of its own.

The window kernel usually combines in its epilogue (``window.py``, COMBINE): it runs last and
reads the other two branches' outputs. When the window branch runs on a side stream beside
the others (``attention.WINDOW_SIDE``), no branch kernel is sure to see the other two
outputs, so this kernel does it once both streams are done: a pass over rows of
[B·T·Hq, Dv], the gates read through their own strides.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.nsa._triton_common import pow2

_BLOCK_R = 32  # rows a program: [32, 128] tiles of three inputs keep a warp's loads wide


@triton.jit
def nsa_combine_fwd_kernel(
    OC,  # [B, T, Hq, Dv] contiguous, fp32 or fp16
    OS,  # like OC
    OW,  # like OC
    GATES,  # [B, T, Hq, 3], any strides
    O,  # [B, T, Hq, Dv] contiguous, q's dtype
    sg_b,
    sg_t,
    sg_h,
    sg_c,
    N,  # B·T·Hq rows
    T,
    HQ,
    DV: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    ok = rows < N
    h = rows % HQ
    t = (rows // HQ) % T
    b = rows // (HQ * T)
    gbase = GATES + b * sg_b + t * sg_t + h * sg_h
    g0 = tl.load(gbase, mask=ok, other=0.0).to(tl.float32)
    g1 = tl.load(gbase + sg_c, mask=ok, other=0.0).to(tl.float32)
    g2 = tl.load(gbase + 2 * sg_c, mask=ok, other=0.0).to(tl.float32)
    d = tl.arange(0, BLOCK_DV)
    mask = ok[:, None] & (d[None, :] < DV)
    off = rows[:, None].to(tl.int64) * DV + d[None, :]  # [BLOCK_R, BLOCK_DV]
    o_c = tl.load(OC + off, mask=mask, other=0.0).to(tl.float32)
    o_s = tl.load(OS + off, mask=mask, other=0.0).to(tl.float32)
    o_w = tl.load(OW + off, mask=mask, other=0.0).to(tl.float32)
    # the same expression, in the same order, as the window kernel's fused epilogue
    out = g0[:, None] * o_c + g1[:, None] * o_s + g2[:, None] * o_w
    tl.store(O + off, out.to(O.dtype.element_ty), mask=mask)


def combine_triton(
    o_cmp: torch.Tensor,
    o_slc: torch.Tensor,
    o_win: torch.Tensor,
    gates: torch.Tensor,
    out_dtype: torch.dtype,
    alloc: object = torch.empty,
) -> torch.Tensor:
    """out [B, T, Hq, Dv] in out_dtype from three contiguous branch outputs (fp32 or fp16,
    the same shape) and gates [B, T, Hq, 3]."""
    b, t, hq, dv = o_win.shape
    for name, x in (("o_cmp", o_cmp), ("o_slc", o_slc), ("o_win", o_win)):
        if x.shape != o_win.shape or not x.is_contiguous():
            raise ValueError(f"combine_triton: {name} must be contiguous {tuple(o_win.shape)}")
    if gates.shape != (b, t, hq, 3):
        raise ValueError(f"combine_triton: gates must be {(b, t, hq, 3)}, got {tuple(gates.shape)}")
    out = alloc((b, t, hq, dv), dtype=out_dtype, device=o_win.device)  # type: ignore[operator]
    n = b * t * hq
    if n == 0:
        return out
    nsa_combine_fwd_kernel[(triton.cdiv(n, _BLOCK_R),)](
        o_cmp,
        o_slc,
        o_win,
        gates,
        out,
        gates.stride(0),
        gates.stride(1),
        gates.stride(2),
        gates.stride(3),
        n,
        t,
        hq,
        DV=dv,
        BLOCK_DV=pow2(dv),
        BLOCK_R=_BLOCK_R,
    )
    return out
