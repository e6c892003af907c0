"""Helpers shared by the NSA Triton kernels (dispatch flags, tiny jit utilities)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (CI covers the kernels that way)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda or interpreting()


def dot_f32(dtype: torch.dtype) -> bool:
    """Dots in fp32 for fp32 inputs (exact 'ieee', not tf32) and always under the interpreter,
    where bf16 tl.dot returns garbage (spec §5 trap 1)."""
    return dtype == torch.float32 or interpreting()


def pow2(n: int, minimum: int = 16) -> int:
    return max(minimum, triton.next_power_of_2(max(n, 1)))


def autotune_configs(configs: list[triton.Config]) -> list[triton.Config]:
    """The first config only, unless NSA_AUTOTUNE=1 is set before import.

    Several configs fail under the interpreter ('0 active drivers', trap 2), and tuning every
    new shape costs compile time (tests sweep many shapes), so the first entry is the
    measured-best default and benchmarks opt in to tuning.
    """
    if interpreting() or os.environ.get("NSA_AUTOTUNE") != "1":
        return configs[:1]
    # NSA_AUTOTUNE_MAX=k keeps the first k (benchmarks bound their compile time this way)
    limit = int(os.environ.get("NSA_AUTOTUNE_MAX", "0") or 0)
    return configs[:limit] if limit > 0 else configs


@triton.jit
def mma(a, b, F32: tl.constexpr):
    """a @ b with fp32 accumulation; F32 selects exact fp32 products instead of tf32."""
    if F32:  # noqa: SIM108 - plain if keeps the Triton frontend on its simplest path
        r = tl.dot(a, b, input_precision="ieee")
    else:
        r = tl.dot(a, b)
    return r


@triton.jit
def gather_kv(k_base, v_base, tok, kin, sk_t, sv_t, offs_dk, offs_dv,
              DK: tl.constexpr, DV: tl.constexpr):  # fmt: skip
    """One selected block's key tile kᵀ [BLOCK_DK, BLOCK_K] and values [BLOCK_K, BLOCK_DV] at
    the key positions tok [BLOCK_K]; where kin is False nothing is read (zeros)."""
    kt = tl.load(
        k_base + tok[None, :] * sk_t + offs_dk[:, None],
        mask=kin[None, :] & (offs_dk[:, None] < DK),
        other=0.0,
    )
    vt = tl.load(
        v_base + tok[:, None] * sv_t + offs_dv[None, :],
        mask=kin[:, None] & (offs_dv[None, :] < DV),
        other=0.0,
    )
    return kt, vt


@triton.jit
def online_step(s, vt, m_i, l_i, acc, DOT_F32: tl.constexpr, GUARD: tl.constexpr):
    """Fold one tile's logits s (base 2, −inf where masked) and values vt into the online
    softmax (m_i, l_i, acc). GUARD: a row may have seen only −inf so far."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if GUARD:  # noqa: SIM108 - constexpr branch
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_safe = m_new
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_F32:
        acc = acc * alpha[:, None] + mma(p, vt.to(tl.float32), DOT_F32)
    else:
        acc = acc * alpha[:, None] + mma(p.to(vt.dtype), vt, DOT_F32)
    return m_new, l_i, acc
