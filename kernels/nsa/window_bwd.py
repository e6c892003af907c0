"""Sliding-window branch backward (Triton): FlashAttention-2-style recompute from lse_win.

Two kernels, no atomics (so the result is deterministic):

* ``nsa_window_bwd_dq_kernel``: the forward's layout (BLOCK_T positions × the G heads of one
  KV head per program, rows position-major), looping over the key band
  [t0 − w + 1, t0 + BLOCK_T); accumulates dq in registers and adds it into the fp32 dq buffer.
* ``nsa_window_bwd_dkdv_kernel``: one program per BLOCK_N keys × (batch, KV head), looping over
  the queries that see them, t ∈ [n0, n0 + BLOCK_N − 1 + w), all G heads at once, so the GQA
  sum over the group happens in registers and each dk/dv row is written by one program.

See ``_bwd_common`` for the gradient formulas and the per-row statistics.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.nsa._bwd_common import LOG2E, load_rows, row_stats
from kernels.nsa._triton_common import autotune_configs, dot_f32, interpreting, mma, pow2


def _configs(dq: bool) -> list[triton.Config]:
    if interpreting():
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=1)]
    # First = default, the measured best on one H200 at 64k, paper config: dk/dv 64 x 64
    # tiles, 4 warps, 2 stages (2026-12-01); dq 128 x 32 with 8 warps (sweep_nsa.py,
    # 2026-12-02: 0.938 / 0.951 of 64 x 64's time at 64k / 16k). The rest for NSA_AUTOTUNE=1.
    tiles = [(64, 64, 4, 2), (128, 64, 8, 2), (64, 128, 8, 2), (64, 64, 4, 3), (64, 64, 8, 2)]
    if dq:
        tiles.insert(0, (128, 32, 8, 2))
    return autotune_configs(
        [
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bm, bn, w, st in tiles
        ]
    )


# restore_value: tuning runs the kernel repeatedly, and with ACC each run adds into DQ again
@triton.autotune(
    configs=_configs(dq=True),
    key=["T", "G", "W", "BLOCK_DK", "BLOCK_DV", "ACC"],
    restore_value=["DQ"],
)
@triton.jit
def nsa_window_bwd_dq_kernel(
    Q,  # [B, T, Hq, Dk]
    K,  # [B, T, Hkv, Dk]
    V,  # [B, T, Hkv, Dv]
    DO,  # [B, T, Hq, Dv] upstream gradient
    LSE,  # [B, T, Hq] fp32 lse_win
    DD,  # [B, T, Hq, 3] fp32 rowsum(dout · o_j)
    GATES,  # [B, T, Hq, 3]
    DQ,  # [B, T, Hq, Dk] fp32 (ACC: add into it, else overwrite)
    T,
    qk_scale,  # scale · log2(e)
    sm_scale,
    W: tl.constexpr,
    HKV: tl.constexpr,
    G: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    ACC: tl.constexpr,
    DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    BLOCK_T: tl.constexpr = BLOCK_M // G
    HQ: tl.constexpr = HKV * G
    pid_t = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = (pid_bg // HKV).to(tl.int64)
    g = pid_bg % HKV
    t0 = pid_t * BLOCK_T
    rows = tl.arange(0, BLOCK_M)
    t = t0 + rows // G  # [BLOCK_M]
    h = g * G + rows % G
    row_ok = t < T
    ridx = (b * T + t) * HQ + h  # [BLOCK_M] int64 row index into [B, T, Hq, ·]
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    qmask = row_ok[:, None] & (offs_dk[None, :] < DK)
    q, do = load_rows(Q, DO, ridx, row_ok, DK, DV, BLOCK_DK, BLOCK_DV, DOT_F32)
    lse2, gate, dd = row_stats(LSE, DD, GATES, ridx, row_ok, 2)
    kv_row = b * T * HKV + g  # row of (b, key 0, g) in [B, T, Hkv, ·]
    lo = tl.maximum(t0 - W + 1, 0)
    hi = tl.minimum(t0 + BLOCK_T, T)
    dq = tl.zeros([BLOCK_M, BLOCK_DK], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        kpos = n0 + tl.arange(0, BLOCK_N)
        kin = kpos < hi
        krow = kv_row + kpos * HKV  # [BLOCK_N]
        kt = tl.load(
            K + krow[None, :] * DK + offs_dk[:, None],
            mask=kin[None, :] & (offs_dk[:, None] < DK),
            other=0.0,
        )  # [BLOCK_DK, BLOCK_N]
        vt = tl.load(
            V + krow[None, :] * DV + offs_dv[:, None],
            mask=kin[None, :] & (offs_dv[:, None] < DV),
            other=0.0,
        )  # [BLOCK_DV, BLOCK_N]
        if DOT_F32:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        s = mma(q, kt, DOT_F32) * qk_scale
        vis = kin[None, :] & (kpos[None, :] <= t[:, None]) & (kpos[None, :] > t[:, None] - W)
        p = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0)  # [BLOCK_M, BLOCK_N]
        dp = mma(do, vt, DOT_F32)
        ds = p * gate[:, None] * (dp - dd[:, None])
        dq += mma(ds.to(kt.dtype), tl.trans(kt), DOT_F32)
    dq = dq * sm_scale
    dq_ptr = DQ + ridx[:, None] * DK + offs_dk[None, :]
    if ACC:
        dq += tl.load(dq_ptr, mask=qmask, other=0.0)
    tl.store(dq_ptr, dq, mask=qmask)


@triton.autotune(configs=_configs(dq=False), key=["T", "G", "W", "BLOCK_DK", "BLOCK_DV"])
@triton.jit
def nsa_window_bwd_dkdv_kernel(
    Q,  # [B, T, Hq, Dk]
    K,  # [B, T, Hkv, Dk]
    V,  # [B, T, Hkv, Dv]
    DO,  # [B, T, Hq, Dv]
    LSE,  # [B, T, Hq] fp32 lse_win
    DD,  # [B, T, Hq, 3] fp32
    GATES,  # [B, T, Hq, 3]
    DKO,  # [B, T, Hkv, Dk] fp32 out (overwritten: the first writer of dk)
    DVO,  # [B, T, Hkv, Dv] fp32 out
    T,
    qk_scale,
    sm_scale,
    W: tl.constexpr,
    HKV: tl.constexpr,
    G: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    BLOCK_T: tl.constexpr = BLOCK_M // G
    HQ: tl.constexpr = HKV * G
    pid_n = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = (pid_bg // HKV).to(tl.int64)
    g = pid_bg % HKV
    n0 = pid_n * BLOCK_N
    kpos = n0 + tl.arange(0, BLOCK_N)
    kin = kpos < T
    krow = b * T * HKV + kpos * HKV + g  # [BLOCK_N]
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    kmask = kin[:, None] & (offs_dk[None, :] < DK)
    vmask = kin[:, None] & (offs_dv[None, :] < DV)
    k = tl.load(K + krow[:, None] * DK + offs_dk[None, :], mask=kmask, other=0.0)
    v = tl.load(V + krow[:, None] * DV + offs_dv[None, :], mask=vmask, other=0.0)
    if DOT_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_DK], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    rows = tl.arange(0, BLOCK_M)
    # queries that see any of these keys: n0 ≤ t ≤ n0 + BLOCK_N − 1 + W − 1
    t_hi = tl.minimum(n0 + BLOCK_N - 1 + W, T)
    for t0 in range(n0, t_hi, BLOCK_T):
        t = t0 + rows // G
        h = g * G + rows % G
        row_ok = t < t_hi
        ridx = (b * T + t) * HQ + h
        q = tl.load(
            Q + ridx[:, None] * DK + offs_dk[None, :],
            mask=row_ok[:, None] & (offs_dk[None, :] < DK),
            other=0.0,
        )  # [BLOCK_M, BLOCK_DK]
        do = tl.load(
            DO + ridx[:, None] * DV + offs_dv[None, :],
            mask=row_ok[:, None] & (offs_dv[None, :] < DV),
            other=0.0,
        )  # [BLOCK_M, BLOCK_DV]
        if DOT_F32:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        lse2, gate, dd = row_stats(LSE, DD, GATES, ridx, row_ok, 2)
        st = mma(k, tl.trans(q), DOT_F32) * qk_scale  # [BLOCK_N, BLOCK_M]
        vis = (
            kin[:, None]
            & row_ok[None, :]
            & (kpos[:, None] <= t[None, :])
            & (kpos[:, None] > t[None, :] - W)
        )
        pt = tl.where(vis, tl.exp2(st - lse2[None, :]), 0.0) * gate[None, :]  # g·pᵀ
        dv += mma(pt.to(do.dtype), do, DOT_F32)
        dpt = mma(v, tl.trans(do), DOT_F32)  # [BLOCK_N, BLOCK_M]
        dst = pt * (dpt - dd[None, :])
        dk += mma(dst.to(q.dtype), q, DOT_F32)
    tl.store(DKO + krow[:, None] * DK + offs_dk[None, :], dk * sm_scale, mask=kmask)
    tl.store(DVO + krow[:, None] * DV + offs_dv[None, :], dv, mask=vmask)


def window_bwd_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    dd: torch.Tensor,
    gates: torch.Tensor,
    window: int,
    scale: float,
    *,
    dq: torch.Tensor | None,
    dk: torch.Tensor | None,
    dv: torch.Tensor | None,
    dq_acc: bool = False,
) -> None:
    """Window-branch gradients, written into the given fp32 buffers (all tensors contiguous).

    dq [B,T,Hq,Dk] (overwritten, or added to with dq_acc), dk [B,T,Hkv,Dk] and dv
    [B,T,Hkv,Dv] (overwritten: every key has at least its own position as a query). A None
    buffer skips its kernel (dk and dv come from one kernel: both or neither).
    """
    b, t, hq, dk_dim = q.shape
    hkv, dv_dim = k.shape[2], v.shape[3]
    g = hq // hkv
    common = {
        "W": window,
        "HKV": hkv,
        "G": g,
        "DK": dk_dim,
        "DV": dv_dim,
        "BLOCK_DK": pow2(dk_dim),
        "BLOCK_DV": pow2(dv_dim),
        "DOT_F32": dot_f32(q.dtype),
    }
    args = (q, k, v, dout, lse, dd, gates)
    if dq is not None:

        def grid_q(meta: dict[str, int]) -> tuple[int, int]:
            return (triton.cdiv(t, meta["BLOCK_M"] // g), b * hkv)

        nsa_window_bwd_dq_kernel[grid_q](*args, dq, t, scale * LOG2E, scale, ACC=dq_acc, **common)
    if dk is not None and dv is not None:

        def grid_k(meta: dict[str, int]) -> tuple[int, int]:
            return (triton.cdiv(t, meta["BLOCK_N"]), b * hkv)

        nsa_window_bwd_dkdv_kernel[grid_k](*args, dk, dv, t, scale * LOG2E, scale, **common)
