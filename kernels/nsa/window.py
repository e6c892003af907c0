"""Sliding-window branch (Triton), optionally fused with the gated combine.

A program owns BLOCK_T query positions × the G heads of one KV head (rows position-major, as
in the compressed kernel), so each K/V tile of the band [t0 − w + 1, t0 + BLOCK_T) is loaded
once per group instead of once per query head. With COMBINE the program also reads the
gates and the o_cmp / o_slc rows (fp32 or fp16) and writes the final output in q's dtype, saving a
separate pass over three [B, T, Hq, Dv] tensors.
"""

from __future__ import annotations

from types import ModuleType

import torch
import triton
import triton.language as tl

from kernels._gluon_switch import gluon_or_none
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

_LOG2E = 1.4426950408889634


def _win_configs() -> list[triton.Config]:
    if interpreting():
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=1)]
    return autotune_configs(
        [
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in (
                (64, 64, 4, 3),  # measured best on H200 at 16k–64k (first = default)
                (128, 64, 8, 3),
                (128, 64, 4, 3),
                (128, 128, 8, 2),
                (256, 64, 8, 3),
            )
        ]
    )


@triton.jit
def _win_tile(
    q, k_base, v_base, sk_t, sv_t, n0, t, hi, qk_scale, m_i, l_i, acc,
    offs_dk, offs_dv,
    W: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One K/V tile of the band [n0, n0 + BLOCK_N) folded into the online softmax of the rows
    at positions t. MASKED=False: the caller vouches that every key is in every row's window
    and below hi, so no logit is −inf and no guard against an all −inf row is needed."""
    kpos = n0 + tl.arange(0, BLOCK_N)
    kin = kpos < hi
    if MASKED:
        kmask = kin[None, :] & (offs_dk[:, None] < DK)
        vmask = kin[:, None] & (offs_dv[None, :] < DV)
    else:
        kmask = offs_dk[:, None] < DK
        vmask = offs_dv[None, :] < DV
    kt = tl.load(k_base + kpos[None, :] * sk_t + offs_dk[:, None], mask=kmask, other=0.0)
    if DOT_F32:
        kt = kt.to(tl.float32)
    s = mma(q, kt, DOT_F32) * qk_scale
    if MASKED:
        vis = kin[None, :] & (kpos[None, :] <= t[:, None]) & (kpos[None, :] > t[:, None] - W)
        s = tl.where(vis, s, float("-inf"))
    vt = tl.load(v_base + kpos[:, None] * sv_t + offs_dv[None, :], mask=vmask, other=0.0)
    return online_step(s, vt, m_i, l_i, acc, DOT_F32, MASKED)


@triton.jit
def _forced_tile(
    q, k_base, v_base, sk_t, sv_t, n0, klo, khi, t, qk_scale, m_i, l_i, acc,
    offs_dk, offs_dv,
    L_SEL: tl.constexpr, N_INIT: tl.constexpr, N_LOCAL: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr, DOT_F32: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One K/V tile of the selection branch's forced blocks (the first N_INIT blocks and the
    N_LOCAL last ones up to each row's position t) folded into their own online softmax:
    keys [n0, n0 + BLOCK_N) ∩ [klo, khi), causal per row."""
    kpos = n0 + tl.arange(0, BLOCK_N)
    kin = (kpos >= klo) & (kpos < khi)
    kt, vt = gather_kv(k_base, v_base, kpos, kin, sk_t, sv_t, offs_dk, offs_dv, DK, DV)
    if DOT_F32:
        kt = kt.to(tl.float32)
    s = mma(q, kt, DOT_F32) * qk_scale
    blk = kpos // L_SEL
    cur = t // L_SEL
    forced = (blk[None, :] < N_INIT) | (blk[None, :] > cur[:, None] - N_LOCAL)
    vis = kin[None, :] & forced & (kpos[None, :] <= t[:, None])
    s = tl.where(vis, s, float("-inf"))
    return online_step(s, vt, m_i, l_i, acc, DOT_F32, True)


@triton.autotune(
    configs=_win_configs(),
    key=["T", "G", "W", "BLOCK_DK", "BLOCK_DV", "COMBINE", "WRITE_OW", "SPLIT", "FORCED"],
)
@triton.jit
def nsa_window_fwd_kernel(
    Q,  # [B, T, Hq, Dk]
    K,  # [B, T, Hkv, Dk]
    V,  # [B, T, Hkv, Dv]
    O,  # COMBINE: out [B, T, Hq, Dv] in q's dtype; else o_win fp32
    LSE,  # [B, T, Hq] fp32
    OC,  # [B, T, Hq, Dv] fp32 or fp16 o_cmp (COMBINE only)
    OS,  # [B, T, Hq, Dv] fp32 or fp16 o_slc (COMBINE only)
    GATES,  # [B, T, Hq, 3] (COMBINE only)
    OW,  # [B, T, Hq, Dv] fp32 or fp16 o_win, O's strides (COMBINE and WRITE_OW only)
    OF,  # FORCED: [B, T, Hq, Dv] the forced blocks' partial selection output, O's strides
    LSEF,  # FORCED: [B, T, Hq] fp32 its log-sum-exp in base 2, LSE's strides
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
    sb_b,  # strides shared by OC and OS (both fresh contiguous)
    sb_t,
    sb_h,
    sg_b,
    sg_t,
    sg_h,
    sg_c,
    T,
    qk_scale,
    W: tl.constexpr,
    HKV: tl.constexpr,
    G: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    COMBINE: tl.constexpr,
    WRITE_OW: tl.constexpr,  # the backward needs o_win beside the combined out
    DOT_F32: tl.constexpr,
    SPLIT: tl.constexpr,  # variant v2: mask only the band's edge tiles; leaner epilogue
    FORCED: tl.constexpr,  # also the selection's forced blocks (selection variant v5)
    L_SEL: tl.constexpr,
    N_INIT: tl.constexpr,
    N_LOCAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    BLOCK_T: tl.constexpr = BLOCK_M // G
    pid_t = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = pid_bg // HKV
    g = pid_bg % HKV
    t0 = pid_t * BLOCK_T
    rows = tl.arange(0, BLOCK_M)
    t = t0 + rows // G  # [BLOCK_M]
    h = g * G + rows % G
    row_ok = t < T
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(
        Q + b * sq_b + t[:, None] * sq_t + h[:, None] * sq_h + offs_dk[None, :],
        mask=row_ok[:, None] & (offs_dk[None, :] < DK),
        other=0.0,
    )
    if DOT_F32:
        q = q.to(tl.float32)
    k_base = K + b * sk_b + g * sk_h
    v_base = V + b * sv_b + g * sv_h
    lo = tl.maximum(t0 - W + 1, 0)
    hi = tl.minimum(t0 + BLOCK_T, T)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    if SPLIT:
        # Only a band's edge tiles need the mask: keys below every row's window (the first
        # tiles) and keys past the first row's position (the last). Tiles in between hold
        # keys that all BLOCK_T positions see: no mask, no −inf guard (seven of the nine tiles
        # at w = 512, BLOCK_T = 4, BLOCK_N = 64).
        # [lo, mid_lo): lower edge; [mid_lo, mid_hi): mask-free; [mid_hi, hi): causal edge
        first_free = t0 + BLOCK_T - W  # lowest key the last position sees
        mid_lo = lo + tl.cdiv(tl.maximum(first_free - lo, 0), BLOCK_N) * BLOCK_N
        mid_hi = mid_lo + tl.maximum(t0 + 1 - mid_lo, 0) // BLOCK_N * BLOCK_N
        for n0 in range(lo, tl.minimum(mid_lo, hi), BLOCK_N):
            m_i, l_i, acc = _win_tile(
                q, k_base, v_base, sk_t, sv_t, n0, t, hi, qk_scale, m_i, l_i, acc,
                offs_dk, offs_dv, W, DK, DV, DOT_F32, BLOCK_N, True,
            )  # fmt: skip
        for n0 in range(mid_lo, mid_hi, BLOCK_N):
            m_i, l_i, acc = _win_tile(
                q, k_base, v_base, sk_t, sv_t, n0, t, hi, qk_scale, m_i, l_i, acc,
                offs_dk, offs_dv, W, DK, DV, DOT_F32, BLOCK_N, False,
            )  # fmt: skip
        for n0 in range(mid_hi, hi, BLOCK_N):
            m_i, l_i, acc = _win_tile(
                q, k_base, v_base, sk_t, sv_t, n0, t, hi, qk_scale, m_i, l_i, acc,
                offs_dk, offs_dv, W, DK, DV, DOT_F32, BLOCK_N, True,
            )  # fmt: skip
    else:
        for n0 in range(lo, hi, BLOCK_N):
            m_i, l_i, acc = _win_tile(
                q, k_base, v_base, sk_t, sv_t, n0, t, hi, qk_scale, m_i, l_i, acc,
                offs_dk, offs_dv, W, DK, DV, DOT_F32, BLOCK_N, True,
            )  # fmt: skip
    has = l_i > 0
    inv = tl.where(has, 1.0 / tl.where(has, l_i, 1.0), 0.0)
    o_win = acc * inv[:, None]
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(LSE + b * sl_b + t * sl_t + h, lse2 * 0.6931471805599453, mask=row_ok)
    omask = row_ok[:, None] & (offs_dv[None, :] < DV)
    optr = b * so_b + t[:, None] * so_t + h[:, None] * so_h + offs_dv[None, :]
    if COMBINE:
        gbase = GATES + b * sg_b + t * sg_t + h * sg_h
        g0 = tl.load(gbase, mask=row_ok, other=0.0).to(tl.float32)
        g1 = tl.load(gbase + sg_c, mask=row_ok, other=0.0).to(tl.float32)
        g2 = tl.load(gbase + 2 * sg_c, mask=row_ok, other=0.0).to(tl.float32)
        if SPLIT:  # OC, OS share O's strides (window_triton checks): one offset tile, and
            # terms added one by one: Triton 3.6's ptxas then spills nothing (v1: 654 bytes)
            out = g2[:, None] * o_win
            out += g0[:, None] * tl.load(OC + optr, mask=omask, other=0.0).to(tl.float32)
            out += g1[:, None] * tl.load(OS + optr, mask=omask, other=0.0).to(tl.float32)
        else:
            bptr = b * sb_b + t[:, None] * sb_t + h[:, None] * sb_h + offs_dv[None, :]
            o_c = tl.load(OC + bptr, mask=omask, other=0.0).to(tl.float32)
            o_s = tl.load(OS + bptr, mask=omask, other=0.0).to(tl.float32)
            out = g0[:, None] * o_c + g1[:, None] * o_s + g2[:, None] * o_win
        tl.store(O + optr, out.to(O.dtype.element_ty), mask=omask)
        if WRITE_OW:
            tl.store(OW + optr, o_win.to(OW.dtype.element_ty), mask=omask)
    else:
        tl.store(O + optr, o_win.to(O.dtype.element_ty), mask=omask)
    if FORCED:
        # The selection branch's forced blocks, attended to here where their keys were just
        # loaded (the local ones lie inside the window) and shared by the program's rows;
        # folding the local ones into the band's last tiles (their keys loaded and multiplied
        # once for both softmaxes) was no faster: the whole forward 38.20 ms either way at
        # 64k, 42.48 at the 8 warps that keep its two accumulators from spilling (run 100);
        # the selection kernel gathers only the picked blocks and merges this partial
        # softmax (selection variant v5). Init blocks first, then the local ones from the
        # program's first row's, each key counted once (klo).
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        init_hi = tl.minimum(N_INIT * L_SEL, hi)
        for n0 in range(0, init_hi, BLOCK_N):
            m_i, l_i, acc = _forced_tile(
                q, k_base, v_base, sk_t, sv_t, n0, 0, init_hi, t, qk_scale, m_i, l_i, acc,
                offs_dk, offs_dv, L_SEL, N_INIT, N_LOCAL, DK, DV, DOT_F32, BLOCK_N,
            )  # fmt: skip
        local_lo = tl.maximum((t0 // L_SEL - N_LOCAL + 1) * L_SEL, N_INIT * L_SEL)
        for n0 in range(local_lo, hi, BLOCK_N):
            m_i, l_i, acc = _forced_tile(
                q, k_base, v_base, sk_t, sv_t, n0, local_lo, hi, t, qk_scale, m_i, l_i, acc,
                offs_dk, offs_dv, L_SEL, N_INIT, N_LOCAL, DK, DV, DOT_F32, BLOCK_N,
            )  # fmt: skip
        # every row sees its own key (the local block holding t is forced): l_i > 0
        ok = l_i > 0
        o_f = acc * tl.where(ok, 1.0 / tl.where(ok, l_i, 1.0), 0.0)[:, None]
        lse2_f = tl.where(ok, m_i + tl.log2(tl.where(ok, l_i, 1.0)), float("-inf"))
        tl.store(OF + optr, o_f.to(OF.dtype.element_ty), mask=omask)
        tl.store(LSEF + b * sl_b + t * sl_t + h, lse2_f, mask=row_ok)


# what _launch hands the kernel's forced-block constexprs when FORCED is off (never read)
_NO_FORCED = NSAConfig()


def window_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    scale: float,
    *,
    combine: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    alloc: object = torch.empty,
    o_win: torch.Tensor | None = None,
    split: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Window branch. combine=None → (o_win fp32, lse_win); combine=(o_cmp, o_slc, gates) →
    (out in q.dtype, lse_win) with out = g0·o_cmp + g1·o_slc + g2·o_win computed in fp32
    (o_cmp, o_slc fp32 or fp16).

    With combine, o_win (a contiguous fp32 or fp16 [B, T, Hq, Dv] buffer) also receives the window
    branch's own output, for the backward and the aux (one pass, not a second window kernel)."""
    b, t, hq, _ = q.shape
    dv = v.shape[3]
    out_dtype = q.dtype if combine is not None else torch.float32
    o = alloc((b, t, hq, dv), dtype=out_dtype, device=q.device)  # type: ignore[operator]
    lse = alloc((b, t, hq), dtype=torch.float32, device=q.device)  # type: ignore[operator]
    _launch(q, k, v, window, scale, o, lse, combine, o_win, split)
    return o, lse


def window_forced_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
    alloc: object = torch.empty,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The window branch (no combine) and, from the same program, the selection branch's
    forced blocks (the first ``sel_init`` blocks and the ``sel_local`` last ones up to each
    position) as a partial softmax: (o_win, lse_win, o_forced, lse2_forced), the outputs in
    ``out_dtype``, lse_win natural, lse2_forced in base 2 (fp32). Selection variant v5 merges
    the partial into its picked blocks' softmax (``selection.selection_triton_v5``)."""
    b, t, hq, _ = q.shape
    shape, dev = (b, t, hq, v.shape[3]), q.device
    o = alloc(shape, dtype=out_dtype, device=dev)  # type: ignore[operator]
    o_f = alloc(shape, dtype=out_dtype, device=dev)  # type: ignore[operator]
    lse = alloc((b, t, hq), dtype=torch.float32, device=dev)  # type: ignore[operator]
    lse_f = alloc((b, t, hq), dtype=torch.float32, device=dev)  # type: ignore[operator]
    _launch(q, k, v, cfg.window, scale, o, lse, None, None, False, (o_f, lse_f, cfg))
    return o, lse, o_f, lse_f


def _launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    scale: float,
    o: torch.Tensor,
    lse: torch.Tensor,
    combine: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    o_win: torch.Tensor | None,
    split: bool,
    forced: tuple[torch.Tensor, torch.Tensor, NSAConfig] | None = None,
) -> None:
    """``nsa_window_fwd_kernel`` on the given outputs (o, lse; with ``forced``: the forced
    blocks' o_f, lse_f of the same shapes and strides, and the config naming the blocks)."""
    b, t, hq, dk = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    g = hq // hkv
    if combine is not None:
        o_cmp, o_slc, gates = combine
        o_cmp, o_slc = o_cmp.contiguous(), o_slc.contiguous()
    else:
        o_cmp = o_slc = gates = o  # unused placeholders (COMBINE=False never reads them)
    if split and combine is not None:  # the SPLIT epilogue indexes o_cmp, o_slc as it does o
        assert o_cmp.stride() == o_slc.stride() == o.stride(), "o_cmp, o_slc, out: same strides"
    write_ow = combine is not None and o_win is not None
    cfg = forced[2] if forced is not None else _NO_FORCED
    if forced is not None:
        assert forced[0].stride() == o.stride() and forced[1].stride() == lse.stride()
    if write_ow:
        assert o_win is not None and o_win.shape == o.shape and o_win.is_contiguous()
        assert o_win.dtype in (torch.float32, torch.float16) and o.is_contiguous()

    def grid(meta: dict[str, int]) -> tuple[int, int]:
        return (triton.cdiv(t, meta["BLOCK_M"] // g), b * hkv)

    nsa_window_fwd_kernel[grid](
        q,
        k,
        v,
        o,
        lse,
        o_cmp,
        o_slc,
        gates,
        o_win if write_ow else o,  # placeholder when not written
        o if forced is None else forced[0],
        lse if forced is None else forced[1],
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        o.stride(0),
        o.stride(1),
        o.stride(2),
        lse.stride(0),
        lse.stride(1),
        o_cmp.stride(0),
        o_cmp.stride(1),
        o_cmp.stride(2),
        gates.stride(0),
        gates.stride(1),
        gates.stride(2),
        gates.stride(3),
        t,
        scale * _LOG2E,
        W=window,
        HKV=hkv,
        G=g,
        DK=dk,
        DV=dv,
        BLOCK_DK=pow2(dk),
        BLOCK_DV=pow2(dv),
        COMBINE=combine is not None,
        WRITE_OW=write_ow,
        DOT_F32=dot_f32(q.dtype),
        SPLIT=split,
        FORCED=forced is not None,
        L_SEL=cfg.sel_block,
        N_INIT=cfg.sel_init,
        N_LOCAL=cfg.sel_local,
    )


def _window_gluon(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: object, **kwargs: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """``window_gluon.window_gluon`` where it runs (Hopper; bf16/fp16; D 64 or 128), else
    ``window_triton``, which computes the same thing (also once Gluon proves unusable with
    this Triton: ``kernels._gluon_switch``). Correct on the H200 but slower than v1 at w = 512
    (run 82), so not the default."""

    def call(mod: ModuleType) -> tuple[torch.Tensor, torch.Tensor] | None:
        if mod.window_gluon_unsupported(q, k, v) is not None:
            return None
        return mod.window_gluon(q, k, v, *args, **kwargs)

    res = gluon_or_none("the NSA window branch", "kernels.nsa.window_gluon", call, where=q)
    if res is None:
        res = window_triton(q, k, v, *args, **kwargs)  # type: ignore[arg-type]
    return res


def _window_split(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: object, **kwargs: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """``window_triton`` with the mask applied to the band's edge tiles only and the combine
    indexing o_cmp, o_slc with out's offsets (``SPLIT``)."""
    return window_triton(q, k, v, *args, split=True, **kwargs)  # type: ignore[arg-type]


# v1: the Triton kernel above (4 positions × the G heads of a KV head per program); v2: the
# same with mask-free interior tiles and a combine that does not spill; g1: the Gluon kernel
# (128 positions of one query head per program, block attention's schedule).
WINDOW_IMPLS = {"v1": window_triton, "v2": _window_split, "g1": _window_gluon}
