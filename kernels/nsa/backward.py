"""Trainable ``nsa_attention`` on the Triton path: an autograd.Function around the forward.

``nsa_attention`` routes here only when gradients are requested and the inputs take the
Triton path (CUDA, or TRITON_INTERPRET=1); the no-grad forward never touches this module.
Plain CPU tensors train through autograd of the chunked PyTorch path instead.

Forward: the same kernels as the no-grad path (variants, k̃ storage, fused window+combine),
plus what the backward needs: the window kernel also writes o_win, and o_cmp, o_slc, o_win,
the three lse's, the block indices and an fp32 k̃ are saved.

Backward (spec §4.2): with D_j = rowsum(dout · o_j) (one preprocess kernel),
* dgates[..., j] = D_j (fp32, cast to the gates' dtype);
* each branch's FlashAttention-2 backward with dO_j = g_j·dout and delta_j = g_j·D_j:
  window (writes dq, dk, dv), compressed (adds into dq; writes dk̃, dṽ), selection (adds
  into dq; adds into dk, dv atomically), over exactly the indices the forward used — the
  top-n is a discrete choice and gets no gradient (the reference scores a detached p_cmp);
* compress="mean": k̃_i = mean(k[i·d : i·d + l]), so dk[t] += Σ_{i ∋ t} dk̃_i / l (same for v);
  compress="given": dk̃, dṽ are the gradients of k_cmp, v_cmp.

On CUDA the compressed dk̃/dṽ kernel, which depends on nothing but the forward's tensors and
D, runs on a side stream (``SIDE_STREAM``) beside the chain window → selection → compressed
dq, which must run in order (each adds into the previous one's dq, dk, dv): the GPU then has
work in the chain's launch gaps and in each kernel's last, partly filled wave.
"""

from __future__ import annotations

from typing import Any

import torch

from kernels.nsa import attention as fwd
from kernels.nsa._bwd_common import bwd_preprocess
from kernels.nsa._streams import join, on_side
from kernels.nsa.compressed_bwd import compressed_bwd_triton
from kernels.nsa.config import NSAAux, NSAConfig
from kernels.nsa.selection_bwd import selection_bwd_triton
from kernels.nsa.torch_path import compress_mean_fast
from kernels.nsa.validate import NSADims
from kernels.nsa.window_bwd import window_bwd_triton

# The compressed dk̃/dṽ kernel on the side stream (CUDA only; benchmarks flip it to compare):
# 0.965-0.980 of the serial order's fwd+bwd at 64k, 0.96 at 16k (runs 62-64, one H200).
SIDE_STREAM = True


def unpool_mean_add_(dx: torch.Tensor, dxc: torch.Tensor, cfg: NSAConfig) -> None:
    """Backward of mean pooling, added in place: dx [B,T,H,D] fp32 += spread of dxc.

    Token t lies in the windows i with i·d ≤ t < i·d + l, i.e. in stride chunk c = ⌊t/d⌋ of
    windows c − l/d + 1 … c; each contributes dxc_i / l. Chunks beyond the last window
    ((Tc − 1)·d + l ≤ T tokens are covered) get nothing.
    """
    b, tc, h, dd = dxc.shape
    if tc == 0:
        return
    d, ratio = cfg.cmp_stride, cfg.cmp_block // cfg.cmp_stride
    nchunk = tc + ratio - 1
    per_chunk = torch.zeros((b, nchunk, h, dd), dtype=torch.float32, device=dx.device)
    for r in range(ratio):  # window i covers chunks i … i + ratio − 1
        per_chunk[:, r : r + tc] += dxc
    per_chunk /= cfg.cmp_block
    dx[:, : nchunk * d].view(b, nchunk, d, h, dd).add_(per_chunk.unsqueeze(2))


