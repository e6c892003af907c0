"""Compressed-attention branch, block scores and top-n selection (Triton).

Design (spec §4.2, §7 budget "compressed attention + scores + top-n ≤ 15 ms at 64k"):

* One program owns BLOCK_T query positions × the G query heads of one KV head, so a
  [BLOCK_T·G, BLOCK_C] logit tile feeds tensor cores even at G = 16 and the per-group head
  sum of p_cmp happens in registers; [T, Tc] probabilities are never written out.
* Pass 1 computes the exact log-normaliser per row (QK̃ only). Pass 2 recomputes QK̃ with the
  final lse, so p is exact without online rescaling: it gives o_cmp = p·ṽ and, when scores
  are wanted, the ω-transformed group sums.
* A 16-bit k̃ comes as fp16 hi + lo parts (KC, KCL; ``_qk_tile``): QK̃ then costs two dots
  but is fp32-grade, since top-n agreement with the fp64 gold breaks on fp16 k̃ rounding.
* ω is banded: with L = l′/d, s[j] = Σ_r wa[r]·P[jL+r] + Σ_r wb[r]·P[(j−1)L+r]. Tiles of
  compressed blocks aligned to L write both halves (SA: own block, SB: spill into the next);
  the top-n kernel adds SB shifted by one block while loading, so no tile needs a halo.
* Top-n runs in its own kernel (``topn.py``) over rows of [Ts] scores.
* Variants (``COMPRESSED_IMPLS``, chosen in ``attention.py``) are kept side by side so the
  benchmark can compare them on identical inputs; the default is the measured fastest.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
import triton
import triton.language as tl

from kernels._gluon_switch import gluon_or_none
from kernels.nsa._triton_common import autotune_configs, dot_f32, interpreting, mma, pow2
from kernels.nsa.config import NSAConfig
from kernels.nsa.topn import topn_triton

_LOG2E = 1.4426950408889634


def _cmp_configs() -> list[triton.Config]:
    if interpreting():
        return [triton.Config({"BLOCK_M": 32, "BLOCK_C": 32}, num_warps=4, num_stages=1)]
    return autotune_configs(
        [
            triton.Config({"BLOCK_M": bm, "BLOCK_C": bc}, num_warps=w, num_stages=s)
            for bm, bc, w, s in (
                (128, 64, 4, 2),  # measured best on H200 at 16k–64k (first = default)
                (64, 64, 4, 3),
                (128, 64, 8, 3),
                (64, 128, 4, 2),
                (128, 128, 8, 2),
                (128, 32, 4, 3),
                (256, 64, 8, 2),
            )
        ]
    )


@triton.jit
def _qk_tile(
    q,  # [BLOCK_M, BLOCK_DK], already in the dot dtype
    kc_base,  # k̃ (hi part when KC_SPLIT) of this (batch, KV head)
    kcl_base,  # k̃ lo part, same layout; never read unless KC_SPLIT
    koff,  # [BLOCK_DK, BLOCK_C] element offsets of the transposed tile
    mask,
    DOT_F32: tl.constexpr,
    KC_SPLIT: tl.constexpr,
):
    """Unscaled QK̃ logits [BLOCK_M, BLOCK_C] in fp32.

    KC_SPLIT: k̃ = hi + lo with both parts fp16, so the tensor-core dots see k̃ to ≈ 2^-22
    relative. fp16 k̃ alone (2^-11) reorders near-tied block scores often enough to fail the
    top-n agreement at T = 8k, paper config; the second dot is the price of fp32-grade logits.
    """
    kt = tl.load(kc_base + koff, mask=mask, other=0.0)  # [BLOCK_DK, BLOCK_C]
    if DOT_F32:
        qk = mma(q, kt.to(tl.float32), DOT_F32)
    elif KC_SPLIT:
        kl = tl.load(kcl_base + koff, mask=mask, other=0.0)
        qk = tl.dot(q, kl, acc=tl.dot(q, kt))
    else:
        qk = mma(q, kt, DOT_F32)
    return qk


@triton.autotune(
    configs=_cmp_configs(), key=["T", "G", "BLOCK_DK", "BLOCK_DV", "SCORES", "KC_SPLIT"]
)
@triton.jit
def nsa_compressed_fwd_kernel(
    Q,  # [B, T, Hq, Dk]
    KC,  # [B, Tc, Hkv, Dk] (the fp16 hi part when KC_SPLIT)
    KCL,  # like KC: fp16 lo part of k̃ when KC_SPLIT, else unused
    VC,  # [B, Tc, Hkv, Dv]
    O,  # [B, T, Hq, Dv] fp32, or fp16 (attention.branch_dtype)
    LSE,  # [B, T, Hq] fp32 (natural log)
    SA,  # [B, Hkv, T, Ts] fp32: ω-weighted group sums into the own selection block
    SB,  # [B, Hkv, T, Ts] fp32: spill into the next selection block
    sq_b,
    sq_t,
    sq_h,
    sk_b,
    sk_t,
    sk_h,
    sv_b,
    sv_t,
    sv_h,
    so_b,
    so_t,
    so_h,
    sl_b,
    sl_t,
    ss_b,
    ss_h,
    ss_t,
    T,
    TC,
    TS,
    qk_scale,  # scale · log2(e): softmax in base 2
    HKV: tl.constexpr,
    G: tl.constexpr,
    L_CMP: tl.constexpr,
    D_STRIDE: tl.constexpr,
    RATIO: tl.constexpr,  # l′ / d, a power of two here
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    SCORES: tl.constexpr,
    DOT_F32: tl.constexpr,
    KC_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    BLOCK_T: tl.constexpr = BLOCK_M // G
    BLOCK_S: tl.constexpr = BLOCK_C // RATIO
    # Causal work grows with t: launch the late (heavy) position blocks first so the tail of
    # the grid is made of light programs.
    pid_t = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = pid_bg // HKV
    g = pid_bg % HKV
    t0 = pid_t * BLOCK_T
    rows = tl.arange(0, BLOCK_M)
    t = t0 + rows // G  # [BLOCK_M] query position of each row (rows: position-major)
    h = g * G + rows % G  # [BLOCK_M] query head of each row
    row_ok = t < T
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(
        Q + b * sq_b + t[:, None] * sq_t + h[:, None] * sq_h + offs_dk[None, :],
        mask=row_ok[:, None] & (offs_dk[None, :] < DK),
        other=0.0,
    )  # [BLOCK_M, BLOCK_DK]
    if DOT_F32:  # noqa: SIM108 - constexpr branch
        q = q.to(tl.float32)
    else:  # k̃ may be stored in fp16 for bf16 inputs (finer mantissa); dot operands must match
        q = q.to(KC.dtype.element_ty)
    # Blocks visible to the last row bound the loop; per-row visibility is masked below.
    t_last = tl.minimum(t0 + BLOCK_T - 1, T - 1)
    num = t_last + 1 - L_CMP
    n_vis = tl.where(num >= 0, num // D_STRIDE + 1, 0)
    n_vis = tl.minimum(n_vis, TC)
    kc_base = KC + b * sk_b + g * sk_h
    kcl_base = KCL + b * sk_b + g * sk_h
    vc_base = VC + b * sv_b + g * sv_h

    # ---- pass 1: exact row max and sum (base 2) ----
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    for c0 in range(0, n_vis, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        koff = c[None, :] * sk_t + offs_dk[:, None]  # [BLOCK_DK, BLOCK_C]
        kmask = (c[None, :] < n_vis) & (offs_dk[:, None] < DK)
        qk = _qk_tile(q, kc_base, kcl_base, koff, kmask, DOT_F32, KC_SPLIT)
        s = qk * qk_scale
        vis = (c[None, :] * D_STRIDE + (L_CMP - 1) <= t[:, None]) & (c[None, :] < n_vis)
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(s - m_safe[:, None]), 1)
        m_i = m_new
    has = l_i > 0
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    lse_safe = tl.where(has, lse2, 0.0)

    # ---- pass 2: exact p, o_cmp = p·ṽ, and ω-weighted group sums ----
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    r = tl.arange(0, RATIO)
    # ω(jL + r, j) and ω(jL + r, j + 1), in units of d (spec: |overlap| / d)
    wa = (tl.minimum(r * D_STRIDE + L_CMP, RATIO * D_STRIDE) - r * D_STRIDE).to(tl.float32)
    wa = wa / D_STRIDE
    wb = tl.maximum(r * D_STRIDE + L_CMP - RATIO * D_STRIDE, 0).to(tl.float32) / D_STRIDE
    tt = t0 + tl.arange(0, BLOCK_T)
    s_base = b * ss_b + g * ss_h + tt[:, None] * ss_t
    for c0 in range(0, n_vis, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        koff = c[None, :] * sk_t + offs_dk[:, None]  # [BLOCK_DK, BLOCK_C]
        kmask = (c[None, :] < n_vis) & (offs_dk[:, None] < DK)
        qk = _qk_tile(q, kc_base, kcl_base, koff, kmask, DOT_F32, KC_SPLIT)
        s = qk * qk_scale
        vis = (c[None, :] * D_STRIDE + (L_CMP - 1) <= t[:, None]) & (c[None, :] < n_vis)
        p = tl.where(vis, tl.exp2(s - lse_safe[:, None]), 0.0)  # [BLOCK_M, BLOCK_C]
        vt = tl.load(
            vc_base + c[:, None] * sv_t + offs_dv[None, :],
            mask=(c[:, None] < n_vis) & (offs_dv[None, :] < DV),
            other=0.0,
        )  # [BLOCK_C, BLOCK_DV]
        if DOT_F32:
            acc += mma(p, vt.to(tl.float32), DOT_F32)
        else:
            acc += mma(p.to(vt.dtype), vt, DOT_F32)
        if SCORES:
            pg = tl.sum(tl.reshape(p, [BLOCK_T, G, BLOCK_C]), axis=1)  # head sum per group
            p3 = tl.reshape(pg, [BLOCK_T, BLOCK_S, RATIO])
            sa = tl.sum(p3 * wa[None, None, :], axis=2)  # [BLOCK_T, BLOCK_S]
            sb = tl.sum(p3 * wb[None, None, :], axis=2)
            jj = c0 // RATIO + tl.arange(0, BLOCK_S)
            smask = (tt[:, None] < T) & (jj[None, :] < TS)
            tl.store(SA + s_base + jj[None, :], sa, mask=smask)
            tl.store(SB + s_base + jj[None, :], sb, mask=smask)
    tl.store(
        O + b * so_b + t[:, None] * so_t + h[:, None] * so_h + offs_dv[None, :],
        acc.to(O.dtype.element_ty),
        mask=row_ok[:, None] & (offs_dv[None, :] < DV),
    )
    tl.store(LSE + b * sl_b + t * sl_t + h, lse2 * 0.6931471805599453, mask=row_ok)


# ---------------------------------------------------------------------------------------------
# Variants v2 / v3 of the compressed kernel (selectable beside v1, see ``attention.variant``)
#
# Same two-pass algorithm and outputs as v1; the per-element softmax work is cut, because at
# D=128 the ALU/MUFU work per logit (scale, visibility mask, max, exp2, where) costs as much as
# the QK̃ MMA itself:
#   * tiles fully visible to every row of the program (all but the last one or two) run a
#     mask-free loop; only the causal edge pays for the visibility test and −inf guards;
#   * the scale is folded into the exp2 argument (one FMA: qk·scale − m) instead of a
#     separate multiply of the logit tile.
# v3 also computes the ω-weighted block scores with two small tensor-core dots per tile
# (p·Wa and p·Wb, with Wa/Wb the banded ω columns; p split into fp16 hi + lo parts so the sums
# keep ≈ 2^-22 relative precision, enough to reproduce the reference's top-n) and sums the
# G heads on the resulting [BLOCK_M, l′/d-grouped] tiles, 4× smaller than the [BLOCK_M,
# BLOCK_C] probability tile that v1/v2 reshape (a shared-memory layout conversion per tile).
# ---------------------------------------------------------------------------------------------


def _cmp_v2_configs() -> list[triton.Config]:
    if interpreting():
        # P1_MULT as on the GPU, so the CPU tests run the default's wide pass 1
        return [
            triton.Config({"BLOCK_M": 32, "BLOCK_C": 64, "P1_MULT": 2}, num_warps=4, num_stages=1)
        ]
    # BLOCK_C stays 64 (v3's score dots need BLOCK_C / RATIO ≥ 16); first = default, the
    # measured best on one H200 (benchmarks/sweep_nsa.py, 2026-12-02: pass 1 on 128-wide key
    # tiles 0.977 / 0.954 of the old default's time at 16k / 64k).
    return autotune_configs(
        [
            triton.Config({"BLOCK_M": bm, "BLOCK_C": 64, "P1_MULT": p1}, num_warps=w, num_stages=s)
            for bm, p1, w, s in ((128, 2, 8, 3), (128, 1, 8, 3), (128, 4, 8, 3), (256, 1, 8, 2))
        ]
    )


@triton.jit
def _cmp_block_scores(
    p,  # [BLOCK_M, BLOCK_C] fp32 exact probabilities (0 where invisible)
    WA,  # [BLOCK_C, BLOCK_S] banded ω (own block) — SCORE_DOT only
    WB,  # [BLOCK_C, BLOCK_S] banded ω (spill into the next block) — SCORE_DOT only
    wa,  # [RATIO] fp32
    wb,  # [RATIO] fp32
    SA,
    SB,
    s_base,  # [BLOCK_T, 1] offsets of the program's score rows
    c0,
    tt,  # [BLOCK_T] positions
    T,
    TS,
    G: tl.constexpr,
    RATIO: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SCORE_DOT: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    if SCORE_DOT:
        if DOT_F32:
            xa = tl.dot(p, WA, input_precision="ieee")
            xb = tl.dot(p, WB, input_precision="ieee")
        else:
            # p ≤ 1: scale by 2^15 so hi and lo stay normal fp16; hi + lo ≈ 22 bits of p.
            ps = p * 32768.0
            p_hi = ps.to(tl.float16)
            p_lo = (ps - p_hi.to(tl.float32)).to(tl.float16)
            xa = tl.dot(p_lo, WA, acc=tl.dot(p_hi, WA)) * (1.0 / 32768.0)
            xb = tl.dot(p_lo, WB, acc=tl.dot(p_hi, WB)) * (1.0 / 32768.0)
        sa = tl.sum(tl.reshape(xa, [BLOCK_T, G, BLOCK_S]), axis=1)  # [BLOCK_T, BLOCK_S]
        sb = tl.sum(tl.reshape(xb, [BLOCK_T, G, BLOCK_S]), axis=1)
    else:
        pg = tl.sum(tl.reshape(p, [BLOCK_T, G, BLOCK_C]), axis=1)  # head sum per group
        p3 = tl.reshape(pg, [BLOCK_T, BLOCK_S, RATIO])
        sa = tl.sum(p3 * wa[None, None, :], axis=2)  # [BLOCK_T, BLOCK_S]
        sb = tl.sum(p3 * wb[None, None, :], axis=2)
    jj = c0 // RATIO + tl.arange(0, BLOCK_S)
    smask = (tt[:, None] < T) & (jj[None, :] < TS)
    tl.store(SA + s_base + jj[None, :], sa, mask=smask)
    tl.store(SB + s_base + jj[None, :], sb, mask=smask)


@triton.autotune(
    configs=_cmp_v2_configs(),
    key=["T", "G", "BLOCK_DK", "BLOCK_DV", "SCORES", "SCORE_DOT", "KC_SPLIT", "LSE_HI"],
)
@triton.jit
def nsa_compressed_fwd_kernel_v2(
    Q,  # [B, T, Hq, Dk]
    KC,  # [B, Tc, Hkv, Dk] (the fp16 hi part when KC_SPLIT)
    KCL,  # like KC: fp16 lo part of k̃ when KC_SPLIT, else unused
    VC,  # [B, Tc, Hkv, Dv]
    O,  # [B, T, Hq, Dv] fp32, or fp16 (attention.branch_dtype)
    LSE,  # [B, T, Hq] fp32 (natural log)
    SA,  # [B, Hkv, T, Ts] fp32
    SB,  # [B, Hkv, T, Ts] fp32
    sq_b,
    sq_t,
    sq_h,
    sk_b,
    sk_t,
    sk_h,
    sv_b,
    sv_t,
    sv_h,
    so_b,
    so_t,
    so_h,
    sl_b,
    sl_t,
    ss_b,
    ss_h,
    ss_t,
    T,
    TC,
    TS,
    qk_scale,  # scale · log2(e)
    HKV: tl.constexpr,
    G: tl.constexpr,
    L_CMP: tl.constexpr,
    D_STRIDE: tl.constexpr,
    RATIO: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    SCORES: tl.constexpr,
    SCORE_DOT: tl.constexpr,
    DOT_F32: tl.constexpr,
    KC_SPLIT: tl.constexpr,
    LSE_HI: tl.constexpr,  # pass 1 on k̃'s hi part only; pass 2 corrects (see v2h)
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    P1_MULT: tl.constexpr = 1,  # pass 1's key tiles are P1_MULT x BLOCK_C wide (no p·ṽ there)
):
    BLOCK_T: tl.constexpr = BLOCK_M // G
    BLOCK_S: tl.constexpr = BLOCK_C // RATIO
    BLOCK_C1: tl.constexpr = BLOCK_C * P1_MULT
    P1_SPLIT: tl.constexpr = KC_SPLIT and not LSE_HI
    pid_t = tl.num_programs(0) - 1 - tl.program_id(0)  # heavy (late) position blocks first
    pid_bg = tl.program_id(1)
    b = pid_bg // HKV
    g = pid_bg % HKV
    t0 = pid_t * BLOCK_T
    rows = tl.arange(0, BLOCK_M)
    t = t0 + rows // G
    h = g * G + rows % G
    row_ok = t < T
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(
        Q + b * sq_b + t[:, None] * sq_t + h[:, None] * sq_h + offs_dk[None, :],
        mask=row_ok[:, None] & (offs_dk[None, :] < DK),
        other=0.0,
    )
    if DOT_F32:  # noqa: SIM108 - constexpr branch
        q = q.to(tl.float32)
    else:
        q = q.to(KC.dtype.element_ty)
    t_last = tl.minimum(t0 + BLOCK_T - 1, T - 1)
    num = t_last + 1 - L_CMP
    n_vis = tl.minimum(tl.where(num >= 0, num // D_STRIDE + 1, 0), TC)
    # Blocks visible to the first row are visible to every row: whole tiles of them need no
    # causal mask (and no −inf guards: every logit of such a tile is finite).
    num0 = t0 + 1 - L_CMP
    n_all = tl.minimum(tl.where(num0 >= 0, num0 // D_STRIDE + 1, 0), TC)
    c_split = (n_all // BLOCK_C) * BLOCK_C
    kc_base = KC + b * sk_b + g * sk_h
    kcl_base = KCL + b * sk_b + g * sk_h
    vc_base = VC + b * sv_b + g * sv_h
    cols = tl.arange(0, BLOCK_C)

    # ---- pass 1: row max and sum (base 2), m kept in scaled units; exact unless LSE_HI ----
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    cols1 = tl.arange(0, BLOCK_C1)
    c_split1 = (n_all // BLOCK_C1) * BLOCK_C1
    for c0 in range(0, c_split1, BLOCK_C1):
        c = c0 + cols1
        koff = c[None, :] * sk_t + offs_dk[:, None]
        qk = _qk_tile(q, kc_base, kcl_base, koff, offs_dk[:, None] < DK, DOT_F32, P1_SPLIT)
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(qk * qk_scale - m_new[:, None]), 1)
        m_i = m_new
    for c0 in range(c_split1, n_vis, BLOCK_C1):  # causal edge: at most two tiles
        c = c0 + cols1
        koff = c[None, :] * sk_t + offs_dk[:, None]  # [BLOCK_DK, BLOCK_C]
        kmask = (c[None, :] < n_vis) & (offs_dk[:, None] < DK)
        qk = _qk_tile(q, kc_base, kcl_base, koff, kmask, DOT_F32, P1_SPLIT)
        vis = (c[None, :] * D_STRIDE + (L_CMP - 1) <= t[:, None]) & (c[None, :] < n_vis)
        s = tl.where(vis, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(s - m_safe[:, None]), 1)
        m_i = m_new
    has = l_i > 0
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    lse_safe = tl.where(has, lse2, 0.0)

    # ---- pass 2: exact p, o_cmp = p·ṽ, and ω-weighted group sums ----
    # LSE_HI: pass 1 saw hi-only logits, so p here sums to l2 = 1 + O(lse error), not 1; o and
    # lse are corrected by l2 at the end. The block scores keep that per-head factor: a head's
    # lse error is its logits' errors averaged under p (≈ 1e-6 at random inputs, ~40× below
    # one logit's fp16 error, which is what the split exists to remove), so rankings hold.
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    l2 = tl.zeros([BLOCK_M], tl.float32)
    r = tl.arange(0, RATIO)
    wa = (tl.minimum(r * D_STRIDE + L_CMP, RATIO * D_STRIDE) - r * D_STRIDE).to(tl.float32)
    wa = wa / D_STRIDE
    wb = tl.maximum(r * D_STRIDE + L_CMP - RATIO * D_STRIDE, 0).to(tl.float32) / D_STRIDE
    # banded ω as [BLOCK_C, BLOCK_S] matrices for the SCORE_DOT path (values are small
    # integers: exact in fp16)
    rc = cols % RATIO
    wa_c = (tl.minimum(rc * D_STRIDE + L_CMP, RATIO * D_STRIDE) - rc * D_STRIDE).to(tl.float32)
    wb_c = tl.maximum(rc * D_STRIDE + L_CMP - RATIO * D_STRIDE, 0).to(tl.float32)
    band = (cols[:, None] // RATIO) == tl.arange(0, BLOCK_S)[None, :]
    w_a = tl.where(band, wa_c[:, None] / D_STRIDE, 0.0)
    w_b = tl.where(band, wb_c[:, None] / D_STRIDE, 0.0)
    if not DOT_F32:
        w_a = w_a.to(tl.float16)
        w_b = w_b.to(tl.float16)
    tt = t0 + tl.arange(0, BLOCK_T)
    s_base = b * ss_b + g * ss_h + tt[:, None] * ss_t
    for c0 in range(0, c_split, BLOCK_C):
        c = c0 + cols
        koff = c[None, :] * sk_t + offs_dk[:, None]
        qk = _qk_tile(q, kc_base, kcl_base, koff, offs_dk[:, None] < DK, DOT_F32, KC_SPLIT)
        p = tl.exp2(qk * qk_scale - lse_safe[:, None])
        if LSE_HI:
            l2 += tl.sum(p, 1)
        vt = tl.load(
            vc_base + c[:, None] * sv_t + offs_dv[None, :],
            mask=offs_dv[None, :] < DV,
            other=0.0,
        )
        if DOT_F32:
            acc += mma(p, vt.to(tl.float32), DOT_F32)
        else:
            acc += mma(p.to(vt.dtype), vt, DOT_F32)
        if SCORES:
            _cmp_block_scores(
                p, w_a, w_b, wa, wb, SA, SB, s_base, c0, tt, T, TS,
                G, RATIO, BLOCK_T, BLOCK_S, BLOCK_C, SCORE_DOT, DOT_F32,
            )  # fmt: skip
    for c0 in range(c_split, n_vis, BLOCK_C):
        c = c0 + cols
        koff = c[None, :] * sk_t + offs_dk[:, None]  # [BLOCK_DK, BLOCK_C]
        kmask = (c[None, :] < n_vis) & (offs_dk[:, None] < DK)
        qk = _qk_tile(q, kc_base, kcl_base, koff, kmask, DOT_F32, KC_SPLIT)
        vis = (c[None, :] * D_STRIDE + (L_CMP - 1) <= t[:, None]) & (c[None, :] < n_vis)
        p = tl.where(vis, tl.exp2(qk * qk_scale - lse_safe[:, None]), 0.0)
        if LSE_HI:
            l2 += tl.sum(p, 1)
        vt = tl.load(
            vc_base + c[:, None] * sv_t + offs_dv[None, :],
            mask=(c[:, None] < n_vis) & (offs_dv[None, :] < DV),
            other=0.0,
        )
        if DOT_F32:
            acc += mma(p, vt.to(tl.float32), DOT_F32)
        else:
            acc += mma(p.to(vt.dtype), vt, DOT_F32)
        if SCORES:
            _cmp_block_scores(
                p, w_a, w_b, wa, wb, SA, SB, s_base, c0, tt, T, TS,
                G, RATIO, BLOCK_T, BLOCK_S, BLOCK_C, SCORE_DOT, DOT_F32,
            )  # fmt: skip
    if LSE_HI:
        l2 = tl.where(has, l2, 1.0)
        acc = acc / l2[:, None]
        lse2 = lse2 + tl.log2(l2)  # −inf stays −inf for rows that see no block
    tl.store(
        O + b * so_b + t[:, None] * so_t + h[:, None] * so_h + offs_dv[None, :],
        acc.to(O.dtype.element_ty),
        mask=row_ok[:, None] & (offs_dv[None, :] < DV),
    )
    tl.store(LSE + b * sl_b + t * sl_t + h, lse2 * 0.6931471805599453, mask=row_ok)


CompressedFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]

# What each kernel variant changes (v1 is its own kernel; the others share the v2 kernel):
_VARIANT_DOCS = {
    "v1": "the first kernel: every tile masked, the scale a separate multiply",
    "v2": "mask-free interior tiles + FMA-folded scale",
    "v3": "v2 + block scores by tensor-core dots with the banded ω (v2's reshape sums when "
    "l′/d > 4, where the score tile would be narrower than 16)",
    "v2h": "v2 with pass 1 on k̃'s fp16 hi part only (one QK̃ dot instead of two); pass 2 "
    "still uses hi + lo and corrects o and lse by the sum of its p",
    "v3h": "v3 with v2h's pass 1",
}
_CONTRACT = """

