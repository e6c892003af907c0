"""Block kernels behind one signature: ours (Triton / CPU fallback) or PyTorch's fused CUDA ones.

The rings call ``run_block`` for every (query chunk, KV chunk) pair. On CUDA the fastest block
kernel may be PyTorch's cuDNN or flash SDPA, which return the log-sum-exp the merge needs but
only know two masks: none, and the *local* causal mask ``i >= j`` with Tq == Tk. The ring
schedules (spec §3.2) only need those two for the contiguous and zigzag layouts (diagonal blocks
are local-causal, the others unmasked); any other mask (stripe's ``i > j``) goes to our kernel.

A fused backend is checked once against our kernel on a small input per (dtype, head dim): if
its lse convention or layout ever differs in a PyTorch release, we fall back instead of being
silently wrong.
"""

from __future__ import annotations

import warnings

import torch

from .block_attention import block_attention

BACKENDS = ("auto", "triton", "cudnn", "flash")

_checked: dict[tuple[str, torch.dtype, int, int], bool] = {}


def _sdpa_fused(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch fused forward on BTHD inputs -> (out [B,Tq,Hq,D] view, lse [B,Hq,Tq] fp32)."""
    b, tq, hq, _ = q.shape
    hkv = k.shape[2]
    if hkv != hq:
        # These private ops take equal head counts; repeat_interleave matches h -> h // G.
        k = k.repeat_interleave(hq // hkv, dim=2)
        v = v.repeat_interleave(hq // hkv, dim=2)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, D] views
    if backend == "cudnn":
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(
            qt, kt, vt, None, True, 0.0, causal, False, scale=scale
        )
    elif backend == "flash":
        res = torch.ops.aten._scaled_dot_product_flash_attention(
            qt, kt, vt, 0.0, causal, False, scale=scale
        )
    else:
        raise ValueError(f"unknown fused backend {backend!r}")
    out, lse = res[0], res[1]
    # cuDNN keeps a trailing singleton dim on lse ([B, H, T, 1]).
    return out.transpose(1, 2), lse.reshape(b, hq, tq).to(torch.float32)


def fused_backend_ok(backend: str, dtype: torch.dtype, head_dim: int, device: torch.device) -> bool:
    """Check a PyTorch fused backend once against our kernel (out and lse, causal and not)."""
    key = (backend, dtype, head_dim, device.index or 0)
    if key in _checked:
        return _checked[key]
    ok = False
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        shape = (1, 256, 2, head_dim)
        q, k, v = (torch.randn(shape, generator=gen, device=device).to(dtype) for _ in range(3))
        scale = head_dim**-0.5
        ok = True
        for causal in (False, True):
            o1, l1 = _sdpa_fused(q, k, v, causal=causal, scale=scale, backend=backend)
            o2, l2 = block_attention(q, k, v, causal=causal, scale=scale)
            err = (o1.float() - o2.float()).norm() / o2.float().norm()
            ok = ok and bool(err < 1e-2) and bool((l1 - l2).abs().max() < 1e-2)
    except Exception as exc:  # op missing in this build, unsupported head dim, ...
        warnings.warn(
            f"PyTorch {backend} attention unavailable ({exc}); using our Triton kernel",
            stacklevel=2,
        )
        ok = False
    if not ok:
        warnings.warn(
            f"PyTorch {backend} attention disagrees with block_attention; not used", stacklevel=2
        )
    _checked[key] = ok
    return ok


def resolve_backend(backend: str, q: torch.Tensor) -> str:
    """'auto' -> the fastest verified block kernel for q's device: cuDNN, then flash, then ours."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if q.device.type != "cuda" or q.dtype == torch.float32:
        # Fused CUDA kernels are bf16/fp16 only; on CPU ours is the only one.
        if backend in ("cudnn", "flash"):
            raise ValueError(
                f"backend {backend!r} needs CUDA bf16/fp16 tensors; use 'auto' or 'triton'"
            )
        return "triton"
    if backend == "auto":
        for cand in ("cudnn", "flash"):
            if fused_backend_ok(cand, q.dtype, q.shape[-1], q.device):
                return cand
        return "triton"
    return backend


def run_block(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    q_offset: int,
    k_offset: int,
    scale: float,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block of a ring schedule with a resolved backend ('triton', 'cudnn' or 'flash')."""
    local_causal = causal and q_offset == k_offset and q.shape[1] == k.shape[1]
    if backend != "triton" and (not causal or local_causal):
        return _sdpa_fused(q, k, v, causal=causal, scale=scale, backend=backend)
    return block_attention(
        q, k, v, causal=causal, q_offset=q_offset, k_offset=k_offset, scale=scale
    )
