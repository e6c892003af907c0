"""Selection branch (Triton): attention over the gathered blocks of each (t, KV head).

Paper kernel layout (§3.4): grid (query position, batch·KV head); a program loads the G
query heads of its group together ([BLOCK_H, Dk], padded to ≥ 16 rows for tl.dot) and loops
over the n selected blocks, each a [BLOCK_H × BLOCK_K] logit tile. The block index is loaded
as an int and the key addresses are computed from it (the interpreter cannot follow pointer
tensors loaded from memory, spec §5). Consecutive programs are neighbouring positions of one
KV head, so their shared blocks (init, local, popular ones) stay in L2.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.nsa._triton_common import (
    autotune_configs,
    dot_f32,
    gather_kv,
    interpreting,
    mma,
    online_step,
    pow2,
)
from kernels.nsa.config import NSAConfig
from kernels.nsa.window import window_forced_triton

_LOG2E = 1.4426950408889634


def _slc_configs() -> list[triton.Config]:
    if interpreting():
        return [triton.Config({}, num_warps=4, num_stages=1)]
    return autotune_configs(
        [
            triton.Config({}, num_warps=w, num_stages=s)
            # (2, 3) measured best on H200 at 16k–64k; first = default
            for w, s in ((2, 3), (4, 2), (4, 3), (8, 2), (4, 4))
        ]
    )


@triton.autotune(configs=_slc_configs(), key=["T", "G", "BLOCK_DK", "BLOCK_DV", "N_SEL"])
@triton.jit
def nsa_selection_fwd_kernel(
    Q,  # [B, T, Hq, Dk]
    K,  # [B, T, Hkv, Dk]
    V,  # [B, T, Hkv, Dv]
    IDX,  # [B, T, Hkv, n] int32, −1 = empty
    O,  # [B, T, Hq, Dv] fp32, or fp16 (attention.branch_dtype)
    LSE,  # [B, T, Hq] fp32
    sq_b,
    sq_t,
    sq_h,
    sk_b,
    sk_t,
    sk_h,
    sv_b,
    sv_t,
    sv_h,
    si_b,
    si_t,
    si_h,
    so_b,
    so_t,
    so_h,
    sl_b,
    sl_t,
    T,
    qk_scale,
    HKV: tl.constexpr,
    G: tl.constexpr,
    L_SEL: tl.constexpr,
    N_SEL: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    t = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = pid_bg // HKV
    g = pid_bg % HKV
    hh = tl.arange(0, BLOCK_H)
    h_ok = hh < G
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(
        Q + b * sq_b + t * sq_t + (g * G + hh)[:, None] * sq_h + offs_dk[None, :],
        mask=h_ok[:, None] & (offs_dk[None, :] < DK),
        other=0.0,
    )  # [BLOCK_H, BLOCK_DK]
    if DOT_F32:
        q = q.to(tl.float32)
    k_base = K + b * sk_b + g * sk_h
    v_base = V + b * sv_b + g * sv_h
    idx_base = IDX + b * si_b + t * si_t + g * si_h
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    u = tl.arange(0, BLOCK_K)
    for kk in range(N_SEL):
        blk = tl.load(idx_base + kk)  # scalar int32 block index
        if blk >= 0:  # empty slots (−1) cost nothing
            for u0 in range(0, L_SEL, BLOCK_K):  # constexpr bounds: unrolled when l′ > BLOCK_K
                tok = blk * L_SEL + u0 + u  # [BLOCK_K] key positions
                # tail of a padded tile, empty slot (blk = −1 makes every tok negative; a scalar
                # `blk >= 0` mask is rejected by the interpreter) and the token-level causal mask
                kmask = (u0 + u < L_SEL) & (tok >= 0) & (tok <= t)
                kt = tl.load(
                    k_base + tok[None, :] * sk_t + offs_dk[:, None],
                    mask=kmask[None, :] & (offs_dk[:, None] < DK),
                    other=0.0,
                )  # [BLOCK_DK, BLOCK_K]
                if DOT_F32:
                    kt = kt.to(tl.float32)
                s = mma(q, kt, DOT_F32) * qk_scale
                s = tl.where(kmask[None, :], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_safe)
                p = tl.exp2(s - m_safe[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                vt = tl.load(
                    v_base + tok[:, None] * sv_t + offs_dv[None, :],
                    mask=kmask[:, None] & (offs_dv[None, :] < DV),
                    other=0.0,
                )  # [BLOCK_K, BLOCK_DV]
                if DOT_F32:
                    acc = acc * alpha[:, None] + mma(p, vt.to(tl.float32), DOT_F32)
                else:
                    acc = acc * alpha[:, None] + mma(p.to(vt.dtype), vt, DOT_F32)
                m_i = m_new
    has = l_i > 0
    inv = tl.where(has, 1.0 / tl.where(has, l_i, 1.0), 0.0)
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(
        O + b * so_b + t * so_t + (g * G + hh)[:, None] * so_h + offs_dv[None, :],
        (acc * inv[:, None]).to(O.dtype.element_ty),
        mask=h_ok[:, None] & (offs_dv[None, :] < DV),
    )
    tl.store(LSE + b * sl_b + t * sl_t + g * G + hh, lse2 * 0.6931471805599453, mask=h_ok)


def selection_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    idx: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
    alloc: object = torch.empty,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Selection branch: idx [B,T,Hkv,n] int32 (−1 empty) → o [B,T,Hq,Dv] in out_dtype
    (fp32, or fp16 where the caller knows the values fit: ``attention.branch_dtype``), lse
    fp32."""
    b, t, hq, dk = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    g = hq // hkv
    dev = q.device
    o = alloc((b, t, hq, dv), dtype=out_dtype, device=dev)  # type: ignore[operator]
    lse = alloc((b, t, hq), dtype=torch.float32, device=dev)  # type: ignore[operator]
    idx = idx.to(torch.int32).contiguous()
    block_k = min(pow2(cfg.sel_block), 128)
    nsa_selection_fwd_kernel[(t, b * hkv)](
        q,
        k,
        v,
        idx,
        o,
        lse,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        idx.stride(0),
        idx.stride(1),
        idx.stride(2),
        o.stride(0),
        o.stride(1),
        o.stride(2),
        lse.stride(0),
        lse.stride(1),
        t,
        scale * _LOG2E,
        HKV=hkv,
        G=g,
        L_SEL=cfg.sel_block,
        N_SEL=cfg.sel_count,
        DK=dk,
        DV=dv,
        BLOCK_H=max(16, g),
        BLOCK_K=block_k,
        BLOCK_DK=pow2(dk),
        BLOCK_DV=pow2(dv),
        DOT_F32=dot_f32(q.dtype),
    )
    return o, lse


