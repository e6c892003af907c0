"""Compressed-attention branch backward (Triton): recompute from lse_cmp, no atomics.

* ``nsa_compressed_bwd_dq_kernel``: the forward's layout (BLOCK_T positions × G heads of one
  KV head per program), looping over the compressed blocks visible to the tile's last row;
  the causal-by-block mask ``i·d + l − 1 ≤ t`` is applied per row. Adds into fp32 dq.
* ``nsa_compressed_bwd_dkdv_kernel``: one program per BLOCK_C compressed blocks × segment of
  query positions × (batch, KV head), looping over the segment's queries that see the blocks
  (t ≥ c0·d + l − 1), G heads at once. Early blocks are seen by almost all T queries, late
  ones by few: without segments the first program would run ≈ 2× the average and the grid
  (Tc/BLOCK_C · Hkv programs, ≈ 256 at 64k) would barely fill the GPU. Each segment writes
  its partial dk̃, dṽ to its own slice of a [S, B, Tc, Hkv, ·] fp32 buffer (zeros when it
  sees none of the blocks) and the host sums over S: deterministic, no atomics. The mean
  pooling's backward (spread dk̃/l over each window) is a cheap torch op in ``backward.py``.

k̃ arrives in fp32. The QK̃ logits are recomputed in the forward's storage precision: fp32
dots for fp32 inputs; k̃ rounded to fp16 when the forward split it into fp16 hi + lo
(KC_SPLIT); else k̃ rounded to q's dtype. The host rounds k̃ (and ṽ, to dout's dtype) once
into the kernels' operand dtypes, so the key loops load 16-bit tiles and convert nothing:
converting each fp32 k̃ tile in the dq loop, twice, made that kernel 1.6x slower at 64k
(sweep_nsa.py, same config: 23.35 ms before, 14.58 after).

The backward drops the lo part on purpose: the forward needed fp32-grade logits only so that
near-tied block scores pick the reference's top-n; here an fp16 k̃ moves the logits by ≈
2^-12 relative, less than the bf16 rounding of dout and ṽ in the other dots, and the second
QK̃ dot would cost ≈ 2/9 of this branch's tensor-core work. The other dots (dout·ṽ, ds·k̃,
dsᵀ·q, pᵀ·dout) use q's dtype with fp32 accumulation, as a FlashAttention-2 backward does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.nsa._bwd_common import LOG2E, load_rows, row_stats
from kernels.nsa._triton_common import autotune_configs, dot_f32, interpreting, mma, pow2
from kernels.nsa.config import NSAConfig

# Query rows (positions × G heads) per dk̃/dṽ segment: ≈ 16 segments at 64k with G = 16, so
# the grid has ≈ 2k programs of ≤ 1k row tiles each; the partial buffers then hold 16 copies
# of dk̃, dṽ (≈ 270 MB at 64k, paper config), summed on the host.
SEG_ROWS = 65536


def _configs() -> list[triton.Config]:
    if interpreting():
        return [triton.Config({"BLOCK_M": 32, "BLOCK_C": 32}, num_warps=4, num_stages=1)]
    # First = default, the measured best on one H200, paper config (sweep_nsa.py, 2026-12-02):
    # dq 128 x 64 with 8 warps, 3 stages (0.882 / 0.945 of 2 stages' time at 64k / 16k);
    # dk̃/dṽ the same (equal to 64 x 64, 4 warps, 2 stages at 64k; 0.714 of its time at 16k).
    first = (128, 64, 8, 3)
    rest = ((128, 64, 8, 2), (64, 128, 8, 2), (64, 32, 4, 3), (64, 64, 8, 2), (64, 64, 4, 2))
    return autotune_configs(
        [
            triton.Config({"BLOCK_M": bm, "BLOCK_C": bc}, num_warps=w, num_stages=st)
            for bm, bc, w, st in dict.fromkeys((first, *rest))
        ]
    )


@triton.jit
def _logits(q, q16, kct, DOT_F32: tl.constexpr, KC_SPLIT: tl.constexpr):
    """Unscaled q·k̃ᵀ [M, C] fp32 from q [M, Dk] (q's dtype; q16 its fp16 copy) and the k̃
    tile transposed, kct [Dk, C], already in the logits' dtype (``_operands``)."""
    if DOT_F32:
        s = tl.dot(q.to(tl.float32), kct, input_precision="ieee")
    elif KC_SPLIT:
        s = tl.dot(q16, kct)
    else:
        s = tl.dot(q, kct)
    return s


@triton.jit
def _dq_tile(
    dq,
    q,
    q16,
    do,
    lse2,
    gate,
    dd,
    t,  # [BLOCK_M] positions of the rows
    KL,
    KQ,
    VC,
    c_row,
    c0,
    n_vis,
    qk_scale,
    HKV: tl.constexpr,
    L_CMP: tl.constexpr,
    D_STRIDE: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_F32: tl.constexpr,
    KC_SPLIT: tl.constexpr,
    BLOCK_C: tl.constexpr,
    MASKED: tl.constexpr,  # False: every row sees every block of the tile
):
    """dq += ds·k̃ over compressed blocks c0 .. c0 + BLOCK_C."""
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    c = c0 + tl.arange(0, BLOCK_C)
    crow = c_row + c * HKV
    if MASKED:
        cin = c < n_vis
        kmask = cin[None, :] & (offs_dk[:, None] < DK)
        vmask = cin[None, :] & (offs_dv[:, None] < DV)
    else:
        kmask = offs_dk[:, None] < DK
        vmask = offs_dv[:, None] < DV
    kct = tl.load(KL + crow[None, :] * DK + offs_dk[:, None], mask=kmask, other=0.0)
    vct = tl.load(VC + crow[None, :] * DV + offs_dv[:, None], mask=vmask, other=0.0)  # do's dtype
    s = _logits(q, q16, kct, DOT_F32, KC_SPLIT) * qk_scale
    if MASKED:
        vis = cin[None, :] & (c[None, :] * D_STRIDE + (L_CMP - 1) <= t[:, None])
        p = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0)
    else:
        p = tl.exp2(s - lse2[:, None])
    dp = mma(do, vct, DOT_F32)
    ds = p * gate[:, None] * (dp - dd[:, None])
    kq = tl.load(KQ + crow[:, None] * DK + offs_dk[None, :], mask=tl.trans(kmask), other=0.0)
    return dq + mma(ds.to(q.dtype), kq, DOT_F32)  # kq: [BLOCK_C, BLOCK_DK] in q's dtype


