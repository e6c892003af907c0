"""Selection branch backward (Triton): recompute from lse_slc over the forward's own indices.

* ``nsa_selection_bwd_dq_kernel``: R = max(1, 16/G) consecutive query positions × the G
  heads of one KV head per program (≥ 16 rows without padding), looping over the union of
  their chosen blocks (``selection.union_blocks``), each row masked to its own n blocks.
  With ``FROM_DS`` it reads each pair's dS back instead of recomputing P and dP (see below).
* ``nsa_selection_bwd_dkdv_kernel``: one program per (key block j, chunk of the queries that
  chose j), all G heads at once. The block → queries map is the transpose of block_indices,
  built on the device by ``reverse_map`` (one stable sort, no host sync).

Why a reverse map and not atomics from the dq programs: scattering dk/dv from each (t, KV
head) program would issue T·Hkv·n·l′·(Dk + Dv) fp32 atomic adds (≈ 7e10 at 64k, paper
config), and every query adds into the forced blocks (block 0, the local ones), so those
addresses would serialise. With the reverse map a program reduces a whole chunk of queries
in registers first. Chunks keep the work per program bounded (block 0 is chosen by all T
queries, a random block by ≈ T·n/Ts), and a block split over several chunks sums its
partial dk/dv with one atomic add per element and chunk: ≈ (T·n/CHUNK + Ts)·l′·(Dk + Dv)
adds per (batch, KV head), ≈ 6e8 in all at 64k (CHUNK = 128 positions for G = 16): ≈ 100×
fewer. The atomics make dk/dv's last bits depend on the chunk order (fp32 addition); the dq
kernel and the other branches are deterministic.

Fused dq (``dq_path="fused"``; the "selection_dq" variant ``fused``, the default from run 50,
31.9 ms against 36.1-37.1 for the two kernels at 64k, to run 53): the dk/dv programs already
hold each (query row, chosen block) pair's dS, so dq = dS·K·scale costs them one more dot and
an atomic add per row and block (T·Hq·n·Dk adds, ≈ 8.6e9 at 64k, paper config: spread over
distinct addresses, unlike the dk/dv scatter above), and the dq kernel, which recomputes P and
dP over the same pairs, is not run. dq's last bits then depend on the order of the adds.

Stored dS (``dq_path="ds"``; the "selection_dq" variant ``ds``, the default since runs 53
and 54 measured it: 27.9-29.2 ms against the fused 31.8-33.3 at 64k): the dk/dv kernel stores
each pair's dS, in the dtype its dots use (bf16 for bf16 inputs, so dq is the same sum of the
same products as the fused path's), into a [B, T, Hq, n, l′] buffer, and the dq kernel
(``FROM_DS``) forms dq = Σ_slots dS·K per (position, KV head) without atomics: one dot per
pair instead of the dq kernel's three, no P or dP to recompute, and no 8.6e9 atomic adds; the
price is the buffer (T·Hq·n·l′ values: 8.6 GB at 64k, paper config, bf16), written once and
read once. Above ``DS_MAX_BYTES``, or when the buffer cannot be allocated, the fused path runs
instead. Its dq programs hold one position's G heads (no R-position union), so for G < 16
they pad their rows to 16 and walk every slot, empty ones included. That dq kernel is the
same function under its own autotuner (``nsa_selection_bwd_dq_from_ds_kernel``): its best
launch config differs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from kernels.nsa._bwd_common import LOG2E, load_rows, row_stats
from kernels.nsa._triton_common import autotune_configs, dot_f32, interpreting, mma, pow2
from kernels.nsa.config import NSAConfig
from kernels.nsa.selection import union_blocks

# Query rows (positions × G heads) per dk/dv program: bounds the tail of the grid (block 0
# has T·G rows) while keeping the atomic adds per element few (≈ rows chosen / CHUNK_ROWS).
CHUNK_ROWS = 2048
# The stored-dS path's buffer cap: 16 GiB holds T = 64k at the paper config in bf16 (8.6 GB)
# beside the forward's tensors on an 80-141 GB GPU; longer sequences take the fused path.
DS_MAX_BYTES = 16 << 30
DQ_PATHS = ("separate", "fused", "ds")


def _dq_configs() -> list[triton.Config]:
    if interpreting():  # KSPLIT as on the GPU, so the CPU tests run the default's key tiles
        return [triton.Config({"NUM_STAGES": 1, "KSPLIT": 2}, num_warps=4, num_stages=1)]
    # As the forward's selection v2: the loop's depth is NUM_STAGES (tl.range), num_stages
    # the prologue's. First = default, the measured best on one H200, paper config: half-block
    # key tiles (KSPLIT 2), one warp, 2 stages (run 40, 2026-12-03: 0.871 / 0.876 of whole
    # blocks with 2 warps at 16k / 64k; whole blocks with one warp had taken 1.5x).
    return autotune_configs(
        [
            triton.Config({"NUM_STAGES": s, "KSPLIT": ks}, num_warps=w, num_stages=s)
            for ks, w, s in ((2, 1, 2), (1, 2, 2), (1, 4, 2), (2, 1, 3), (1, 4, 3), (1, 2, 3))
        ]
    )


def _ds_dq_configs() -> list[triton.Config]:
    # The same kernel reading a stored dS: one dot per tile and no softmax, so whole-block key
    # tiles win. First = default: whole blocks, 2 warps, 2 stages (run 53, 2026-12-03, one
    # H200, paper config: selection dq+dk+dv 6.75-6.78 / 27.72-27.78 ms at 16k / 64k; the next
    # three within 1 % of it, the recomputing kernel's config, last, 7.11 / 28.93).
    if interpreting():
        return [triton.Config({"NUM_STAGES": 1, "KSPLIT": 1}, num_warps=4, num_stages=1)]
    return autotune_configs(
        [
            triton.Config({"NUM_STAGES": s, "KSPLIT": ks}, num_warps=w, num_stages=s)
            for ks, w, s in ((1, 2, 2), (1, 1, 1), (1, 2, 3), (4, 1, 6), (2, 1, 2))
        ]
    )


def _kv_configs() -> list[triton.Config]:
    if interpreting():
        return [triton.Config({"BLOCK_M": 32}, num_warps=4, num_stages=1)]
    # First = default: tuned over all of them on one H200 at 64k, paper config (2026-12-01).
    return autotune_configs(
        [
            triton.Config({"BLOCK_M": bm}, num_warps=w, num_stages=s)
            for bm, w, s in ((32, 4, 2), (64, 8, 2), (128, 8, 2), (64, 4, 2), (64, 8, 3))
        ]
    )


# restore_value: tuning runs the kernel repeatedly, and each run adds into DQ again
@triton.autotune(
    configs=_dq_configs(),
    key=["T", "G", "BLOCK_DK", "BLOCK_DV", "N_SEL", "ACC"],  # FROM_DS: its own tuner below
    restore_value=["DQ"],
)
@triton.jit
def nsa_selection_bwd_dq_kernel(
    Q,  # [B, T, Hq, Dk]
    K,  # [B, T, Hkv, Dk]
    V,  # [B, T, Hkv, Dv]
    IDX,  # [B, T, Hkv, n] int32, −1 = empty
    UNI,  # R > 1: [B, ⌈T/R⌉, Hkv, R·n] int32 union of the R positions' blocks, −1 padded
    CNT,  # R > 1: [B, ⌈T/R⌉, Hkv] int32 number of valid union entries
    DO,  # [B, T, Hq, Dv]
    LSE,  # [B, T, Hq] fp32 lse_slc
    DD,  # [B, T, Hq, 3] fp32
    GATES,  # [B, T, Hq, 3]
    DQ,  # [B, T, Hq, Dk] fp32 (ACC: add into it)
    DS,  # FROM_DS: [B, T, Hq, n, l′] each (row, slot, key)'s dS, stored by the dk/dv kernel
    T,
    qk_scale,
    sm_scale,
    HKV: tl.constexpr,
    G: tl.constexpr,
    R: tl.constexpr,  # consecutive positions per program (R·G rows; 1 with FROM_DS)
    L_SEL: tl.constexpr,
    N_SEL: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_M: tl.constexpr,  # pow2 ≥ max(16, R·G)
    BLOCK_N: tl.constexpr,  # pow2 ≥ n
    BLOCK_KF: tl.constexpr,  # pow2 ≥ l′ (≤ 128): a whole selected block's key tile
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    ACC: tl.constexpr,
    DOT_F32: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    KSPLIT: tl.constexpr = 1,  # key sub-tiles per block tile (kept ≥ 16 keys for tl.dot)
    FROM_DS: tl.constexpr = False,  # read dS back instead of recomputing P and dP
):
    BLOCK_K: tl.constexpr = BLOCK_KF // KSPLIT if BLOCK_KF // KSPLIT >= 16 else BLOCK_KF
    HQ: tl.constexpr = HKV * G
    N_SUB: tl.constexpr = (L_SEL + BLOCK_K - 1) // BLOCK_K  # key tiles per selected block
    pid_r = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = (pid_bg // HKV).to(tl.int64)
    g = pid_bg % HKV
    t0 = pid_r * R
    rows = tl.arange(0, BLOCK_M)
    t = t0 + rows // G  # [BLOCK_M] position-major rows, as the forward's v2/v3
    row_ok = (rows < R * G) & (t < T)
    ridx = (b * T + t) * HQ + g * G + rows % G
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    qmask = row_ok[:, None] & (offs_dk[None, :] < DK)
    if not FROM_DS:  # the softmax's inputs, to recompute P and dP per key tile
        q, do = load_rows(Q, DO, ridx, row_ok, DK, DV, BLOCK_DK, BLOCK_DV, DOT_F32)
        lse2, gate, dd = row_stats(LSE, DD, GATES, ridx, row_ok, 1)
    kv_row = b * T * HKV + g
    if R == 1:
        list_base = IDX + (b * T + t0) * HKV * N_SEL + g * N_SEL
        n_slots = N_SEL
    else:
        # each row's own list masks the union's blocks its position did not choose
        kk = tl.arange(0, BLOCK_N)
        own = tl.load(
            IDX + ((b * T + t) * HKV + g)[:, None] * N_SEL + kk[None, :],
            mask=row_ok[:, None] & (kk[None, :] < N_SEL),
            other=-1,
        )  # [BLOCK_M, BLOCK_N]
        urow = (b * tl.cdiv(T, R) + pid_r) * HKV + g
        list_base = UNI + urow * (R * N_SEL)
        n_slots = tl.load(CNT + urow)
    dq = tl.zeros([BLOCK_M, BLOCK_DK], tl.float32)
    u = tl.arange(0, BLOCK_K)
    # One flat, branch-free loop over (slot, key tile), as the forward's selection v2: the
    # pipeliner then issues later tiles' gathers ahead. An empty slot (−1) gives tok < 0: all
    # masked, its loads are skipped (a stored dS's slot too: never written) and its p is 0.
    for it in tl.range(0, n_slots * N_SUB, num_stages=NUM_STAGES):
        blk = tl.load(list_base + it // N_SUB)
        u0 = (it % N_SUB) * BLOCK_K
        tok = blk * L_SEL + u0 + u  # [BLOCK_K]
        kin = (u0 + u < L_SEL) & (tok >= 0) & (tok < T)
        krow = kv_row + tok * HKV
        kt = tl.load(
            K + krow[None, :] * DK + offs_dk[:, None],
            mask=kin[None, :] & (offs_dk[:, None] < DK),
            other=0.0,
        )  # [BLOCK_DK, BLOCK_K]
        if DOT_F32:
            kt = kt.to(tl.float32)
        if FROM_DS:  # R = 1: this slot's dS for the G rows, in the dots' dtype already
            ds_row = (ridx * N_SEL + it // N_SUB) * L_SEL + u0  # [BLOCK_M]
            ds = tl.load(
                DS + ds_row[:, None] + u[None, :], mask=row_ok[:, None] & kin[None, :], other=0.0
            )  # [BLOCK_M, BLOCK_K]
        else:
            vt = tl.load(
                V + krow[None, :] * DV + offs_dv[:, None],
                mask=kin[None, :] & (offs_dv[:, None] < DV),
                other=0.0,
            )  # [BLOCK_DV, BLOCK_K]
            if DOT_F32:
                vt = vt.to(tl.float32)
            if R > 1:  # noqa: SIM108 - constexpr branch
                chose = tl.max((own == blk).to(tl.int32), axis=1) > 0  # [BLOCK_M]
            else:
                chose = row_ok
            s = mma(q, kt, DOT_F32) * qk_scale
            vis = (chose & row_ok)[:, None] & kin[None, :] & (tok[None, :] <= t[:, None])
            p = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0)
            dp = mma(do, vt, DOT_F32)
            ds = p * gate[:, None] * (dp - dd[:, None])
        dq += mma(ds.to(kt.dtype), tl.trans(kt), DOT_F32)
    dq = dq * sm_scale
    dq_ptr = DQ + ridx[:, None] * DK + offs_dk[None, :]
    if ACC:
        dq += tl.load(dq_ptr, mask=qmask, other=0.0)
    tl.store(dq_ptr, dq, mask=qmask)


# The dq kernel with FROM_DS, tuned apart: its best launch config is not the recomputing one's.
nsa_selection_bwd_dq_from_ds_kernel = triton.autotune(
    configs=_ds_dq_configs(),
    key=["T", "G", "BLOCK_DK", "BLOCK_DV", "N_SEL", "ACC"],
    restore_value=["DQ"],
)(nsa_selection_bwd_dq_kernel.fn)


# restore_value: tuning runs the kernel repeatedly, and each run adds into DKO/DVO (DQ) again
@triton.autotune(
    configs=_kv_configs(),
    key=["T", "G", "BLOCK_DK", "BLOCK_DV", "CHUNK", "FUSE_DQ", "STORE_DS"],
    restore_value=["DKO", "DVO", "DQ"],
)
@triton.jit
def nsa_selection_bwd_dkdv_kernel(
    Q,  # [B, T, Hq, Dk]
    K,  # [B, T, Hkv, Dk]
    V,  # [B, T, Hkv, Dv]
    DO,  # [B, T, Hq, Dv]
    LSE,  # [B, T, Hq] fp32 lse_slc
    DD,  # [B, T, Hq, 3] fp32
    GATES,  # [B, T, Hq, 3]
    QPOS,  # [B·Hkv, T·n] int32: query positions grouped by chosen block (reverse map);
    # STORE_DS: entries t·n + slot instead (the slot locates the pair's dS)
    QOFF,  # [B·Hkv, Ts + 1] int32: start of block j's positions in its QPOS row
    CSTART,  # [B·Hkv, Ts + 1] int32: first chunk of block j; entry Ts = number of chunks
    DKO,  # [B, T, Hkv, Dk] fp32, atomically added to
    DVO,  # [B, T, Hkv, Dv] fp32, atomically added to
    DQ,  # FUSE_DQ: [B, T, Hq, Dk] fp32, atomically added to; STORE_DS: [B, T, Hq, n, l′] dS
    T,
    TS,
    qk_scale,
    sm_scale,
    HKV: tl.constexpr,
    G: tl.constexpr,
    L_SEL: tl.constexpr,
    N_SEL: tl.constexpr,
    CHUNK: tl.constexpr,  # query positions per program
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_TS: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_F32: tl.constexpr,
    FUSE_DQ: tl.constexpr,
    BLOCK_M: tl.constexpr,
    STORE_DS: tl.constexpr = False,
):
    BLOCK_P: tl.constexpr = BLOCK_M // G  # positions per row tile
    HQ: tl.constexpr = HKV * G
    w = tl.program_id(0)  # chunk number within this (batch, KV head)
    pid_bg = tl.program_id(1)
    b = (pid_bg // HKV).to(tl.int64)
    g = pid_bg % HKV
    map_row = pid_bg.to(tl.int64) * (TS + 1)
    total = tl.load(CSTART + map_row + TS)
    if w < total:  # the grid is an upper bound on the chunk count (no host sync)
        jj = tl.arange(0, BLOCK_TS)
        cs = tl.load(CSTART + map_row + jj, mask=jj < TS, other=2147483647)
        # block owning chunk w: the last j with cstart[j] ≤ w (blocks without queries have
        # cstart equal to the next block's, so they are never the last such j)
        j = tl.sum((cs <= w).to(tl.int32), 0) - 1
        e_lo = tl.load(QOFF + map_row + j)
        e_end = tl.load(QOFF + map_row + j + 1)
        e0 = e_lo + (w - tl.load(CSTART + map_row + j)) * CHUNK
        e1 = tl.minimum(e0 + CHUNK, e_end)
        qpos_row = QPOS + pid_bg.to(tl.int64) * T * N_SEL
        kv_row = b * T * HKV + g
        offs_dk = tl.arange(0, BLOCK_DK)
        offs_dv = tl.arange(0, BLOCK_DV)
        rows = tl.arange(0, BLOCK_M)
        u = tl.arange(0, BLOCK_K)
        for u0 in range(0, L_SEL, BLOCK_K):  # key sub-tiles of the block (one when l′ ≤ 128)
            tok = j * L_SEL + u0 + u
            kin = (u0 + u < L_SEL) & (tok < T)
            krow = kv_row + tok * HKV
            kmask = kin[:, None] & (offs_dk[None, :] < DK)
            vmask = kin[:, None] & (offs_dv[None, :] < DV)
            k = tl.load(K + krow[:, None] * DK + offs_dk[None, :], mask=kmask, other=0.0)
            v = tl.load(V + krow[:, None] * DV + offs_dv[None, :], mask=vmask, other=0.0)
            if DOT_F32:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            dk = tl.zeros([BLOCK_K, BLOCK_DK], tl.float32)
            dv = tl.zeros([BLOCK_K, BLOCK_DV], tl.float32)
            for e in range(e0, e1, BLOCK_P):
                ent = e + rows // G
                ok = ent < e1
                t = tl.load(qpos_row + ent, mask=ok, other=0)  # [BLOCK_M] query positions
                if STORE_DS:  # entries t·n + slot
                    slot = t % N_SEL
                    t = t // N_SEL
                ridx = (b * T + t) * HQ + g * G + rows % G
                q, do = load_rows(Q, DO, ridx, ok, DK, DV, BLOCK_DK, BLOCK_DV, DOT_F32)
                lse2, gate, dd = row_stats(LSE, DD, GATES, ridx, ok, 1)
                st = mma(k, tl.trans(q), DOT_F32) * qk_scale  # [BLOCK_K, BLOCK_M]
                vis = kin[:, None] & ok[None, :] & (tok[:, None] <= t[None, :])
                pt = tl.where(vis, tl.exp2(st - lse2[None, :]), 0.0) * gate[None, :]
                dv += mma(pt.to(do.dtype), do, DOT_F32)
                dpt = mma(v, tl.trans(do), DOT_F32)
                dst = (pt * (dpt - dd[None, :])).to(q.dtype)  # [BLOCK_K, BLOCK_M] dSᵀ
                dk += mma(dst, q, DOT_F32)
                if FUSE_DQ:  # this block's share of the rows' dq, added where it belongs
                    dq = mma(tl.trans(dst), k, DOT_F32) * sm_scale  # [BLOCK_M, BLOCK_DK]
                    dq_ptr = DQ + ridx[:, None] * DK + offs_dk[None, :]
                    qmask = ok[:, None] & (offs_dk[None, :] < DK)
                    tl.atomic_add(dq_ptr, dq, mask=qmask, sem="relaxed")
                if STORE_DS:  # this pair's dS, for the dq kernel that reads it back
                    ds_row = (ridx * N_SEL + slot) * L_SEL + u0  # [BLOCK_M]
                    tl.store(
                        DQ + ds_row[None, :] + u[:, None],
                        dst.to(DQ.dtype.element_ty),
                        mask=(u0 + u < L_SEL)[:, None] & ok[None, :],
                    )
            # relaxed: plain accumulation, nothing is read back before the kernel ends
            dk_ptr = DKO + krow[:, None] * DK + offs_dk[None, :]
            tl.atomic_add(dk_ptr, dk * sm_scale, mask=kmask, sem="relaxed")
            tl.atomic_add(
                DVO + krow[:, None] * DV + offs_dv[None, :], dv, mask=vmask, sem="relaxed"
            )


def reverse_map(
    idx: torch.Tensor, ts: int, chunk: int, entries: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Transpose block_indices into per-block query lists, on the device, without a sync.

    idx [B, T, Hkv, n] int32 (−1 empty) → (qpos [B·Hkv, T·n] int32: positions grouped by
    block, ascending within a block, empty slots last (entries: t·n + slot instead of t);
    qoff [B·Hkv, Ts+1] int32: start of block j's run; cstart [B·Hkv, Ts+1] int32: first chunk
    of block j, entry Ts = chunk count; max_chunks: a bound on the chunk count of any row, the
    kernel's grid size).
    """
    b, t, hkv, n = idx.shape
    x = idx.permute(0, 2, 1, 3).reshape(b * hkv, t * n)  # [BG, T·n], position-major
    key = torch.where(x < 0, ts, x).long()  # −1 → bucket Ts (never read)
    # A radix sort makes one pass per few bits of its key type: block numbers below 2^15 sort
    # as int16, a quarter of int64's passes, to the same stable order.
    narrow = torch.int16 if ts < 2**15 else torch.int32
    _, order = torch.sort(key.to(narrow), dim=-1, stable=True)  # stable: positions ascending
    qpos = (order if entries else order // n).to(torch.int32).contiguous()
    counts = torch.zeros((b * hkv, ts + 1), dtype=torch.int64, device=idx.device)
    counts.scatter_add_(1, key, torch.ones_like(key))
    qoff = (torch.cumsum(counts, dim=1) - counts).to(torch.int32).contiguous()
    nchunk = (counts[:, :ts] + chunk - 1) // chunk  # [BG, Ts]
    cstart = torch.zeros((b * hkv, ts + 1), dtype=torch.int64, device=idx.device)
    cstart[:, 1:] = torch.cumsum(nchunk, dim=1)
    # Σ_j ⌈c_j / chunk⌉ ≤ Σ_j (c_j / chunk + 1) ≤ T·n / chunk + Ts
    max_chunks = -(-t * n // chunk) + ts
    return qpos, qoff, cstart.to(torch.int32).contiguous(), max_chunks


def selection_bwd_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    idx: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    dd: torch.Tensor,
    gates: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
    *,
    dq: torch.Tensor | None,
    dk: torch.Tensor | None,
    dv: torch.Tensor | None,
    dq_acc: bool = True,
    dq_path: str = "separate",
    alloc: Callable[..., torch.Tensor] = torch.empty,
) -> None:
    """Selection-branch gradients (all tensors contiguous, idx [B,T,Hkv,n] int32).

    dq is added to (dq_acc) or overwritten; dk/dv must already hold valid values (the window
    branch writes them first): the kernel adds into them atomically. dq_path, when all three
    are wanted: "separate" (the dq kernel), "fused" (the dk/dv kernel adds dq) or "ds" (the
    dk/dv kernel stores dS, a dq kernel reads it back; "fused" above ``DS_MAX_BYTES`` or when
    the buffer cannot be allocated). alloc makes the dS buffer (the backward's allocator,
    which tests fill with NaN).
    """
    if dq_path not in DQ_PATHS:
        raise ValueError(f"unknown selection dq_path {dq_path!r}; choose one of {DQ_PATHS}")
    b, t, hq, dk_dim = q.shape
    hkv, dv_dim = k.shape[2], v.shape[3]
    g = hq // hkv
    n, lp = cfg.sel_count, cfg.sel_block
    block_k = min(pow2(lp), 128)
    dims = {
        "HKV": hkv,
        "G": g,
        "L_SEL": lp,
        "N_SEL": n,
        "DK": dk_dim,
        "DV": dv_dim,
        "BLOCK_DK": pow2(dk_dim),
        "BLOCK_DV": pow2(dv_dim),
        "DOT_F32": dot_f32(q.dtype),
    }
    path = dq_path if dq is not None and dk is not None and dv is not None else "separate"
    ds_dtype = torch.float32 if dims["DOT_F32"] else q.dtype
    if path == "ds" and b * t * hq * n * lp * ds_dtype.itemsize > DS_MAX_BYTES:
        path = "fused"
    ds = None
    if path == "ds":
        try:
            ds = alloc((b, t, hq, n, lp), dtype=ds_dtype, device=q.device)
        except torch.cuda.OutOfMemoryError:  # under the cap, yet not free now: fused needs none
            path = "fused"
    fuse = path == "fused"
    if fuse and dq is not None and not dq_acc:
        dq.zero_()  # the fused kernel only adds

    def dq_kernel(ds: torch.Tensor | None) -> None:
        assert dq is not None
        # R positions per program fill the ≥ 16 rows a tensor-core dot needs when G < 16
        # (the forward pads G rows to 16 instead); their union of blocks is walked once.
        # A stored dS is per (row, slot): one position per program, G rows padded.
        r = max(1, 16 // g) if ds is None else 1
        if r > 1:
            uni, cnt = union_blocks(idx, r)
        else:  # unused placeholders (R = 1 walks idx itself)
            uni, cnt = idx, idx
        kernel = nsa_selection_bwd_dq_kernel if ds is None else nsa_selection_bwd_dq_from_ds_kernel
        kernel[(-(-t // r), b * hkv)](
            q, k, v, idx, uni, cnt, dout, lse, dd, gates, dq, dq if ds is None else ds, t,
            scale * LOG2E, scale, R=r, BLOCK_M=pow2(r * g), BLOCK_N=pow2(n, 1),
            BLOCK_KF=block_k, ACC=dq_acc, FROM_DS=ds is not None, **dims,
        )  # fmt: skip

    if dq is not None and path == "separate":
        dq_kernel(None)
    if dk is not None and dv is not None:
        ts = -(-t // lp)
        chunk = max(1, CHUNK_ROWS // g)
        store_ds = ds is not None
        qpos, qoff, cstart, max_chunks = reverse_map(idx, ts, chunk, entries=store_ds)
        third = ds if ds is not None else dq if fuse else dk  # unused when neither
        nsa_selection_bwd_dkdv_kernel[(max_chunks, b * hkv)](
            q, k, v, dout, lse, dd, gates, qpos, qoff, cstart, dk, dv, third, t, ts,
            scale * LOG2E, scale, CHUNK=chunk, BLOCK_K=block_k, BLOCK_TS=pow2(ts),
            FUSE_DQ=fuse, STORE_DS=store_ds, **dims,
        )  # fmt: skip
        if ds is not None:
            dq_kernel(ds)