# ---------------------------------------------------------------------------------------------
# Variants v2 / v3 (selectable beside v1, see ``selection_variant``)
#
# v1 guards each selected block with a data-dependent `if blk >= 0`; the software pipeliner
# does not cross that branch, so every iteration waits for its K/V gather from L2 (the kernel
# runs at ≈ 6 TB/s of gathered bytes, 97 effective TFLOP/s). The variants below:
#   * run a branch-free `tl.range(..., num_stages=...)` loop (empty slots are masked, not
#     skipped), so the next blocks' gathers are in flight while the current one is computed;
#   * v3 additionally packs R consecutive query positions of one KV head into one program
#     (R·G rows, e.g. 32 for G=16: a larger MMA M) and walks the *union* of their block lists
#     (deduplicated on the host side with two small sorts). A block chosen by several of the R
#     positions is gathered once; each row masks the blocks its own position did not choose.
#     On real models neighbouring queries choose mostly the same blocks, so gathered bytes
#     drop ≈ R×; on i.i.d. random queries only the forced blocks are shared.
# ---------------------------------------------------------------------------------------------

_SLC_V2_STAGES = 3
_SLC_V3_R = 2  # positions per program for v3 (R·G rows); KGRADE_NSA_SELECTION_R overrides


def _slc_v2_configs() -> list[triton.Config]:
    if interpreting():  # KSPLIT as on the GPU, so the CPU tests run the default's key tiles
        return [triton.Config({"NUM_STAGES": 1, "KSPLIT": 2}, num_warps=4, num_stages=1)]
    # ≤ 4 hand-picked configs, tuned only with NSA_AUTOTUNE=1 (benchmark); first = default.
    # The pipeline depth lives in the loop (NUM_STAGES), num_stages here is for the prologue.
    # One warp: the 16 rows of a GQA group are one MMA's M, so more warps only split each
    # gathered block's N (sweep_nsa.py, 2026-12-02: 0.73 / 0.79 of 4 warps' time at 16k / 64k).
    # Half-block key tiles (KSPLIT 2) with 3 stages: 0.968 / 0.972 of whole blocks with 2
    # stages at 16k / 64k (run 40, 2026-12-03): each stage holds half the gathered bytes.
    return autotune_configs(
        [
            triton.Config({"NUM_STAGES": s, "KSPLIT": ks}, num_warps=w, num_stages=s)
            for ks, w, s in ((2, 1, 3), (2, 1, 2), (1, 1, 2), (1, 1, 3))
        ]
    )


