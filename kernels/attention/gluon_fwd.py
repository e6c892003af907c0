"""Block attention forward for Hopper written in Gluon (Triton's explicit-layout dialect).

The Triton kernel in ``block_attention.py`` leaves scheduling to the compiler, which waits on every
tensor-core op before the softmax that needs it. Here the loop is laid out by hand, FA3-style:

* a one-warp producer partition streams K and V tiles through a ring of shared-memory stages with
  TMA and mbarriers, so loads never sit in the consumers' instruction stream;
* two consumer partitions, one warpgroup and 64 query rows each, share those stages, so one
  warpgroup's softmax runs while the other's matrix products hold the tensor cores;
* each consumer issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} back to back as asynchronous
  wgmma ops, then runs S_j's softmax while O's wgmma is still on the tensor cores (intra-warpgroup
  overlap), and only waits for O before rescaling it.

Measured on one H200 (run 79, ``benchmarks/gluon_attention_ab.py``): 0.99-1.11 of cuDNN's
time at D 128 (T 8k-16k, causal and not) where the Triton kernel reaches 0.85-0.92.

Hopper only (sm_90, wgmma and TMA), bf16/fp16, D in {64, 128}, no mask or a causal one under
which every query sees key 0 (``q_offset >= k_offset``: the ring's diagonal and fused zigzag
blocks). There is no
interpreter for Gluon, so the kernel is checked on the GPU against ``naive.py``
(``tests/kernels/test_gpu_attention.py``); ``block_attention_gluon`` refuses what it cannot run.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .._gluon import on_hopper, tma_load
from .._tuning import fastest
from .._validate import check_scale

_LOG2E = 1.4426950408889634


@gluon.jit
def _loader(
    q_desc, k_desc, v_desc, q_smem, bufs, q_row, kv_row, q_col, kv_col, n_tiles,
    BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty = bufs
    q_rows: gl.constexpr = q_desc.block_type.shape[0]
    q_bytes: gl.constexpr = 2 * q_desc.block_type.nbytes
    mbarrier.expect(q_bar, q_bytes)
    for i in gl.static_range(2):  # one Q tile per consumer warpgroup
        tma_load(q_desc, [q_row + i * q_rows, q_col], q_bar, q_smem.index(i))
    for j in range(n_tiles):
        st = j % STAGES
        # A fresh barrier counts as having completed the phase before 0, so the first round
        # of each stage does not wait.
        ph = ((j // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(st), ph)
        mbarrier.expect(k_ready.index(st), k_desc.block_type.nbytes)
        tma_load(k_desc, [kv_row + j * BLOCK_N, kv_col], k_ready.index(st), k_smem.index(st))
        mbarrier.wait(v_empty.index(st), ph)
        mbarrier.expect(v_ready.index(st), v_desc.block_type.nbytes)
        tma_load(v_desc, [kv_row + j * BLOCK_N, kv_col], v_ready.index(st), v_smem.index(st))


@gluon.jit
def _masked(s, q_start, k_start, Tk, shift, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, s_layout: gl.constexpr, WINDOWED: gl.constexpr,
            window):  # fmt: skip
    rows = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    cols = k_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    keep = gl.expand_dims(cols < Tk, 0)
    if CAUSAL:  # key j visible to query i iff j <= i + shift (shift = q_offset - k_offset >= 0)
        keep = keep & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows + shift, 1))
    if WINDOWED:  # and, in a sliding window, j > i + shift - window
        keep = keep & (gl.expand_dims(cols, 0) > gl.expand_dims(rows + shift - window, 1))
    return gl.where(keep, s, float("-inf"))


@gluon.jit
def _attend(
    q_smem, bufs, n_tiles, q_start, kv_start, Tk, shift, qk_scale,
    ROWS: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
    STAGES: gl.constexpr, CAUSAL: gl.constexpr, WINDOWED: gl.constexpr, window,
):  # fmt: skip
    """ROWS query rows from q_start over the streamed K/V tiles (keys from kv_start).

    Returns the unnormalised output [ROWS, HEAD_D] in the wgmma layout, and the row maximum
    (log2 units) and sum in its row layout; callers normalise and store.
    """
    k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty = bufs
    nw: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, HEAD_D, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    dtype: gl.constexpr = q_smem.dtype
    zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([ROWS, HEAD_D], gl.float32, o_layout)
    # Key tiles j with j_lo <= j < j_hi need no mask for any of these rows.
    if WINDOWED:
        # every key of the tile inside the last row's window, and at or before the first row
        j_lo = gl.cdiv(gl.maximum(q_start + ROWS + shift - window - kv_start, 0), BLOCK_N)
        j_hi = (gl.minimum(q_start + shift + 1, Tk) - kv_start) // BLOCK_N
    elif CAUSAL:
        j_lo = 0  # (tile 0, peeled below, is always masked)
        j_hi = gl.minimum((q_start + shift) // BLOCK_N, Tk // BLOCK_N)
    else:
        j_lo = 0
        j_hi = Tk // BLOCK_N

    mbarrier.wait(q_bar, 0)
    # Tile 0 on its own: there is no P yet to multiply with V.
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s,))
    mbarrier.arrive(k_empty.index(0), count=1)
    s = _masked(s, q_start, kv_start, Tk, shift, CAUSAL, ROWS, BLOCK_N, s_layout, WINDOWED, window)
    m_i = gl.max(s, 1) * qk_scale  # [ROWS], log2 units
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
    l_i = gl.sum(p, 1)
    p_op = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_tiles):
        st = j % STAGES
        pst = (j - 1) % STAGES
        mbarrier.wait(k_ready.index(st), (j // STAGES) & 1)
        s = warpgroup_mma(
            q_smem, k_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True
        )
        mbarrier.wait(v_ready.index(pst), ((j - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(pst), acc, is_async=True)
        # wgmma groups retire in order: one outstanding means S_j is done, P V still running.
        s = warpgroup_mma_wait(1, deps=(s,))
        mbarrier.arrive(k_empty.index(st), count=1)
        if WINDOWED:  # noqa: SIM108 - a constexpr branch
            edge = (j < j_lo) | (j >= j_hi)
        else:
            edge = j >= j_hi
        if edge:
            k_start = kv_start + j * BLOCK_N
            s = _masked(
                s, q_start, k_start, Tk, shift, CAUSAL, ROWS, BLOCK_N, s_layout, WINDOWED, window
            )
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        l_i = l_i * alpha + gl.sum(p, 1)
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
        mbarrier.arrive(v_empty.index(pst), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        m_i = m_new

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.arrive(v_empty.index(last), count=1)

    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    return acc, gl.convert_layout(m_i, row_o), gl.convert_layout(l_i, row_o)


@gluon.jit
def _consumer(
    q_smem, bufs, dst, n_tiles, q_start, Tq, Tk, shift, qk_scale,
    ROWS: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
    STAGES: gl.constexpr, CAUSAL: gl.constexpr,
):  # fmt: skip
    """Attention of ROWS query rows from q_start over the streamed K/V tiles, stored at the end."""
    out_ptr, lse_ptr, b, h, bh, stride_ot, stride_oh = dst
    acc, m_i, l_i = _attend(q_smem, bufs, n_tiles, q_start, 0, Tk, shift, qk_scale,
                            ROWS, BLOCK_N, HEAD_D, STAGES, CAUSAL, False, 0)  # fmt: skip
    o_layout: gl.constexpr = acc.type.layout
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    # Stored straight from the wgmma layout: a layout conversion would need a shared-memory
    # scratch tile per partition, which the K/V stages need more.
    o = (acc / gl.expand_dims(l_i, 1)).to(q_smem.dtype)
    rows = q_start + gl.arange(0, ROWS, layout=row_o)
    cols = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
    base = out_ptr + b.to(gl.int64) * Tq * stride_ot + h * stride_oh
    ptrs = base + gl.expand_dims(rows.to(gl.int64) * stride_ot, 1) + gl.expand_dims(cols, 0)
    gl.store(ptrs, o, mask=gl.expand_dims(rows < Tq, 1))
    # lse in natural-log units, like the Triton kernel and cuDNN.
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    gl.store(lse_ptr + bh.to(gl.int64) * Tq + rows, lse, mask=rows < Tq)


@gluon.jit
def _buffers(q_desc, k_desc, v_desc, STAGES: gl.constexpr):
    """Shared memory of a program: two Q tiles (one per consumer), STAGES K and V stages, and
    their barriers (a stage is free again once both consumers arrived: count 2)."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2, ROWS, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    return q_smem, (k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty)