Same contract as ``torch_path.compressed_torch``. Requires l′/d to be a power of two (the
banded ω reshape); callers check ``banded_scores_ok`` and fall back to the PyTorch path
otherwise.

kc_lo: with kc the fp16 rounding of an fp32 k̃, its fp16 remainder (k̃ − kc); the QK̃ logits
then take two fp16 dots and match fp32 ones to ≈ 2^-22 relative, which the top-n needs (see
``attention._compressed_dtype``). vc stays 16-bit: p·ṽ only feeds o_cmp.

out_dtype: o's storage dtype, fp32 as the contract's, or fp16 where the caller knows the values
fit (``attention.branch_dtype``): the fp32 result rounded once at the store.

topn_form: the top-n kernel's form (``topn.TOPN_FORMS``; None: its default), as
``attention.variant("topn")`` names it.
"""


def _variant(name: str) -> CompressedFn:
    def run(
        q: torch.Tensor,
        kc: torch.Tensor,
        vc: torch.Tensor,
        cfg: NSAConfig,
        scale: float,
        want_indices: bool,
        alloc: object = torch.empty,
        *,
        kc_lo: torch.Tensor | None = None,
        out_dtype: torch.dtype = torch.float32,
        topn_form: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return _compressed_launch(
            q, kc, vc, cfg, scale, want_indices, alloc, name, kc_lo, out_dtype, topn_form
        )

    run.__name__ = f"compressed_triton_{name}"
    run.__doc__ = f"Triton compressed branch, variant {name}: {_VARIANT_DOCS[name]}." + _CONTRACT
    return run


def _compressed_launch(
    q: torch.Tensor,
    kc: torch.Tensor,
    vc: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
    want_indices: bool,
    alloc: object,
    variant: str,
    kc_lo: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
    topn_form: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    b, t, hq, dk = q.shape
    tc, hkv, dv = kc.shape[1], kc.shape[2], vc.shape[3]
    g = hq // hkv
    ts = -(-t // cfg.sel_block)
    ratio = cfg.sel_block // cfg.cmp_stride
    dev = q.device
    o = alloc((b, t, hq, dv), dtype=out_dtype, device=dev)  # type: ignore[operator]
    lse = alloc((b, t, hq), dtype=torch.float32, device=dev)  # type: ignore[operator]
    if want_indices:
        sa = alloc((b, hkv, t, ts), dtype=torch.float32, device=dev)  # type: ignore[operator]
        sb = alloc((b, hkv, t, ts), dtype=torch.float32, device=dev)  # type: ignore[operator]
    else:  # dummies: SCORES=False never touches them
        sa = sb = torch.empty((1, 1, 1, 1), dtype=torch.float32, device=dev)
    kc = kc.contiguous()
    vc = vc.contiguous()
    split = kc_lo is not None
    if kc_lo is not None:
        assert kc.dtype == kc_lo.dtype == torch.float16 and kc_lo.shape == kc.shape
        kc_lo = kc_lo.contiguous()

    def grid(meta: dict[str, int]) -> tuple[int, int]:
        return (triton.cdiv(t, meta["BLOCK_M"] // g), b * hkv)

    if variant == "v1":
        kernel, extra = nsa_compressed_fwd_kernel, {}
    else:  # v2/v3(h) share a kernel; v3 needs BLOCK_C (64) / RATIO ≥ 16 for its score dots
        kernel = nsa_compressed_fwd_kernel_v2
        extra = {
            "SCORE_DOT": variant in ("v3", "v3h") and ratio <= 4,
            "LSE_HI": variant in ("v2h", "v3h"),
        }
    kernel[grid](
        q,
        kc,
        kc_lo if kc_lo is not None else kc,  # unused dummy when not split
        vc,
        o,
        lse,
        sa,
        sb,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        kc.stride(0),
        kc.stride(1),
        kc.stride(2),
        vc.stride(0),
        vc.stride(1),
        vc.stride(2),
        o.stride(0),
        o.stride(1),
        o.stride(2),
        lse.stride(0),
        lse.stride(1),
        sa.stride(0),
        sa.stride(1),
        sa.stride(2),
        t,
        tc,
        ts,
        scale * _LOG2E,
        HKV=hkv,
        G=g,
        L_CMP=cfg.cmp_block,
        D_STRIDE=cfg.cmp_stride,
        RATIO=ratio,
        DK=dk,
        DV=dv,
        BLOCK_DK=pow2(dk),
        BLOCK_DV=pow2(dv),
        SCORES=want_indices,
        # The split only makes sense with 16-bit dots, so it selects them (also under the
        # interpreter, whose numpy matmul of fp16 operands is exact: CPU tests cover it).
        DOT_F32=dot_f32(q.dtype) and not split,
        KC_SPLIT=split,
        **extra,
    )
    if not want_indices:
        return o, lse, None
    idx = topn_triton(sa, sb, t, hkv, cfg, alloc, form=topn_form)
    return o, lse, idx


def banded_scores_ok(cfg: NSAConfig) -> bool:
    ratio = cfg.sel_block // cfg.cmp_stride
    return ratio & (ratio - 1) == 0 and ratio <= 32  # BLOCK_C ≥ 32 holds whole groups


COMPRESSED_IMPLS = {name: _variant(name) for name in _VARIANT_DOCS}


def _gluon(**opts: object) -> CompressedFn:
    """v2h's algorithm in Gluon (Hopper only; ``compressed_gluon.py``); g3h8s is the default.

    Inputs the Gluon kernel does not take go to v2h, which computes the same thing, as does
    everything once Gluon proves unusable with this Triton (``kernels._gluon_switch``):
    another GPU than Hopper, or the CPU; a k̃ kept whole (no fp16 lo part: nsa_attention stores it in
    bf16 when its values reach fp16's range); l′/d = 32 (a 64-block tile would split a
    selection block); D other than 64 and 128; G not a power of two.
    """

    def run(
        q: torch.Tensor,
        kc: torch.Tensor,
        vc: torch.Tensor,
        cfg: NSAConfig,
        *args: object,
        kc_lo: torch.Tensor | None = None,
        q_peak: torch.Tensor | None = None,
        **kwargs: object,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        def call(mod: ModuleType) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
            if mod.compressed_gluon_unsupported(q, kc, vc, cfg, kc_lo) is not None:
                return None
            return mod.compressed_gluon(
                q, kc, vc, cfg, *args, kc_lo=kc_lo, q_peak=q_peak, **kwargs, **opts
            )

        res = gluon_or_none(
            "the NSA compressed branch", "kernels.nsa.compressed_gluon", call, where=q
        )
        if res is None:
            res = COMPRESSED_IMPLS["v2h"](q, kc, vc, cfg, *args, kc_lo=kc_lo, **kwargs)
            if q_peak is not None:  # v2h does not compute it: a pass of its own
                with torch.no_grad():
                    torch.maximum(q_peak, torch._foreach_norm([q], float("inf"))[0], out=q_peak)
        return res

    run.fills_q_peak = True  # type: ignore[attr-defined]
    return run


def fills_q_peak(fn: CompressedFn) -> bool:
    """Whether ``fn`` takes ``q_peak=`` (an fp32 [1] tensor it raises to max |q|): the Gluon
    forms, whose kernel loads every row of q anyway (``compressed_gluon``)."""
    return bool(getattr(fn, "fills_q_peak", False))


# g2h: each tile's products waited on before its softmax (the two warpgroups overlap each
# other); g2p: S_u's product runs while S_{u-1}'s softmax does, and p_u's while o's p·ṽ does.
COMPRESSED_IMPLS["g2h"] = _gluon(pipe=False, stages=3)
COMPRESSED_IMPLS["g2p"] = _gluon(pipe=True, stages=3)
COMPRESSED_IMPLS["g2p4"] = _gluon(pipe=True, stages=4)
# g2p8 (the default from run 86 to run 94): g2p with the q·k̃_lo product in e4m3: logits within
# ≈ 2^-15 instead of ≈ 2^-22; nsa_near_ties.py --lo fp8 measured the top-n it keeps.
COMPRESSED_IMPLS["g2p8"] = _gluon(pipe=True, stages=3, lo_fp8=True)
# Run 93 (2026-12-06, one H100, 64k, paper config, one process) timed the three below beside
# g2p8: the whole forward 40.96 ms with g2p8, 40.73 g3h8, 39.81 g2p8s, 39.47 g3h8s (0.964 of
# g2p8's; its top-n 99.989 % equal to v1's against g2p8's 99.990 %). Run 94 (one H100) timed
# g3h8s at 0.976 of g2p8's forward again and ran the NSA GPU suite and the grader's NSA tests
# with it: it has been the default since (kernels/nsa/attention.py).
# g3h8 (opt-in): g2p8's arithmetic with three consumer warpgroups a program,
# each waiting on its own products (no intra-warpgroup pipelining: with it a consumer needs
# more than the 152 registers a third warpgroup leaves). Run 92's source page found g2p8's
# consumers bound by their instruction latencies at two warps a scheduler, and three idle
# warps padding each program: g3h8 gives those slots a third consumer.
COMPRESSED_IMPLS["g3h8"] = _gluon(pipe=False, stages=3, lo_fp8=True, consumers=3)
# g2p8s (opt-in): g2p8 with pass 2's block scores weighted within each lane
# before the head sum, half the lane shuffles (SHFL was 10 % of g2p8's consumer instructions
# in run 92); G 16, l′/d 4 and l ≤ 3d (the paper's) only, other shapes as g2p8.
COMPRESSED_IMPLS["g2p8s"] = _gluon(pipe=True, stages=3, lo_fp8=True, packed_scores=True)
# g3h8s (the default since run 94): both; they add up (compressed branch 18.72 ms against
# g2p8's 20.09, g2p8s's 19.12 and g3h8's 19.62).
COMPRESSED_IMPLS["g3h8s"] = _gluon(
    pipe=False, stages=3, lo_fp8=True, consumers=3, packed_scores=True
)
# g3h8sq (opt-in; run 94: the whole forward 40.36, 39.58, 39.43 ms against g3h8s's 39.85,
# 39.72, 39.76, within their spread, so not the default): g3h8s with the softmax's row
# statistics per lane (pass 1's max and sum, pass 2's sum), merged across a row's quad once
# after the last tile, as FA3 keeps its row sums: the per-tile shuffles go (pass 1's loop
# 514 → 484 SASS instructions, pass 2's 589 → 581, Triton 3.9) and the in-thread chains
# become trees. Pass 1's sum, and so lse,
# changes in its last bits (another order of the adds).
COMPRESSED_IMPLS["g3h8sq"] = _gluon(
    pipe=False, stages=3, lo_fp8=True, consumers=3, packed_scores=True, quad=True
)
compressed_triton = COMPRESSED_IMPLS["v1"]

__all__ = [
    "COMPRESSED_IMPLS",
    "fills_q_peak",
    "banded_scores_ok",
    "compressed_triton",
    "nsa_compressed_fwd_kernel",
    "nsa_compressed_fwd_kernel_v2",
]