def _forward_parts(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    k_cmp: torch.Tensor | None,
    v_cmp: torch.Tensor | None,
    block_indices: torch.Tensor | None,
    cfg: NSAConfig,
    dims: NSADims,
) -> dict[str, Any]:
    """The Triton forward of ``attention.nsa_attention`` keeping its intermediates.

    Same kernels and the same k̃/ṽ rounding as the no-grad path, so out is bitwise the same;
    additionally returns k̃ in fp32 (the backward recomputes the QK̃ logits from it, in the
    forward's precision) and o_win.
    """
    kc_dtype = fwd.launch_dtype(q, dims)  # with the value checks pending: a guess
    split = kc_dtype == torch.float16  # k̃ passed as fp16 hi + lo (attention._compressed_dtype)
    if cfg.compress == "mean":
        kc32 = compress_mean_fast(k, cfg, torch.float32)  # [B, Tc, Hkv, Dk]
        vc = compress_mean_fast(v, cfg, kc_dtype)  # [B, Tc, Hkv, Dv]
    else:
        assert k_cmp is not None and v_cmp is not None
        kc32 = k_cmp.float().contiguous()
        vc = v_cmp if v_cmp.dtype == kc_dtype else v_cmp.to(kc_dtype)
    o_dtype = fwd.branch_dtype(kc_dtype)
    kc = kc32 if split else kc32.to(kc_dtype)
    o_cmp, lse_cmp, idx = fwd.compressed_branch(q, kc, vc, cfg, dims, split, block_indices, o_dtype)
    out, o_slc, lse_slc, o_win, lse_win = fwd.selection_and_window(
        q, k, v, gates, cfg, dims, o_cmp, idx, o_dtype, True, block_indices is None
    )
    return {
        "out": out,
        "kc32": kc32,
        "vc": vc.contiguous(),
        "split": split,
        "idx": idx.contiguous(),
        "o": (o_cmp.contiguous(), o_slc.contiguous(), o_win),
        "lse": (lse_cmp.contiguous(), lse_slc.contiguous(), lse_win),
    }