# restore_value: tuning runs the kernel repeatedly, and each run adds into DQ again
@triton.autotune(
    configs=_configs(),
    key=["T", "G", "BLOCK_DK", "BLOCK_DV", "KC_SPLIT", "ACC", "OUT_CAST"],
    restore_value=["DQ"],
)
@triton.jit
def nsa_compressed_bwd_dq_kernel(
    Q,  # [B, T, Hq, Dk]
    KL,  # [B, Tc, Hkv, Dk] k̃ in the logits' dtype (``_operands``)
    KQ,  # [B, Tc, Hkv, Dk] k̃ in q's dtype (fp32 under DOT_F32), for ds·k̃
    VC,  # [B, Tc, Hkv, Dv] ṽ in dout's dtype (fp32 under DOT_F32)
    DO,  # [B, T, Hq, Dv]
    LSE,  # [B, T, Hq] fp32 lse_cmp
    DD,  # [B, T, Hq, 3] fp32
    GATES,  # [B, T, Hq, 3]
    DQ,  # [B, T, Hq, Dk] fp32 (ACC: add into it)
    DQO,  # OUT_CAST: [B, T, Hq, Dk] in any float dtype, written instead of DQ (the final dq)
    T,
    TC,
    qk_scale,
    sm_scale,
    HKV: tl.constexpr,
    G: tl.constexpr,
    L_CMP: tl.constexpr,
    D_STRIDE: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    ACC: tl.constexpr,
    DOT_F32: tl.constexpr,
    KC_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    OUT_CAST: tl.constexpr = False,
):
    BLOCK_T: tl.constexpr = BLOCK_M // G
    HQ: tl.constexpr = HKV * G
    # late (heavy) position blocks first, as in the forward
    pid_t = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = (pid_bg // HKV).to(tl.int64)
    g = pid_bg % HKV
    t0 = pid_t * BLOCK_T
    rows = tl.arange(0, BLOCK_M)
    t = t0 + rows // G
    h = g * G + rows % G
    row_ok = t < T
    ridx = (b * T + t) * HQ + h
    offs_dk = tl.arange(0, BLOCK_DK)
    qmask = row_ok[:, None] & (offs_dk[None, :] < DK)
    q, do = load_rows(Q, DO, ridx, row_ok, DK, DV, BLOCK_DK, BLOCK_DV, DOT_F32)
    q16 = q.to(tl.float16)
    lse2, gate, dd = row_stats(LSE, DD, GATES, ridx, row_ok, 0)
    t_last = tl.minimum(t0 + BLOCK_T - 1, T - 1)
    num = t_last + 1 - L_CMP
    n_vis = tl.minimum(tl.where(num >= 0, num // D_STRIDE + 1, 0), TC)
    c_row = b * TC * HKV + g  # row of (b, block 0, g) in [B, Tc, Hkv, ·]
    # Blocks visible to the first row are visible to every row: whole tiles of them run
    # without the causal mask (as the forward's v2); only the causal edge pays for it. Rows
    # past T have gate 0, so their ds is 0 there too.
    num0 = t0 + 1 - L_CMP
    n_all = tl.minimum(tl.where(num0 >= 0, num0 // D_STRIDE + 1, 0), TC)
    c_split = (n_all // BLOCK_C) * BLOCK_C
    dq = tl.zeros([BLOCK_M, BLOCK_DK], tl.float32)
    for c0 in range(0, c_split, BLOCK_C):
        dq = _dq_tile(
            dq, q, q16, do, lse2, gate, dd, t, KL, KQ, VC, c_row, c0, n_vis, qk_scale,
            HKV, L_CMP, D_STRIDE, DK, DV, BLOCK_DK, BLOCK_DV, DOT_F32, KC_SPLIT, BLOCK_C, False,
        )  # fmt: skip
    for c0 in range(c_split, n_vis, BLOCK_C):
        dq = _dq_tile(
            dq, q, q16, do, lse2, gate, dd, t, KL, KQ, VC, c_row, c0, n_vis, qk_scale,
            HKV, L_CMP, D_STRIDE, DK, DV, BLOCK_DK, BLOCK_DV, DOT_F32, KC_SPLIT, BLOCK_C, True,
        )  # fmt: skip
    dq = dq * sm_scale
    dq_ptr = DQ + ridx[:, None] * DK + offs_dk[None, :]
    if ACC:
        dq += tl.load(dq_ptr, mask=qmask, other=0.0)
    if OUT_CAST:  # the last branch to add: the finished gradient, with no conversion pass
        tl.store(
            DQO + ridx[:, None] * DK + offs_dk[None, :], dq.to(DQO.dtype.element_ty), mask=qmask
        )
    else:
        tl.store(dq_ptr, dq, mask=qmask)


@triton.jit
def _dkdv_tile(
    dkc,  # [BLOCK_DK, BLOCK_C] dk̃ᵀ accumulator
    dvc,  # [BLOCK_C, BLOCK_DV]
    kct,
    vc,
    Q,
    DO,
    LSE,
    DD,
    GATES,
    b,
    g,
    t0,
    seg_hi,
    c,
    cin,
    T,
    qk_scale,
    HQ: tl.constexpr,
    G: tl.constexpr,
    L_CMP: tl.constexpr,
    D_STRIDE: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_F32: tl.constexpr,
    KC_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,  # False: rows all in the segment, all seeing every real block
):
    """One query tile's contribution (positions t0 .. t0 + BLOCK_M/G, G heads)."""
    rows = tl.arange(0, BLOCK_M)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    t = t0 + rows // G
    h = g * G + rows % G
    row_ok = t < seg_hi
    ridx = (b * T + t) * HQ + h
    if MASKED:
        qmask = row_ok[:, None] & (offs_dk[None, :] < DK)
        omask = row_ok[:, None] & (offs_dv[None, :] < DV)
    else:
        qmask = offs_dk[None, :] < DK
        omask = offs_dv[None, :] < DV
    q = tl.load(Q + ridx[:, None] * DK + offs_dk[None, :], mask=qmask, other=0.0)
    do = tl.load(DO + ridx[:, None] * DV + offs_dv[None, :], mask=omask, other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse2, gate, dd = row_stats(LSE, DD, GATES, ridx, row_ok, 0)
    s = _logits(q, q.to(tl.float16), kct, DOT_F32, KC_SPLIT) * qk_scale  # [BLOCK_M, C]
    if MASKED:
        vis = row_ok[:, None] & cin[None, :] & (c[None, :] * D_STRIDE + (L_CMP - 1) <= t[:, None])
        pg = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0) * gate[:, None]  # g·p
    else:
        pg = tl.exp2(s - lse2[:, None]) * gate[:, None]
    dvc += mma(tl.trans(pg).to(do.dtype), do, DOT_F32)
    dp = mma(do, tl.trans(vc), DOT_F32)  # [BLOCK_M, BLOCK_C]; vc in do's dtype (_operands)
    ds = pg * (dp - dd[:, None])
    dkc += mma(tl.trans(q), ds.to(q.dtype), DOT_F32)  # [BLOCK_DK, BLOCK_C]
    return dkc, dvc


@triton.autotune(configs=_configs(), key=["T", "G", "BLOCK_DK", "BLOCK_DV", "KC_SPLIT"])
@triton.jit
def nsa_compressed_bwd_dkdv_kernel(
    Q,  # [B, T, Hq, Dk]
    KL,  # [B, Tc, Hkv, Dk] k̃ in the logits' dtype (``_operands``)
    VC,  # [B, Tc, Hkv, Dv] ṽ in dout's dtype (fp32 under DOT_F32)
    DO,  # [B, T, Hq, Dv]
    LSE,  # [B, T, Hq] fp32 lse_cmp
    DD,  # [B, T, Hq, 3] fp32
    GATES,  # [B, T, Hq, 3]
    DKC,  # [S, B, Tc, Hkv, Dk] fp32 out: per-segment partial sums
    DVC,  # [S, B, Tc, Hkv, Dv] fp32 out
    T,
    TC,
    SEG,  # query positions per segment
    qk_scale,
    sm_scale,
    HKV: tl.constexpr,
    G: tl.constexpr,
    L_CMP: tl.constexpr,
    D_STRIDE: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_F32: tl.constexpr,
    KC_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    BLOCK_T: tl.constexpr = BLOCK_M // G
    HQ: tl.constexpr = HKV * G
    pid_c = tl.program_id(0)  # early blocks (seen by the most queries) launch first
    pid_s = tl.program_id(1)
    pid_bg = tl.program_id(2)
    b = (pid_bg // HKV).to(tl.int64)
    g = pid_bg % HKV
    c0 = pid_c * BLOCK_C
    c = c0 + tl.arange(0, BLOCK_C)
    cin = c < TC
    crow = b * TC * HKV + c * HKV + g  # [BLOCK_C] row in [B, Tc, Hkv, ·]
    # row of the same block in this segment's slice of the [S, B, Tc, Hkv, ·] outputs
    orow = pid_s.to(tl.int64) * (tl.num_programs(2) // HKV) * TC * HKV + crow
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    kmask = cin[None, :] & (offs_dk[:, None] < DK)
    vmask = cin[:, None] & (offs_dv[None, :] < DV)
    kct = tl.load(KL + crow[None, :] * DK + offs_dk[:, None], mask=kmask, other=0.0)
    vc = tl.load(VC + crow[:, None] * DV + offs_dv[None, :], mask=vmask, other=0.0)
    dkc = tl.zeros([BLOCK_DK, BLOCK_C], tl.float32)  # dk̃ᵀ
    dvc = tl.zeros([BLOCK_C, BLOCK_DV], tl.float32)
    seg_lo = pid_s * SEG
    seg_hi = tl.minimum(seg_lo + SEG, T)
    # Query tiles from the first query that sees block c0 (empty range: the partial stays
    # 0). Tiles whose rows all lie in the segment and all see every real block of the tile
    # (from the last one's first viewer on) run without masks; the rest are masked. Columns
    # past Tc get p ≠ 0 there, but they only reach dk̃, dṽ columns that are never stored.
    t_begin = tl.maximum(seg_lo, c0 * D_STRIDE + L_CMP - 1)
    c_last = tl.minimum(c0 + BLOCK_C, TC) - 1
    n_head = tl.cdiv(tl.maximum(c_last * D_STRIDE + L_CMP - 1 - t_begin, 0), BLOCK_T)
    t_mid = t_begin + n_head * BLOCK_T
    t_tail = t_mid + tl.maximum(seg_hi - t_mid, 0) // BLOCK_T * BLOCK_T
    for t0 in range(t_begin, tl.minimum(t_mid, seg_hi), BLOCK_T):
        dkc, dvc = _dkdv_tile(
            dkc, dvc, kct, vc, Q, DO, LSE, DD, GATES, b, g, t0, seg_hi, c, cin, T, qk_scale,
            HQ, G, L_CMP, D_STRIDE, DK, DV, BLOCK_DK, BLOCK_DV, DOT_F32, KC_SPLIT, BLOCK_M, True,
        )  # fmt: skip
    for t0 in range(t_mid, t_tail, BLOCK_T):
        dkc, dvc = _dkdv_tile(
            dkc, dvc, kct, vc, Q, DO, LSE, DD, GATES, b, g, t0, seg_hi, c, cin, T, qk_scale,
            HQ, G, L_CMP, D_STRIDE, DK, DV, BLOCK_DK, BLOCK_DV, DOT_F32, KC_SPLIT, BLOCK_M, False,
        )  # fmt: skip
    for t0 in range(t_tail, seg_hi, BLOCK_T):
        dkc, dvc = _dkdv_tile(
            dkc, dvc, kct, vc, Q, DO, LSE, DD, GATES, b, g, t0, seg_hi, c, cin, T, qk_scale,
            HQ, G, L_CMP, D_STRIDE, DK, DV, BLOCK_DK, BLOCK_DV, DOT_F32, KC_SPLIT, BLOCK_M, True,
        )  # fmt: skip
    tl.store(DKC + orow[None, :] * DK + offs_dk[:, None], dkc * sm_scale, mask=kmask)
    tl.store(DVC + orow[:, None] * DV + offs_dv[None, :], dvc, mask=vmask)


def _operands(
    q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, dout: torch.Tensor, kc_split: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k̃ for the logits, k̃ for ds·k̃, ṽ for dout·ṽᵀ: each in its dot's operand dtype.

    The logits' k̃ is fp16 when the forward split k̃ (its hi part), else q's dtype; ds·k̃
    takes q's dtype; fp32 throughout for fp32 inputs (DOT_F32). [B, Tc, Hkv, ·], a few MiB.
    """
    if dot_f32(q.dtype):
        kf = kc.float().contiguous()
        return kf, kf, vc.float().contiguous()
    kq = kc.to(q.dtype).contiguous()
    kl = kc.to(torch.float16).contiguous() if kc_split else kq
    return kl, kq, vc.to(dout.dtype).contiguous()


def compressed_bwd_triton(
    q: torch.Tensor,
    kc: torch.Tensor,
    vc: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    dd: torch.Tensor,
    gates: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
    kc_split: bool,
    *,
    dq: torch.Tensor | None,
    dkc: torch.Tensor | None,
    dvc: torch.Tensor | None,
    dq_acc: bool = True,
    dq_out: torch.Tensor | None = None,
    alloc: object = torch.empty,
) -> None:
    """Compressed-branch gradients into fp32 buffers (all tensors contiguous, Tc ≥ 1).

    kc: fp32 k̃ [B,Tc,Hkv,Dk]; kc_split: the forward used fp16 hi + lo parts of it (see
    ``attention._compressed_dtype``). dq [B,T,Hq,Dk] is added to (dq_acc) or overwritten;
    dkc/dvc [B,Tc,Hkv,·] are overwritten. A None buffer skips its kernel. dq_out (q's shape,
    any float dtype): the finished dq is written there instead, and dq is left as it was.
    """
    b, t, hq, dk_dim = q.shape
    tc, hkv, dv_dim = kc.shape[1], kc.shape[2], vc.shape[3]
    g = hq // hkv
    kl, kq, vq = _operands(q, kc, vc, dout, kc_split)
    common = {
        "HKV": hkv,
        "G": g,
        "L_CMP": cfg.cmp_block,
        "D_STRIDE": cfg.cmp_stride,
        "DK": dk_dim,
        "DV": dv_dim,
        "BLOCK_DK": pow2(dk_dim),
        "BLOCK_DV": pow2(dv_dim),
        "DOT_F32": dot_f32(q.dtype),
        "KC_SPLIT": kc_split and not dot_f32(q.dtype),
    }
    if dq is not None:

        def grid_q(meta: dict[str, int]) -> tuple[int, int]:
            return (triton.cdiv(t, meta["BLOCK_M"] // g), b * hkv)

        nsa_compressed_bwd_dq_kernel[grid_q](
            q,
            kl,
            kq,
            vq,
            dout,
            lse,
            dd,
            gates,
            dq,
            dq if dq_out is None else dq_out,
            t,
            tc,
            scale * LOG2E,
            scale,
            ACC=dq_acc,
            OUT_CAST=dq_out is not None,
            **common,
        )
    if dkc is not None and dvc is not None:
        seg = max(1, SEG_ROWS // g)  # query positions per segment
        nseg = triton.cdiv(t, seg)
        if nseg == 1:  # write straight into the outputs
            part_k, part_v = dkc, dvc
        else:
            part_k = alloc((nseg, *dkc.shape), dtype=torch.float32, device=q.device)  # type: ignore[operator]
            part_v = alloc((nseg, *dvc.shape), dtype=torch.float32, device=q.device)  # type: ignore[operator]

        def grid_c(meta: dict[str, int]) -> tuple[int, int, int]:
            return (triton.cdiv(tc, meta["BLOCK_C"]), nseg, b * hkv)

        nsa_compressed_bwd_dkdv_kernel[grid_c](
            q,
            kl,
            vq,
            dout,
            lse,
            dd,
            gates,
            part_k,
            part_v,
            t,
            tc,
            seg,
            scale * LOG2E,
            scale,
            **common,
        )
        if nseg > 1:
            torch.sum(part_k, dim=0, out=dkc)
            torch.sum(part_v, dim=0, out=dvc)