@triton.autotune(
    configs=_slc_v2_configs(),
    key=["T", "G", "R", "BLOCK_M", "BLOCK_DK", "BLOCK_DV", "N_UNION", "SKIP_FORCED", "COMBINE"],
)
@triton.jit
def nsa_selection_fwd_kernel_v2(
    Q,  # [B, T, Hq, Dk]
    K,  # [B, T, Hkv, Dk]
    V,  # [B, T, Hkv, Dv]
    IDX,  # [B, T, Hkv, n] int32, −1 = empty (each position's own selection: row masks)
    UNI,  # R > 1: [B, ⌈T/R⌉, Hkv, R·n] int32 union of the R positions' blocks, −1 padded
    CNT,  # R > 1: [B, ⌈T/R⌉, Hkv] int32 number of valid union entries
    O,  # [B, T, Hq, Dv] fp32, or fp16 (attention.branch_dtype)
    LSE,  # [B, T, Hq] fp32
    OF,  # SKIP_FORCED: [B, T, Hq, Dv] the forced blocks' partial (window kernel), O's strides
    LSEF,  # SKIP_FORCED: [B, T, Hq] fp32 its log-sum-exp in base 2, LSE's strides
    OC,  # COMBINE: o_cmp [B, T, Hq, Dv], O's strides
    OW,  # COMBINE: o_win [B, T, Hq, Dv], O's strides
    GATES,  # COMBINE: [B, T, Hq, 3]
    OUT,  # COMBINE: out [B, T, Hq, Dv] in q's dtype, O's strides
    sg_b,
    sg_t,
    sg_h,
    sg_c,
    sq_b,
    sq_t,
    sq_h,
    sk_b,
    sk_t,
    sk_h,
    sv_b,
    sv_t,
    sv_h,
    si_b,
    si_t,
    si_h,
    su_b,
    su_t,
    su_h,
    sc_b,
    sc_t,
    so_b,
    so_t,
    so_h,
    sl_b,
    sl_t,
    T,
    qk_scale,
    HKV: tl.constexpr,
    G: tl.constexpr,
    R: tl.constexpr,
    L_SEL: tl.constexpr,
    N_SEL: tl.constexpr,
    N_UNION: tl.constexpr,  # R·n
    BLOCK_N: tl.constexpr,  # pow2 ≥ n (row index tile width)
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_M: tl.constexpr,  # pow2 ≥ max(16, R·G)
    BLOCK_KF: tl.constexpr,  # pow2 ≥ l′ (≤ 128): a whole selected block's key tile
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_F32: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    KSPLIT: tl.constexpr = 1,  # key sub-tiles per block tile (kept ≥ 16 keys for tl.dot)
    # variant v5 (R = 1, indices from the top-n): the forced blocks are left to the window
    # kernel, whose partial softmax (OF, LSEF) is merged after the picked blocks
    SKIP_FORCED: tl.constexpr = False,
    N_INIT: tl.constexpr = 1,
    N_LOCAL: tl.constexpr = 2,
    COMBINE: tl.constexpr = False,  # the gated sum into OUT in the epilogue
    WRITE_OS: tl.constexpr = True,  # with COMBINE: also o_slc into O (the backward's, aux)
):
    BLOCK_K: tl.constexpr = BLOCK_KF // KSPLIT if BLOCK_KF // KSPLIT >= 16 else BLOCK_KF
    N_SUB: tl.constexpr = (L_SEL + BLOCK_K - 1) // BLOCK_K  # key tiles per selected block
    pid_r = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = pid_bg // HKV
    g = pid_bg % HKV
    t0 = pid_r * R
    rows = tl.arange(0, BLOCK_M)
    t = t0 + rows // G  # [BLOCK_M] query position of each row (position-major)
    h = g * G + rows % G
    row_ok = (rows < R * G) & (t < T)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(
        Q + b * sq_b + t[:, None] * sq_t + h[:, None] * sq_h + offs_dk[None, :],
        mask=row_ok[:, None] & (offs_dk[None, :] < DK),
        other=0.0,
    )  # [BLOCK_M, BLOCK_DK]
    if DOT_F32:
        q = q.to(tl.float32)
    k_base = K + b * sk_b + g * sk_h
    v_base = V + b * sv_b + g * sv_h
    if R == 1:
        list_base = IDX + b * si_b + t0 * si_t + g * si_h
        n_iter = N_SEL * N_SUB
        if SKIP_FORCED:
            # the top-n's lists are ascending: the init blocks come first and the local ones
            # last, so a full row's picked blocks are slots [N_INIT, N_SEL − N_LOCAL); a row
            # with fewer blocks has its forced ones masked below
            list_base += N_INIT
            n_iter = (N_SEL - N_INIT - N_LOCAL) * N_SUB
    else:
        # Each row's own block list, to mask blocks of the union its position did not choose.
        kk = tl.arange(0, BLOCK_N)
        own = tl.load(
            IDX + b * si_b + t[:, None] * si_t + g * si_h + kk[None, :],
            mask=row_ok[:, None] & (kk[None, :] < N_SEL),
            other=-1,
        )  # [BLOCK_M, BLOCK_N]
        list_base = UNI + b * su_b + pid_r * su_t + g * su_h
        n_iter = tl.load(CNT + b * sc_b + pid_r * sc_t + g) * N_SUB
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    u = tl.arange(0, BLOCK_K)
    # Branch-free loop: the pipeliner issues the gathers of later iterations ahead of time.
    for it in tl.range(0, n_iter, num_stages=NUM_STAGES):
        slot = it // N_SUB
        u0 = (it % N_SUB) * BLOCK_K
        blk = tl.load(list_base + slot)  # scalar block index (−1: empty slot, all masked)
        tok = blk * L_SEL + u0 + u  # [BLOCK_K]
        kin = (u0 + u < L_SEL) & (tok >= 0) & (tok < T)
        if SKIP_FORCED:
            # not forced: init_blocks <= blk <= t0 // L_SEL - N_LOCAL, in keys
            kin = kin & (tok >= N_INIT * L_SEL) & (tok < (t0 // L_SEL - N_LOCAL + 1) * L_SEL)
        kt, vt = gather_kv(k_base, v_base, tok, kin, sk_t, sv_t, offs_dk, offs_dv, DK, DV)
        if DOT_F32:
            kt = kt.to(tl.float32)
        s = mma(q, kt, DOT_F32) * qk_scale
        vis = kin[None, :] & (tok[None, :] <= t[:, None])  # token-level causal mask per row
        if R > 1:
            chose = tl.max((own == blk).to(tl.int32), axis=1) > 0  # [BLOCK_M]
            vis = vis & chose[:, None]
        s = tl.where(vis, s, float("-inf"))
        m_i, l_i, acc = online_step(s, vt, m_i, l_i, acc, DOT_F32, True)
    optr = b * so_b + t[:, None] * so_t + h[:, None] * so_h + offs_dv[None, :]
    omask = row_ok[:, None] & (offs_dv[None, :] < DV)
    if SKIP_FORCED:  # merge the forced blocks' partial: never empty (a row sees its own key)
        lse_f = tl.load(LSEF + b * sl_b + t * sl_t + h, mask=row_ok, other=0.0)
        o_f = tl.load(OF + optr, mask=omask, other=0.0).to(tl.float32)
        m_new = tl.maximum(m_i, lse_f)
        alpha = tl.exp2(m_i - m_new)
        beta = tl.exp2(lse_f - m_new)
        l_i = l_i * alpha + beta
        acc = acc * alpha[:, None] + o_f * beta[:, None]
        m_i = m_new
    has = l_i > 0
    inv = tl.where(has, 1.0 / tl.where(has, l_i, 1.0), 0.0)
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    o_s = acc * inv[:, None]
    if COMBINE:
        gbase = GATES + b * sg_b + t * sg_t + h * sg_h
        g0 = tl.load(gbase, mask=row_ok, other=0.0).to(tl.float32)
        g1 = tl.load(gbase + sg_c, mask=row_ok, other=0.0).to(tl.float32)
        g2 = tl.load(gbase + 2 * sg_c, mask=row_ok, other=0.0).to(tl.float32)
        out = g1[:, None] * o_s
        out += g0[:, None] * tl.load(OC + optr, mask=omask, other=0.0).to(tl.float32)
        out += g2[:, None] * tl.load(OW + optr, mask=omask, other=0.0).to(tl.float32)
        tl.store(OUT + optr, out.to(OUT.dtype.element_ty), mask=omask)
    if WRITE_OS:
        tl.store(O + optr, o_s.to(O.dtype.element_ty), mask=omask)
    tl.store(LSE + b * sl_b + t * sl_t + h, lse2 * 0.6931471805599453, mask=row_ok)


def union_blocks(idx: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Union of the block lists of R consecutive positions (same batch, same KV head).

    idx [B, T, Hkv, n] int32 (−1 empty) → (union [B, ⌈T/R⌉, Hkv, R·n] int32 ascending,
    −1 padded; count [B, ⌈T/R⌉, Hkv] int32). Torch ops only (two sorts of R·n entries per
    row), a few small kernels even at 64k.
    """
    b, t, hkv, n = idx.shape
    tr = -(-t // r)
    if tr * r != t:
        pad = idx.new_full((b, tr * r - t, hkv, n), -1)
        idx = torch.cat([idx, pad], dim=1)
    big = torch.iinfo(torch.int32).max
    x = idx.view(b, tr, r, hkv, n).permute(0, 1, 3, 2, 4).reshape(b, tr, hkv, r * n)
    srt = torch.where(x < 0, big, x).sort(dim=-1).values
    dup = torch.zeros_like(srt, dtype=torch.bool)
    dup[..., 1:] = srt[..., 1:] == srt[..., :-1]
    srt = torch.where(dup, big, srt).sort(dim=-1).values  # unique ascending, big last
    cnt = (srt != big).sum(dim=-1, dtype=torch.int32)
    uni = torch.where(srt == big, -1, srt).to(torch.int32).contiguous()
    return uni, cnt.contiguous()


def selection_triton_v2(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    idx: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
    alloc: object = torch.empty,
    out_dtype: torch.dtype = torch.float32,
    positions: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Selection variants v2 (positions=1: pipelined) and v3 (positions=R: union of R rows).

    Same contract as ``selection_triton``.
    """
    b, t, hq, _ = q.shape
    dev = q.device
    o = alloc((b, t, hq, v.shape[3]), dtype=out_dtype, device=dev)  # type: ignore[operator]
    lse = alloc((b, t, hq), dtype=torch.float32, device=dev)  # type: ignore[operator]
    _launch_v2(q, k, v, idx, cfg, scale, o, lse, max(1, int(positions)))
    return o, lse


def selection_triton_v5(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    idx: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
    alloc: object = torch.empty,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Variant v5 alone (same contract as ``selection_triton``; idx must be the top-n's, with
    its forced blocks): the window kernel attends to the forced blocks
    (``window.window_forced_triton``, its window output unused here) and v2's kernel to the
    picked ones, merging the two. The forward runs it as ``forced_and_combined`` instead,
    where the window output is the branch's own and the gated sum is fused in."""
    b, t, hq, _ = q.shape
    _, _, o_f, lse_f = window_forced_triton(q, k, v, cfg, scale, alloc, out_dtype)
    o = alloc((b, t, hq, v.shape[3]), dtype=out_dtype, device=q.device)  # type: ignore[operator]
    lse = alloc((b, t, hq), dtype=torch.float32, device=q.device)  # type: ignore[operator]
    _launch_v2(q, k, v, idx, cfg, scale, o, lse, 1, forced=(o_f, lse_f))
    return o, lse


def forced_and_combined(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    idx: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
    forced: tuple[torch.Tensor, torch.Tensor],
    combine: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    o_slc: torch.Tensor | None,
    alloc: object = torch.empty,
) -> torch.Tensor:
    """Variant v5's kernel in the forward: the picked blocks of ``idx`` (the top-n's), merged
    with the forced blocks' partial ``forced`` = (o_f, lse2_f) from
    ``window.window_forced_triton``, and the gated sum g0·o_cmp + g1·o_slc + g2·o_win of
    ``combine`` = (o_cmp, o_win, gates) written to ``out`` (q's dtype); o_slc, when given,
    receives the branch's own output. Returns lse_slc."""
    b, t, hq, _ = q.shape
    lse = alloc((b, t, hq), dtype=torch.float32, device=q.device)  # type: ignore[operator]
    o = out if o_slc is None else o_slc  # O only names the strides when WRITE_OS is off
    _launch_v2(q, k, v, idx, cfg, scale, o, lse, 1, forced, (*combine, out), o_slc is not None)
    return lse


def _launch_v2(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    idx: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
    o: torch.Tensor,
    lse: torch.Tensor,
    r: int,
    forced: tuple[torch.Tensor, torch.Tensor] | None = None,
    combine: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    write_os: bool = True,
) -> None:
    """``nsa_selection_fwd_kernel_v2`` on the given outputs. forced = (o_f, lse2_f): skip the
    forced blocks and merge that partial (R = 1); combine = (o_cmp, o_win, gates, out): the
    gated sum into out. Every [B, T, Hq, Dv] tensor shares o's strides, lse2_f lse's."""
    b, t, hq, dk = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    g = hq // hkv
    assert forced is None or r == 1, "the forced blocks are skipped only at R = 1"
    o_f, lse_f = forced if forced is not None else (o, lse)  # placeholders: never read
    o_c, o_w, gates, out = combine if combine is not None else (o, o, lse.unsqueeze(-1), o)
    assert all(x.stride() == o.stride() for x in (o_f, o_c, o_w, out)), "o's strides"
    assert lse_f.stride() == lse.stride()
    idx = idx.to(torch.int32).contiguous()
    if r > 1:
        uni, cnt = union_blocks(idx, r)
    else:  # unused placeholders (R=1 walks idx itself)
        uni, cnt = idx, idx[:, :, :, 0]
    block_k = min(pow2(cfg.sel_block), 128)
    nsa_selection_fwd_kernel_v2[(-(-t // r), b * hkv)](
        q,
        k,
        v,
        idx,
        uni,
        cnt,
        o,
        lse,
        o_f,
        lse_f,
        o_c,
        o_w,
        gates,
        out,
        gates.stride(0),
        gates.stride(1),
        gates.stride(2),
        gates.stride(3),
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        idx.stride(0),
        idx.stride(1),
        idx.stride(2),
        uni.stride(0),
        uni.stride(1),
        uni.stride(2),
        cnt.stride(0),
        cnt.stride(1),
        o.stride(0),
        o.stride(1),
        o.stride(2),
        lse.stride(0),
        lse.stride(1),
        t,
        scale * _LOG2E,
        HKV=hkv,
        G=g,
        R=r,
        L_SEL=cfg.sel_block,
        N_SEL=cfg.sel_count,
        N_UNION=r * cfg.sel_count,
        BLOCK_N=pow2(cfg.sel_count, 1),
        DK=dk,
        DV=dv,
        BLOCK_M=pow2(r * g),
        BLOCK_KF=block_k,
        BLOCK_DK=pow2(dk),
        BLOCK_DV=pow2(dv),
        DOT_F32=dot_f32(q.dtype),
        SKIP_FORCED=forced is not None,
        N_INIT=cfg.sel_init,
        N_LOCAL=cfg.sel_local,
        COMBINE=combine is not None,
        WRITE_OS=write_os,
    )


def selection_triton_v3(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    idx: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
    alloc: object = torch.empty,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Variant v3: R consecutive positions per program over the union of their blocks.

    R = KGRADE_NSA_SELECTION_R if set (read at call time), else ``_SLC_V3_R``.
    """
    r = int(os.environ.get("KGRADE_NSA_SELECTION_R", _SLC_V3_R))
    return selection_triton_v2(q, k, v, idx, cfg, scale, alloc, out_dtype, r)


# v5: v2's kernel on the picked blocks only, the forced ones attended to by the window kernel
# (nsa_forced_probe.py, run 96, one H100, 64k: v2 on the picked blocks alone took 0.824 of its
# time on all n; the forward runs it through ``forced_and_combined``)
SELECTION_IMPLS = {
    "v1": selection_triton,
    "v2": selection_triton_v2,
    "v3": selection_triton_v3,
    "v5": selection_triton_v5,
}
