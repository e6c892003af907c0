"""Selection variant v4 (opt-in, not yet timed): the forced blocks gathered once for R positions.

Selection v2 is bound by L2 bandwidth (Nsight Compute, runs 91 and 92: 88-90 % of peak): each
(position, KV head) gathers its n selected blocks, K and V, 512 KB at the paper shape. With
unrelated queries the only blocks neighbouring positions are sure to share are the **forced**
ones (the first ``sel_init`` blocks and the ``sel_local`` last ones up to the position's own),
3 of 16 in the paper config, the same for every position of one l′-token block. A program here
takes R positions of one block (R divides l′) and one KV head, and:

* gathers each forced block once and scores it for all R·G rows (a batched dot against the
  one tile), each row keeping it only if its own list holds it;
* gathers each position's other blocks for that position alone, as a batched dot
  ([R, G, D] × [R, D, keys]), so no row computes a block it did not choose (v3, the union of R
  positions' lists, computes every union block for every row: 3.1 times v2's dots at R 4).

Gathered bytes per position: 13 + 3/R blocks instead of 16 (14 % fewer at R 4). Inputs it does
not take (G under 16 or not a power of two: the batched dot needs 16 rows a position; R not
dividing l′) go to v2. Same contract as ``selection.selection_triton``, for index lists
without repeated blocks (as the top-n makes them; v3 makes the same assumption).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.nsa._triton_common import dot_f32, gather_kv, interpreting, mma, pow2
from kernels.nsa.config import NSAConfig

_LOG2E = 1.4426950408889634
_SLC_V4_R = 4  # positions per program; KGRADE_NSA_SELECTION_R overrides (as for v3)


@triton.jit
def _online_update(s, vis, vt3, m_i, l_i, acc, DOT_F32: tl.constexpr):
    """One key tile's online-softmax step for [R, G] rows: s [R, G, K] base-2 logits, vis
    their mask, vt3 [R, K, Dv] the values."""
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 2))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, :, None])
    l_i = l_i * alpha + tl.sum(p, 2)
    if DOT_F32:
        acc = acc * alpha[:, :, None] + mma(p, vt3.to(tl.float32), DOT_F32)
    else:
        acc = acc * alpha[:, :, None] + mma(p.to(vt3.dtype), vt3, DOT_F32)
    return m_new, l_i, acc


@triton.jit
def nsa_selection_fwd_kernel_v4(
    Q,  # [B, T, Hq, Dk]
    K,  # [B, T, Hkv, Dk]
    V,  # [B, T, Hkv, Dv]
    IDX,  # [B, T, Hkv, n] int32, −1 = empty
    O,  # [B, T, Hq, Dv] fp32, or fp16 (attention.branch_dtype)
    LSE,  # [B, T, Hq] fp32
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, si_b, si_t, si_h,
    so_b, so_t, so_h, sl_b, sl_t,
    T,
    qk_scale,
    HKV: tl.constexpr,
    G: tl.constexpr,  # query heads a KV head: a power of two ≥ 16
    R: tl.constexpr,  # positions a program, dividing L_SEL
    L_SEL: tl.constexpr,
    N_SEL: tl.constexpr,
    N_INIT: tl.constexpr,
    N_LOCAL: tl.constexpr,
    BLOCK_N: tl.constexpr,  # pow2 ≥ n
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_K: tl.constexpr,  # key tile, pow2 ≥ 16
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_F32: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):  # fmt: skip
    N_SUB: tl.constexpr = (L_SEL + BLOCK_K - 1) // BLOCK_K  # key tiles per selected block
    pid_r = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = pid_bg // HKV
    g = pid_bg % HKV
    t0 = pid_r * R
    cur = t0 // L_SEL  # every position of the program is in this block (R divides l′)
    t = t0 + tl.arange(0, R)  # [R]
    pos_ok = t < T
    hh = g * G + tl.arange(0, G)  # [G]
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    u = tl.arange(0, BLOCK_K)
    q3 = tl.load(
        Q + b * sq_b + t[:, None, None] * sq_t + hh[None, :, None] * sq_h + offs_dk[None, None, :],
        mask=pos_ok[:, None, None] & (offs_dk[None, None, :] < DK),
        other=0.0,
    )  # [R, G, BLOCK_DK]
    if DOT_F32:
        q3 = q3.to(tl.float32)
    kk = tl.arange(0, BLOCK_N)
    own = tl.load(
        IDX + b * si_b + t[:, None] * si_t + g * si_h + kk[None, :],
        mask=pos_ok[:, None] & (kk[None, :] < N_SEL),
        other=-1,
    )  # [R, BLOCK_N]: each position's own list
    k_base = K + b * sk_b + g * sk_h
    v_base = V + b * sv_b + g * sv_h
    m_i = tl.full([R, G], float("-inf"), tl.float32)
    l_i = tl.zeros([R, G], tl.float32)
    acc = tl.zeros([R, G, BLOCK_DV], tl.float32)

    # ---- the forced blocks: one gather for the R positions ----
    for f in tl.range(0, (N_INIT + N_LOCAL) * N_SUB, num_stages=NUM_STAGES):
        slot = f // N_SUB
        u0 = (f % N_SUB) * BLOCK_K
        # init blocks 0..N_INIT-1, then local ones cur, cur-1, ... (those that are init
        # blocks already, or before block 0, are masked: gathered by nobody)
        blk = tl.where(slot < N_INIT, slot, cur - (slot - N_INIT))
        # [BLOCK_K] copies: the interpreter turns a scalar bool & a vector into int32
        blk_v = tl.zeros([BLOCK_K], tl.int32) + blk
        local_v = tl.zeros([BLOCK_K], tl.int32) + (slot - N_INIT)
        valid = (blk_v >= 0) & ((local_v < 0) | (blk_v >= N_INIT)) & (blk_v <= cur)
        tok = blk_v * L_SEL + u0 + u  # [BLOCK_K]
        kin = valid & (u0 + u < L_SEL) & (tok < T)
        kt, vt = gather_kv(k_base, v_base, tok, kin, sk_t, sv_t, offs_dk, offs_dv, DK, DV)
        if DOT_F32:
            kt = kt.to(tl.float32)
        kt3 = tl.broadcast_to(kt[None, :, :], (R, BLOCK_DK, BLOCK_K))
        vt3 = tl.broadcast_to(vt[None, :, :], (R, BLOCK_K, BLOCK_DV))
        s = mma(q3, kt3, DOT_F32) * qk_scale  # [R, G, BLOCK_K]
        chose = tl.max((own == blk).to(tl.int32), axis=1) > 0  # [R]
        vis = (kin[None, :] & (tok[None, :] <= t[:, None]) & chose[:, None])[:, None, :]
        m_i, l_i, acc = _online_update(s, vis, vt3, m_i, l_i, acc, DOT_F32)

    # ---- each position's other blocks, gathered for it alone ----
    for it in tl.range(0, N_SEL * N_SUB, num_stages=NUM_STAGES):
        slot = it // N_SUB
        u0 = (it % N_SUB) * BLOCK_K
        blk = tl.load(IDX + b * si_b + t * si_t + g * si_h + slot, mask=pos_ok, other=-1)  # [R]
        forced = (blk < N_INIT) | ((blk <= cur) & (blk > cur - N_LOCAL))
        tok = blk[:, None] * L_SEL + u0 + u[None, :]  # [R, BLOCK_K]
        kin = ((blk >= 0) & ~forced)[:, None] & (u0 + u < L_SEL)[None, :] & (tok < T)
        kt3 = tl.load(
            k_base + tok[:, None, :] * sk_t + offs_dk[None, :, None],
            mask=kin[:, None, :] & (offs_dk[None, :, None] < DK),
            other=0.0,
        )  # [R, BLOCK_DK, BLOCK_K]
        vt3 = tl.load(
            v_base + tok[:, :, None] * sv_t + offs_dv[None, None, :],
            mask=kin[:, :, None] & (offs_dv[None, None, :] < DV),
            other=0.0,
        )  # [R, BLOCK_K, BLOCK_DV]
        if DOT_F32:
            kt3 = kt3.to(tl.float32)
        s = mma(q3, kt3, DOT_F32) * qk_scale
        vis = (kin & (tok <= t[:, None]))[:, None, :]
        m_i, l_i, acc = _online_update(s, vis, vt3, m_i, l_i, acc, DOT_F32)

    has = l_i > 0
    inv = tl.where(has, 1.0 / tl.where(has, l_i, 1.0), 0.0)
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(
        O + b * so_b + t[:, None, None] * so_t + hh[None, :, None] * so_h + offs_dv[None, None, :],
        (acc * inv[:, :, None]).to(O.dtype.element_ty),
        mask=pos_ok[:, None, None] & (offs_dv[None, None, :] < DV),
    )
    tl.store(
        LSE + b * sl_b + t[:, None] * sl_t + hh[None, :],
        lse2 * 0.6931471805599453,
        mask=pos_ok[:, None],
    )


def v4_positions(g: int, cfg: NSAConfig, positions: int | None = None) -> int | None:
    """Positions a v4 program takes (``positions``, else KGRADE_NSA_SELECTION_R, else 4) for G
    query heads a KV head, or None where v4 cannot run (the caller then runs v2): G a power
    of two ≥ 16, R a power of two dividing l′."""
    r = positions or int(os.environ.get("KGRADE_NSA_SELECTION_R", _SLC_V4_R))
    if g < 16 or g & (g - 1) or r < 1 or r & (r - 1) or cfg.sel_block % r:
        return None
    return r


def selection_triton_v4(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    idx: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
    alloc: object = torch.empty,
    out_dtype: torch.dtype = torch.float32,
    positions: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Variant v4: the forced blocks gathered once per R positions (the module docstring).
    Same contract as ``selection.selection_triton``; v2 where v4 cannot run. ``positions``:
    R (``v4_positions``)."""
    b, t, hq, dk = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    g = hq // hkv
    r = v4_positions(g, cfg, positions)
    if r is None:
        from kernels.nsa.selection import selection_triton_v2  # selection.py imports this

        return selection_triton_v2(q, k, v, idx, cfg, scale, alloc, out_dtype)
    dev = q.device
    o = alloc((b, t, hq, dv), dtype=out_dtype, device=dev)  # type: ignore[operator]
    lse = alloc((b, t, hq), dtype=torch.float32, device=dev)  # type: ignore[operator]
    idx = idx.to(torch.int32).contiguous()
    # half-block key tiles, as v2's default (KSPLIT 2), kept ≥ 16 keys for tl.dot
    block_k = max(16, min(pow2(cfg.sel_block), 128) // 2)
    nsa_selection_fwd_kernel_v4[(-(-t // r), b * hkv)](
        q, k, v, idx, o, lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        idx.stride(0), idx.stride(1), idx.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        lse.stride(0), lse.stride(1),
        t, scale * _LOG2E,
        HKV=hkv, G=g, R=r, L_SEL=cfg.sel_block, N_SEL=cfg.sel_count,
        N_INIT=cfg.sel_init, N_LOCAL=cfg.sel_local, BLOCK_N=pow2(cfg.sel_count, 1),
        DK=dk, DV=dv, BLOCK_K=block_k, BLOCK_DK=pow2(dk), BLOCK_DV=pow2(dv),
        DOT_F32=dot_f32(q.dtype), NUM_STAGES=1 if interpreting() else 2,
        # a warp per 8 of the R·G rows: R 4, G 16 compile to 184 registers and no spill at 8
        # warps, 255 and a spill at 4 (Triton 3.9, sm_90a)
        num_warps=min(16, max(4, r * g // 8)),
    )  # fmt: skip
    return o, lse