@gluon.jit
def block_attention_gluon_fwd_kernel(
    q_desc, k_desc, v_desc, out_ptr, lse_ptr,
    Tq, Tk, shift, Hq, GROUP, stride_ot, stride_oh, qk_scale,
    CAUSAL: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    """One program: 2 x q_desc-rows query rows of one (batch, head), in three partitions.

    Two 4-warp consumer partitions (one warpgroup each) take half the rows each over the same
    K/V stages, so one warpgroup's softmax runs while the other's wgmma has the tensor cores, and
    neither waits for the other when it frees a stage (two arrivals per stage). One 8-warp
    partition taking all rows measured 0.79-0.87 of cuDNN against 0.96-1.07 (run 76): every
    stage release then needs a barrier across both warpgroups, which keeps them in lockstep.
    """
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = 2 * ROWS

    num_m = gl.cdiv(Tq, BLOCK_M)
    # Heaviest causal tiles (the last query rows) first, so the tail of the grid is short ones.
    m_blk = num_m - 1 - gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    q_start = m_blk * BLOCK_M
    kv_end = gl.minimum(q_start + BLOCK_M + shift, Tk) if CAUSAL else Tk
    n_tiles = gl.cdiv(kv_end, BLOCK_N)

    q_smem, bufs = _buffers(q_desc, k_desc, v_desc, STAGES)

    q_row = b * Tq + q_start
    kv_row = b * Tk
    q_col = h * HEAD_D
    kv_col = (h // GROUP) * HEAD_D
    # Tuples keep the partitions' argument lists short. Constexprs go in the literal argument
    # tuples: a tuple held in a variable reaches a worker partition as tensors.
    dst = (out_ptr, lse_ptr, b, h, bh, stride_ot, stride_oh)
    gl.warp_specialize(
        [
            (_consumer, (q_smem.index(0), bufs, dst, n_tiles, q_start, Tq, Tk, shift, qk_scale,
                         ROWS, BLOCK_N, HEAD_D, STAGES, CAUSAL)),
            (_consumer, (q_smem.index(1), bufs, dst, n_tiles, q_start + ROWS, Tq, Tk, shift,
                         qk_scale,
                         ROWS, BLOCK_N, HEAD_D, STAGES, CAUSAL)),
            (_loader, (q_desc, k_desc, v_desc, q_smem, bufs, q_row, kv_row, q_col, kv_col,
                       n_tiles, BLOCK_N, STAGES)),
        ],
        [4, 1],
        [232, 24],
    )  # fmt: skip


# (block_n, stages) timed on a shape's first call; 64-key tiles measured 0.85-0.95 of cuDNN
# against 0.95-1.07 for 128 (run 76), so they are left to tests and benchmarks.
GLUON_CANDIDATES = ((128, 2), (128, 3))
_GLUON_BEST: dict[tuple, tuple[int, int]] = {}


def gluon_unsupported(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, q_offset: int, k_offset: int
) -> str | None:
    """Why the Gluon kernel cannot take these inputs, or None when it can."""
    if not on_hopper(q):
        return "the Gluon kernel needs a Hopper GPU (sm_90)"
    if q.dtype not in (torch.bfloat16, torch.float16) or not (q.dtype == k.dtype == v.dtype):
        return "the Gluon kernel takes bf16 or fp16 q, k, v of one dtype"
    if q.shape[-1] not in (64, 128) or v.shape[-1] != q.shape[-1]:
        return f"the Gluon kernel takes head dim 64 or 128, got {q.shape[-1]}"
    if q.shape[1] == 0 or k.shape[1] == 0:
        return "the Gluon kernel takes non-empty query and key blocks"
    if causal and q_offset < k_offset:
        # Then the first rows may see no key at all; the Triton kernel handles those.
        return "the Gluon kernel's causal mask needs q_offset >= k_offset"
    return None


def block_attention_gluon(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    q_offset: int = 0,
    k_offset: int = 0,
    scale: float | None = None,
    block_n: int | None = None,
    stages: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """out [B, Tq, Hq, D], lse [B, Hq, Tq] fp32 (natural log) of softmax(q k^T * scale) v.

    q [B, Tq, Hq, D], k and v [B, Tk, Hkv, D]. Causal: query i sees key j iff
    ``q_offset + i >= k_offset + j``, with ``q_offset >= k_offset`` (every row sees key 0).
    ``block_n`` and ``stages`` pin one configuration; left out, each shape's first call times
    ``GLUON_CANDIDATES`` and keeps the fastest. ``out``/``lse`` let tests pass NaN-poisoned
    buffers.
    """
    why = gluon_unsupported(q, k, v, causal=causal, q_offset=q_offset, k_offset=k_offset)
    if why is not None:
        raise ValueError(why)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    b, tq, hq, d = q.shape
    tk, hkv = k.shape[1], k.shape[2]
    shift = int(q_offset) - int(k_offset) if causal else 0
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    scale = check_scale(scale, d)  # > 0: the row maximum is taken before scaling
    if out is None:
        out = torch.empty_like(q)
    if lse is None:
        lse = torch.empty((b, hq, tq), dtype=torch.float32, device=q.device)
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    # [B*T, H*D] views: a tile running past a batch's end reads the next batch's rows, which
    # the kernel masks (keys) or never stores (queries).
    q2, k2, v2 = q.view(b * tq, hq * d), k.view(b * tk, hkv * d), v.view(b * tk, hkv * d)
    rows = 64  # per consumer warpgroup
    q_desc = TensorDescriptor.from_tensor(
        q2, [rows, d], gl.NVMMASharedLayout.get_default_for([rows, d], gdt)
    )

    def launch(cfg: tuple[int, int]) -> None:
        bn, st = cfg
        kv_layout = gl.NVMMASharedLayout.get_default_for([bn, d], gdt)
        block_attention_gluon_fwd_kernel[(triton.cdiv(tq, 2 * rows), b * hq)](
            q_desc,
            TensorDescriptor.from_tensor(k2, [bn, d], kv_layout),
            TensorDescriptor.from_tensor(v2, [bn, d], kv_layout),
            out, lse, tq, tk, shift, hq, hq // hkv, out.stride(1), out.stride(2), scale * _LOG2E,
            CAUSAL=bool(causal), STAGES=st, num_warps=4,
        )  # fmt: skip

    if block_n is not None or stages is not None:
        cfg = (block_n or 128, stages or 2)
    else:
        key = (tq, tk, d, bool(causal), hq // hkv, q.dtype)
        cfg = fastest(_GLUON_BEST, key, GLUON_CANDIDATES, launch)
    launch(cfg)
    return out, lse
