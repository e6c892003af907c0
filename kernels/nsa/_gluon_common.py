"""Gluon helpers shared by the NSA branch kernels for Hopper (compressed and window)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def gqa_q_rows(q_ptr, b, sq_b, sq_t, sq_h, t0, h0, T, G: gl.constexpr, D: gl.constexpr):
    """[64, D] query rows of one consumer warpgroup, position-major: row r holds position
    t0 + r // G and head h0 + r % G of q [B, T, Hq, D] (zeros past T). The G heads of a
    position are contiguous, but positions are Hq heads apart, so no single TMA box holds
    the tile: it is gathered with 16-byte loads instead."""
    nw: gl.constexpr = gl.num_warps()
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [nw, 1], [1, 0])
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, ld))
    t = t0 + r // G
    h = h0 + r % G
    d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    # the batch's offset as a 64-bit scalar (B·T·Hq·D passes 2^31 at B 4, T 64k, Hq 64)
    base = q_ptr + b.to(gl.int64) * sq_b
    off = gl.expand_dims(t * sq_t + h * sq_h, 1) + gl.expand_dims(d, 0)
    return gl.load(base + off, mask=gl.expand_dims(t < T, 1), other=0.0)
