"""Sliding-window branch forward in Gluon, for Hopper, fused with the gated combine.

Correct (``tests/kernels/test_gpu_nsa_gluon.py``, run 81) but SLOWER than the Triton kernel,
so not the default: 5.30 ms against v1's 4.47 at 64k, 1.29 against 1.05 at 16k (run 82,
2026-12-05, one H200, paper config, w = 512; no other window measured). The likely reasons,
not yet profiled: a program's band at w = 512 is five 128-key tiles, too short for the
two-consumer pipeline's fill and drain to amortise, and each program loads its band for one
query head where v1 shares it across the G heads of a KV head. Selected with
``KGRADE_NSA_WINDOW=g1``. Sharing the band was then tried (a form "g2" packing 8 positions ×
the 16 heads of a KV head per program, as v1 packs them; run 91, 2026-12-06, one H100, 64k):
4.62 ms against v1's 4.24 and g1's 5.31 in one run, so it was reverted (``docs/perf.md``).
Nsight Compute on v1 in that run: 3.70 ms, tensor pipe 34 %, L2 51 %, 12 % occupancy at
182 registers; no unit is saturated, so a faster window needs more work in flight per SM,
not fewer bytes.

The block attention kernel's schedule (``kernels/attention/gluon_fwd.py``: a TMA loader
partition and two one-warpgroup consumers over shared K/V stages, FA3-style overlap inside
each), with the window's lower bound in its mask and ``window_triton``'s epilogue: the combine
``g0·o_cmp + g1·o_slc + g2·o_win`` in fp32, written in q's dtype. A program takes 128
consecutive positions of one query head; its K/V band is [t0 − w + 1, t0 + 128), so at w = 512
four of its five 128-key tiles are useful work for a row (the Triton kernel, with 4 positions ×
16 heads per program, loads 515 keys per 64 rows in 64-key tiles). Same contract as
``window.window_triton``.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels._gluon import on_hopper
from kernels._tuning import fastest
from kernels._validate import check_scale
from kernels.attention.gluon_fwd import GLUON_CANDIDATES, _attend, _buffers, _loader

_LOG2E = 1.4426950408889634
ROWS = 64  # per consumer warpgroup


@gluon.jit
def _win_consumer(
    q_smem, bufs, dst, comb, n_tiles, q_start, kv_start, T, window, qk_scale,
    ROWS: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
    COMBINE: gl.constexpr, WRITE_OW: gl.constexpr,
):  # fmt: skip
    o_ptr, lse_ptr, b, h, so_b, so_t, so_h, sl_b, sl_t = dst
    oc_ptr, os_ptr, g_ptr, ow_ptr, sg_b, sg_t, sg_h, sg_c = comb
    acc, m_i, l_i = _attend(q_smem, bufs, n_tiles, q_start, kv_start, T, 0, qk_scale,
                            ROWS, BLOCK_N, HEAD_D, STAGES, True, True, window)  # fmt: skip
    o_layout: gl.constexpr = acc.type.layout
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    t = q_start + gl.arange(0, ROWS, layout=row_o)
    row_ok = t < T
    # Every row below T sees its own key, so l_i > 0 there; rows past T are never stored.
    o_win = acc / gl.expand_dims(gl.where(row_ok, l_i, 1.0), 1)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    # The batch's offset as a 64-bit scalar (B·T·Hq·D passes 2^31 at B 4, T 64k, Hq 64,
    # D 128), added to the scalar pointers; within a batch, 32-bit offsets. [64, D] tiles of
    # offsets or addresses cost registers like the data: 64-bit ones spilled.
    bo = b.to(gl.int64) * so_b
    o_ptr = o_ptr + bo
    gl.store(lse_ptr + b.to(gl.int64) * sl_b + t * sl_t + h, lse, mask=row_ok)
    e = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
    omask = gl.expand_dims(row_ok, 1)
    o_off = gl.expand_dims(t * so_t + h * so_h, 1) + gl.expand_dims(e, 0)
    if COMBINE:
        # One operand at a time, and one offset tile for o, o_cmp, o_slc and o_win (all
        # contiguous [B, T, Hq, D]).
        g_ptr = g_ptr + b.to(gl.int64) * sg_b
        g_off = t * sg_t + h * sg_h
        if WRITE_OW:
            gl.store((ow_ptr + bo) + o_off, o_win.to(ow_ptr.dtype.element_ty), mask=omask)
        g2 = gl.load(g_ptr + g_off + 2 * sg_c, mask=row_ok, other=0.0).to(gl.float32)
        out = gl.expand_dims(g2, 1) * o_win
        g0 = gl.load(g_ptr + g_off, mask=row_ok, other=0.0).to(gl.float32)
        o_c = gl.load((oc_ptr + bo) + o_off, mask=omask, other=0.0).to(gl.float32)
        out += gl.expand_dims(g0, 1) * o_c
        g1 = gl.load(g_ptr + g_off + sg_c, mask=row_ok, other=0.0).to(gl.float32)
        o_s = gl.load((os_ptr + bo) + o_off, mask=omask, other=0.0).to(gl.float32)
        out += gl.expand_dims(g1, 1) * o_s
        gl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=omask)
    else:
        gl.store(o_ptr + o_off, o_win.to(o_ptr.dtype.element_ty), mask=omask)


@gluon.jit
def nsa_window_gluon_fwd_kernel(
    q_desc, k_desc, v_desc, o_ptr, lse_ptr, oc_ptr, os_ptr, g_ptr, ow_ptr,
    so_b, so_t, so_h, sl_b, sl_t, sg_b, sg_t, sg_h, sg_c,
    T, Hq, GROUP, window, qk_scale,
    STAGES: gl.constexpr, COMBINE: gl.constexpr, WRITE_OW: gl.constexpr,
):  # fmt: skip
    """One program: 2 × 64 consecutive positions of one (batch, query head)."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    bh = gl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    q_start = gl.program_id(0) * (2 * ROWS)
    kv_start = gl.maximum(q_start - window + 1, 0)
    kv_end = gl.minimum(q_start + 2 * ROWS, T)
    n_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)

    q_smem, bufs = _buffers(q_desc, k_desc, v_desc, STAGES)

    dst = (o_ptr, lse_ptr, b, h, so_b, so_t, so_h, sl_b, sl_t)
    comb = (oc_ptr, os_ptr, g_ptr, ow_ptr, sg_b, sg_t, sg_h, sg_c)
    gl.warp_specialize(
        [
            (_win_consumer, (q_smem.index(0), bufs, dst, comb, n_tiles, q_start, kv_start, T,
                             window, qk_scale, ROWS, BLOCK_N, HEAD_D, STAGES, COMBINE,
                             WRITE_OW)),
            (_win_consumer, (q_smem.index(1), bufs, dst, comb, n_tiles, q_start + ROWS,
                             kv_start, T, window, qk_scale, ROWS, BLOCK_N, HEAD_D, STAGES,
                             COMBINE, WRITE_OW)),
            (_loader, (q_desc, k_desc, v_desc, q_smem, bufs, b * T + q_start, b * T + kv_start,
                       h * HEAD_D, (h // GROUP) * HEAD_D, n_tiles, BLOCK_N, STAGES)),
        ],
        [4, 1],
        [232, 24],
    )  # fmt: skip


_WIN_BEST: dict[tuple, tuple[int, int]] = {}


def window_gluon_unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why the Gluon window kernel cannot take these inputs, or None when it can."""
    if not on_hopper(q):
        return "the Gluon window kernel needs a Hopper GPU (sm_90)"
    if q.dtype not in (torch.bfloat16, torch.float16) or not (q.dtype == k.dtype == v.dtype):
        return "the Gluon window kernel takes bf16 or fp16 q, k, v of one dtype"
    d = q.shape[3]
    if d not in (64, 128) or k.shape[3] != d or v.shape[3] != d:
        return f"the Gluon window kernel takes head dims 64 or 128, all equal, got {d}"
    return None


def window_gluon(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    scale: float,
    *,
    combine: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    alloc: object = torch.empty,
    o_win: torch.Tensor | None = None,
    block_n: int | None = None,
    stages: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``window.window_triton``'s contract on the Gluon kernel (sm_90, bf16/fp16, D 64 or 128).

    ``block_n``/``stages`` pin a configuration; left out, a shape's first call times
    ``GLUON_CANDIDATES`` (as block attention does) and keeps the fastest.
    """
    why = window_gluon_unsupported(q, k, v)
    if why is not None:
        raise ValueError(why)
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    scale = check_scale(scale, d)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    dev = q.device
    out_dtype = q.dtype if combine is not None else torch.float32
    o = alloc((b, t, hq, d), dtype=out_dtype, device=dev)  # type: ignore[operator]
    lse = alloc((b, t, hq), dtype=torch.float32, device=dev)  # type: ignore[operator]
    if combine is not None:
        o_cmp, o_slc, gates = combine
        # one offset tile serves o, o_cmp, o_slc and o_win: all contiguous, of one shape
        o_cmp, o_slc = o_cmp.contiguous(), o_slc.contiguous()
        if o_cmp.shape != o.shape or o_slc.shape != o.shape:
            raise ValueError(f"o_cmp and o_slc must be {tuple(o.shape)}, as the output")
        if gates.shape != (b, t, hq, 3):
            raise ValueError(f"gates must be {(b, t, hq, 3)}, got {tuple(gates.shape)}")
        if not o.is_contiguous():
            raise ValueError("the output buffer from alloc must be contiguous")
    else:
        o_cmp = o_slc = gates = o  # placeholders: COMBINE=False never reads them
    write_ow = combine is not None and o_win is not None
    if write_ow:
        assert o_win is not None and o_win.shape == o.shape and o_win.is_contiguous()
        assert o_win.dtype in (torch.float32, torch.float16) and o.is_contiguous()
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q2, k2, v2 = q.view(b * t, hq * d), k.view(b * t, hkv * d), v.view(b * t, hkv * d)
    q_desc = TensorDescriptor.from_tensor(
        q2, [ROWS, d], gl.NVMMASharedLayout.get_default_for([ROWS, d], gdt)
    )

    def launch(cfg: tuple[int, int]) -> None:
        bn, st = cfg
        # Key tile 0 then holds a visible key for each of the program's 128 rows (the last
        # row's window starts at its last key), so no row's running maximum stays −inf.
        if bn < 2 * ROWS:
            raise ValueError(f"the Gluon window kernel needs 128-key tiles or wider, got {bn}")
        kv_layout = gl.NVMMASharedLayout.get_default_for([bn, d], gdt)
        nsa_window_gluon_fwd_kernel[(triton.cdiv(t, 2 * ROWS), b * hq)](
            q_desc,
            TensorDescriptor.from_tensor(k2, [bn, d], kv_layout),
            TensorDescriptor.from_tensor(v2, [bn, d], kv_layout),
            o, lse, o_cmp, o_slc, gates, o_win if write_ow else o,
            o.stride(0), o.stride(1), o.stride(2), lse.stride(0), lse.stride(1),
            gates.stride(0), gates.stride(1), gates.stride(2), gates.stride(3),
            t, hq, hq // hkv, window, scale * _LOG2E,
            STAGES=st, COMBINE=combine is not None, WRITE_OW=write_ow,
            num_warps=4,
        )  # fmt: skip

    if block_n is not None or stages is not None:
        cfg = (block_n or 128, stages or 2)
    else:
        key = (t, d, window, hq // hkv, q.dtype, combine is not None, write_ow)
        cfg = fastest(_WIN_BEST, key, GLUON_CANDIDATES, launch)
    launch(cfg)
    return o, lse
