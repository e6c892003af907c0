"""Argument checks shared by every public kernel entry point.

Each check raises ``ValueError`` whose message names the argument and says what to change,
because students call these functions too and a bare assertion teaches nothing.
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_tensor(name: str, x: object, ndim: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    return x


def check_bthd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    same_len: bool = False,
    same_head_dim: bool = True,
) -> tuple[int, int, int, int, int, int, int]:
    """Validate q [B,Tq,Hq,Dk], k [B,Tk,Hkv,Dk], v [B,Tk,Hkv,Dv]; return (B, Tq, Tk, Hq, Hkv, Dk, Dv)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, 4)
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; use bfloat16, float16 or float32")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(
            f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}; cast them first"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    b, tq, hq, dk = q.shape
    bk, tk, hkv, dk2 = k.shape
    bv, tv, hv, dv = v.shape
    if not (b == bk == bv):
        raise ValueError(f"batch sizes differ: q {b}, k {bk}, v {bv}")
    if tk != tv:
        raise ValueError(f"k and v must have the same length (dim 1), got {tk} and {tv}")
    if same_len and tq != tk:
        raise ValueError(f"q and k must have the same length (dim 1), got {tq} and {tk}")
    if hkv != hv:
        raise ValueError(f"k and v must have the same number of heads (dim 2), got {hkv} and {hv}")
    if dk != dk2:
        raise ValueError(f"q and k head dims (dim 3) differ: {dk} and {dk2}")
    if same_head_dim and dv != dk:
        raise ValueError(f"v head dim {dv} must equal the q/k head dim {dk} here")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(
            f"query heads ({hq}) must be a multiple of key/value heads ({hkv}) for GQA"
        )
    if min(b, hq, dk, dv) == 0:
        raise ValueError(f"empty tensors are not supported: q {tuple(q.shape)}, v {tuple(v.shape)}")
    return b, tq, tk, hq, hkv, dk, dv


def check_scale(scale: float | None, head_dim: int) -> float:
    if scale is None:
        return head_dim**-0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale must be a positive float or None, got {scale!r}")
    return float(scale)


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_block_attention_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: object,
    q_offset: object,
    k_offset: object,
    scale: float | None,
) -> float:
    """Checks for ``block_attention``; returns the resolved softmax scale."""
    _, _, _, _, _, dk, _ = check_bthd(q, k, v)
    check_bool("causal", causal)
    check_int("q_offset", q_offset)
    check_int("k_offset", k_offset)
    return check_scale(scale, dk)


def check_merge_args(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> None:
    """out_* [B,T,H,D] (same shape, device), lse_* [B,H,T] float32 matching them."""
    check_tensor("out_a", out_a, 4)
    check_tensor("out_b", out_b, 4)
    check_tensor("lse_a", lse_a, 3)
    check_tensor("lse_b", lse_b, 3)
    if out_a.shape != out_b.shape:
        raise ValueError(
            f"out_a and out_b must have the same shape, got {tuple(out_a.shape)} and {tuple(out_b.shape)}"
        )
    b, t, h, _ = out_a.shape
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        if tuple(lse.shape) != (b, h, t):
            raise ValueError(
                f"{name} must have shape [B, H, T] = {(b, h, t)} to match out_a {tuple(out_a.shape)}, "
                f"got {tuple(lse.shape)}"
            )
        if lse.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 (log-sum-exp statistics), got {lse.dtype}")
    for name, x in (("out_a", out_a), ("out_b", out_b)):
        if x.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} has dtype {x.dtype}; use bfloat16, float16 or float32")
    devices = {out_a.device, out_b.device, lse_a.device, lse_b.device}
    if len(devices) != 1:
        raise ValueError(
            f"out_a, lse_a, out_b, lse_b must be on one device, got {sorted(map(str, devices))}"
        )


RING_LAYOUTS = ("contiguous", "zigzag", "stripe")


def check_layout(layout: object) -> str:
    if layout not in RING_LAYOUTS:
        raise ValueError(f"layout must be one of {RING_LAYOUTS}, got {layout!r}")
    return layout  # type: ignore[return-value]


def check_ring_length(name: str, total_len: int, world_size: int, layout: str) -> None:
    """The global sequence length must split evenly into the layout's chunks."""
    parts = 2 * world_size if layout == "zigzag" else world_size
    if total_len % parts != 0:
        raise ValueError(
            f"{name} length {total_len} must be divisible by {parts} for layout {layout!r} with "
            f"world_size {world_size}; pad the sequence or pick another world size"
        )
