"""Triton-kernel cases run under TRITON_INTERPRET=1 on CPU tensors (spec §5).

Not collected by a plain ``pytest tests/`` (no test_ prefix): ``test_triton_interpret.py`` runs
this file with pytest in a subprocess whose environment sets TRITON_INTERPRET=1 *before* triton is
imported, which is the only way the interpreter gets selected. Sizes stay small (T <= 256).
"""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 set before triton is imported", allow_module_level=True)

from kernels.attention import block_attention  # noqa: E402
from kernels.attention.block_attention import block_attention_triton  # noqa: E402
from kernels.attention.naive import attention_naive, block_attention_naive  # noqa: E402
from kernels.ring import ring_attention  # noqa: E402
from tests.kernels.conftest import assert_attention_close, randn  # noqa: E402

# (B, Tq, Tk, Hq, Hkv, D, causal, q_offset, k_offset, dtype)
CASES = [
    (1, 37, 37, 2, 1, 16, True, 0, 0, torch.float32),
    (1, 129, 129, 4, 1, 64, True, 0, 0, torch.bfloat16),  # MQA
    (2, 77, 129, 2, 2, 32, True, 100, 40, torch.float16),  # Tq != Tk, offsets
    (1, 64, 200, 2, 1, 16, True, 0, 136, torch.float32),  # first 72 rows see nothing
    (1, 129, 64, 4, 2, 24, False, 0, 0, torch.bfloat16),  # non-power-of-two D
    (1, 256, 256, 2, 2, 64, False, 0, 0, torch.float32),
    (1, 100, 33, 2, 1, 16, True, 500, 0, torch.bfloat16),  # all keys in the past
    (1, 40, 40, 2, 1, 16, True, 0, 1000, torch.float32),  # all keys in the future
]


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: "x".join(str(x) for x in c[:9]) + f"-{str(c[9])[6:]}"
)
def test_block_attention_interpreter(case):
    b, tq, tk, hq, hkv, d, causal, qo, ko, dtype = case
    g = torch.Generator().manual_seed(tq * 31 + tk)
    q, k, v = (
        randn(b, tq, hq, d, dtype=dtype, gen=g),
        randn(b, tk, hkv, d, dtype=dtype, gen=g),
        randn(b, tk, hkv, d, dtype=dtype, gen=g),
    )
    out, lse = block_attention(q, k, v, causal=causal, q_offset=qo, k_offset=ko)
    ref = block_attention_naive(
        q.float(), k.float(), v.float(), causal=causal, q_offset=qo, k_offset=ko
    )
    assert out.dtype == dtype
    assert_attention_close(out, lse, *ref)


def _check_poisoned(
    seed: int, tk: int, causal: bool, q_offset: int, k_offset: int, key_boost: float = 1.0, **launch
) -> None:
    """One launch of the kernel into NaN-poisoned buffers against the fp32 naive reference."""
    g = torch.Generator().manual_seed(seed)
    b, tq, hq, hkv, d = 2, 83, 4, 2, 32  # B=2: TMA rows past T read the next batch
    q = randn(b, tq, hq, d, dtype=torch.bfloat16, gen=g)
    k = randn(b, tk, hkv, d, dtype=torch.bfloat16, gen=g)
    v = randn(b, tk, hkv, d, dtype=torch.bfloat16, gen=g)
    k[:, 70:90] *= key_boost
    out = torch.full_like(q, float("nan"))
    lse = torch.full((b, hq, tq), float("nan"))
    block_attention_triton(
        q,
        k,
        v,
        causal=causal,
        q_offset=q_offset,
        k_offset=k_offset,
        scale=d**-0.5,
        out=out,
        lse=lse,
        **launch,
    )
    ref = block_attention_naive(
        q.float(), k.float(), v.float(), causal=causal, q_offset=q_offset, k_offset=k_offset
    )
    assert_attention_close(out, lse, *ref)


@pytest.mark.parametrize("use_tma", [False, True], ids=["ptr", "tma"])
@pytest.mark.parametrize(("block_m", "block_n"), [(16, 32), (64, 16), (32, 64)])
def test_tiles_and_load_paths_write_everything(use_tma, block_m, block_n):
    """NaN-poisoned outputs: every element must be written, for each tile shape and load path."""
    _check_poisoned(
        block_m + block_n, 101, True, 30, 20, block_m=block_m, block_n=block_n, use_tma=use_tma
    )


@pytest.mark.parametrize("use_tma", [False, True], ids=["ptr", "tma"])
@pytest.mark.parametrize(
    ("split", "lazy"), [(True, False), (False, True), (True, True)], ids=["split", "lazy", "both"]
)
@pytest.mark.parametrize("causal", [True, False])
def test_kernel_variants(use_tma, split, lazy, causal):
    """The kernel's split and lazy-rescale variants, with keys whose logits grow far along the
    row: a late maximum 200+ binades above the first overflows fp32 unless the lazy rescale
    fires."""
    qo = 60 if causal else 0
    _check_poisoned(
        11,
        131,
        causal,
        qo,
        0,
        key_boost=60.0,
        block_m=64,
        block_n=32,
        use_tma=use_tma,
        split=split,
        lazy=lazy,
    )


@pytest.mark.parametrize("layout", ["zigzag", "stripe", "contiguous"])
def test_ring_attention_through_the_kernel(layout):
    g = torch.Generator().manual_seed(3)
    q, k, v = randn(1, 128, 4, 16, gen=g), randn(1, 128, 2, 16, gen=g), randn(1, 128, 2, 16, gen=g)
    out, lse = ring_attention(q, k, v, causal=True, world_size=2, layout=layout, backend="triton")
    assert_attention_close(out, lse, *attention_naive(q, k, v, causal=True))
