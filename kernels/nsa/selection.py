"""Selection branch (Triton): attention over the gathered blocks of each (t, KV head).

Paper kernel layout (§3.4): grid (query position, batch·KV head); a program loads the G
query heads of its group together ([BLOCK_H, Dk], padded to ≥ 16 rows for tl.dot) and loops
over the n selected blocks, each a [BLOCK_H × BLOCK_K] logit tile. The block index is loaded
as an int and the key addresses are computed from it (the interpreter cannot follow pointer
tensors loaded from memory, spec §5). Consecutive programs are neighbouring positions of one
KV head, so their shared blocks (init, local, popular ones) stay in L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.nsa._triton_common import autotune_configs, dot_f32, interpreting, mma, pow2
from kernels.nsa.config import NSAConfig

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
    O,  # [B, T, Hq, Dv] fp32
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
        acc * inv[:, None],
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Selection branch: idx [B,T,Hkv,n] int32 (−1 empty) → o [B,T,Hq,Dv] fp32, lse fp32."""
    b, t, hq, dk = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    g = hq // hkv
    dev = q.device
    o = alloc((b, t, hq, dv), dtype=torch.float32, device=dev)  # type: ignore[operator]
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