class NSAFunction(torch.autograd.Function):
    """out = nsa_attention(q, k, v, gates, ...) with the Triton backward described above."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        gates: torch.Tensor,
        k_cmp: torch.Tensor | None,
        v_cmp: torch.Tensor | None,
        block_indices: torch.Tensor | None,
        cfg: NSAConfig,
        dims: NSADims,
        aux_out: dict[str, NSAAux],
    ) -> torch.Tensor:
        # kernels of the backward address [B, T, H, ·] tensors as contiguous
        q, k, v, gates = (x.contiguous() for x in (q, k, v, gates))
        parts, dims = fwd.run_with_checks(  # raises on bad gates
            q, dims, lambda d: _forward_parts(q, k, v, gates, k_cmp, v_cmp, block_indices, cfg, d)
        )
        o_cmp, o_slc, o_win = parts["o"]
        lse_cmp, lse_slc, lse_win = parts["lse"]
        ctx.save_for_backward(
            q, k, v, gates, parts["kc32"], parts["vc"], parts["idx"],
            o_cmp, o_slc, o_win, lse_cmp, lse_slc, lse_win,
        )  # fmt: skip
        ctx.cfg, ctx.dims, ctx.split = cfg, dims, parts["split"]
        ctx.cmp_dtypes = (
            (k_cmp.dtype, v_cmp.dtype) if k_cmp is not None and v_cmp is not None else None
        )
        aux_out["aux"] = NSAAux(
            parts["idx"], lse_cmp, lse_slc, lse_win, o_cmp, o_slc, o_win
        )  # side outputs: plain tensors, not differentiable
        return parts["out"]

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if torch.is_grad_enabled():
            # create_graph=True: the kernels' gradients have no graph of their own, and
            # second-order terms silently missing would train the wrong thing
            raise NotImplementedError(
                "nsa_attention: double backward (autograd.grad(..., create_graph=True) or "
                "backward(create_graph=True)) through the Triton backward is not supported; "
                "higher-order gradients need the PyTorch path (plain CPU tensors) or "
                "kernels.nsa.naive.nsa_attention_naive"
            )
        return _backward(ctx, dout)


def _backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """NSAFunction.backward's work (see the module docstring); grad mode is off here."""
    (q, k, v, gates, kc32, vc, idx, o_cmp, o_slc, o_win, lse_cmp, lse_slc, lse_win) = (
        ctx.saved_tensors
    )
    cfg: NSAConfig = ctx.cfg
    dims: NSADims = ctx.dims
    need_q, need_k, need_v, need_g, need_kc, need_vc = ctx.needs_input_grad[:6]
    mean = cfg.compress == "mean"
    need_kv = need_k or need_v
    need_cmp_kv = dims.tc > 0 and ((mean and need_kv) or need_kc or need_vc)
    # the upstream gradient may be expanded (stride 0, e.g. from .sum()) or strided
    dout = dout.contiguous()
    alloc, dev = fwd._alloc, q.device
    dd = bwd_preprocess(dout, o_cmp, o_slc, o_win, alloc)  # [B, T, Hq, 3] fp32
    f32 = torch.float32
    dq = alloc(q.shape, dtype=f32, device=dev) if need_q else None
    dk = alloc(k.shape, dtype=f32, device=dev) if need_kv else None
    dv = alloc(v.shape, dtype=f32, device=dev) if need_kv else None
    cmp_args = (q, kc32, vc, dout, lse_cmp, dd, gates, cfg, dims.scale, ctx.split)
    dkc = dvc = dq_final = side = None
    if need_cmp_kv:
        dkc = alloc(kc32.shape, dtype=f32, device=dev)
        dvc = alloc(vc.shape, dtype=f32, device=dev)
        if SIDE_STREAM and dev.type == "cuda":
            with on_side(dev, q, kc32, vc, dout, lse_cmp, dd, gates, dkc, dvc) as side:
                compressed_bwd_triton(*cmp_args, dq=None, dkc=dkc, dvc=dvc, alloc=alloc)
    grads = (dout, lse_win, dd, gates)
    # window first: it overwrites dq, dk, dv (every element), the others add into them
    window_bwd_triton(q, k, v, *grads, cfg.window, dims.scale, dq=dq, dk=dk, dv=dv)
    sel_grads = (dout, lse_slc, dd, gates)
    selection_bwd_triton(
        q, k, v, idx, *sel_grads, cfg, dims.scale, dq=dq, dk=dk, dv=dv,
        dq_path=fwd.variant("selection_dq"), alloc=alloc,
    )  # fmt: skip
    if dims.tc > 0 and (need_q or (need_cmp_kv and side is None)):
        # the last branch to add into dq writes it in q's dtype: no conversion pass after
        if dq is not None and q.dtype != f32:
            dq_final = alloc(q.shape, dtype=q.dtype, device=dev)
        on_main = side is None
        compressed_bwd_triton(
            *cmp_args, dq=dq, dkc=dkc if on_main else None, dvc=dvc if on_main else None,
            dq_out=dq_final, alloc=alloc,
        )  # fmt: skip
    if side is not None:
        join(dev)  # dkc, dvc are read below
    if mean and dk is not None and dv is not None and dkc is not None and dvc is not None:
        unpool_mean_add_(dk, dkc, cfg)
        unpool_mean_add_(dv, dvc, cfg)
    g_kc = g_vc = None
    if not mean and (need_kc or need_vc):
        assert ctx.cmp_dtypes is not None
        kd, vd = ctx.cmp_dtypes
        if dkc is None or dvc is None:  # Tc = 0: empty tensors, nothing to differentiate
            g_kc, g_vc = kc32.to(kd), vc.to(vd)
        else:
            g_kc, g_vc = dkc.to(kd), dvc.to(vd)
    if dq_final is None and dq is not None:
        dq_final = dq.to(q.dtype)
    return (
        dq_final,
        dk.to(k.dtype) if dk is not None and need_k else None,
        dv.to(v.dtype) if dv is not None and need_v else None,
        dd.to(gates.dtype) if need_g else None,
        g_kc if need_kc else None,
        g_vc if need_vc else None,
        None,  # block_indices: a discrete choice, no gradient
        None,
        None,
        None,
    )


def nsa_attention_trainable(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    cfg: NSAConfig,
    dims: NSADims,
    k_cmp: torch.Tensor | None,
    v_cmp: torch.Tensor | None,
    block_indices: torch.Tensor | None,
    return_aux: bool,
) -> torch.Tensor | tuple[torch.Tensor, NSAAux]:
    """The Triton forward with a backward (arguments already validated by the caller).

    aux (return_aux=True) holds the forward's side outputs as plain tensors: they carry no
    gradient; only ``out`` is differentiable.
    """
    aux_out: dict[str, NSAAux] = {}
    out = NSAFunction.apply(q, k, v, gates, k_cmp, v_cmp, block_indices, cfg, dims, aux_out)
    if not return_aux:
        return out
    return out, aux_out["aux"].fp32_outputs()
