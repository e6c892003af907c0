"""block_attention (CPU fallback path) and merge_attention against the naive fp32 references."""

from __future__ import annotations

import importlib

import pytest
import torch

from kernels.attention import block_attention, merge_attention
from kernels.attention.backends import resolve_backend
from kernels.attention.naive import block_attention_naive, merge_attention_naive
from tests.kernels.conftest import assert_attention_close, randn

# (B, Tq, Tk, Hq, Hkv, D, q_offset, k_offset)
SHAPES = [
    (1, 37, 37, 2, 1, 16, 0, 0),
    (2, 129, 129, 4, 4, 64, 0, 0),
    (1, 333, 129, 4, 1, 32, 200, 0),  # MQA, Tq != Tk, KV block in the past-ish
    (1, 129, 333, 8, 2, 16, 0, 100),  # GQA 4, KV starts later: first rows see nothing
    (2, 64, 100, 2, 1, 24, 40, 40),  # non-power-of-two head dim
    (1, 50, 80, 2, 2, 16, 0, 500),  # every key in the future: all rows empty when causal
    (1, 80, 50, 2, 1, 16, 1000, 0),  # every key in the past: causal == full
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_block_attention_cpu_matches_naive(shape, causal, dtype, gen):
    b, tq, tk, hq, hkv, d, qo, ko = shape
    q, k, v = (
        randn(b, tq, hq, d, dtype=dtype, gen=gen),
        randn(b, tk, hkv, d, dtype=dtype, gen=gen),
        randn(b, tk, hkv, d, dtype=dtype, gen=gen),
    )
    q0, k0, v0 = q.clone(), k.clone(), v.clone()
    out, lse = block_attention(q, k, v, causal=causal, q_offset=qo, k_offset=ko)
    # fp32 reference on the same rounded inputs (spec §3.4)
    ref_out, ref_lse = block_attention_naive(
        q.float(), k.float(), v.float(), causal=causal, q_offset=qo, k_offset=ko
    )
    assert out.dtype == dtype and out.is_contiguous() and lse.is_contiguous()
    assert_attention_close(out, lse, ref_out, ref_lse)
    assert torch.equal(q, q0) and torch.equal(k, k0) and torch.equal(v, v0), "inputs modified"


def test_block_attention_custom_scale_and_strided_inputs(gen):
    q = randn(1, 48, 4, 32, gen=gen)
    kv = randn(1, 40, 4, 2, 32, gen=gen)  # k and v interleaved: non-contiguous views
    k, v = kv[:, :, :, 0], kv[:, :, :, 1]
    out, lse = block_attention(q, k, v, causal=True, q_offset=10, k_offset=0, scale=0.3)
    ref = block_attention_naive(q, k, v, causal=True, q_offset=10, k_offset=0, scale=0.3)
    assert_attention_close(out, lse, *ref)


def test_naive_matches_sdpa(gen):
    q, k, v = (randn(2, 65, 4, 16, gen=gen) for _ in range(3))
    out, _ = block_attention_naive(q, k, v, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_fully_masked_rows_are_zero_and_neg_inf(gen):
    q, k, v = randn(1, 8, 2, 16, gen=gen), randn(1, 8, 1, 16, gen=gen), randn(1, 8, 1, 16, gen=gen)
    out, lse = block_attention(q, k, v, causal=True, q_offset=0, k_offset=4)
    assert torch.isneginf(lse[:, :, :4]).all() and torch.isfinite(lse[:, :, 4:]).all()
    assert (out[:, :4] == 0).all() and not torch.isnan(out).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_merge_two_halves_equals_full(dtype, gen):
    q, k, v = (randn(2, 70, 4, 16, dtype=dtype, gen=gen) for _ in range(3))
    a = block_attention(q, k[:, :30], v[:, :30], causal=True, q_offset=0, k_offset=0)
    bb = block_attention(q, k[:, 30:], v[:, 30:], causal=True, q_offset=0, k_offset=30)
    out, lse = merge_attention(*a, *bb)
    ref = block_attention_naive(q.float(), k.float(), v.float(), causal=True)
    assert out.dtype == dtype
    assert_attention_close(out, lse, *ref)
    torch.testing.assert_close(
        out.float(), merge_attention_naive(*a, *bb)[0].float(), atol=1e-2, rtol=1e-2
    )


def test_merge_neg_inf_sides():
    b, t, h, d = 1, 3, 2, 4
    out_a, out_b = torch.randn(b, t, h, d), torch.randn(b, t, h, d)
    lse_a = torch.tensor([[[0.5, float("-inf"), float("-inf")]] * h])
    lse_b = torch.tensor([[[float("-inf"), 1.5, float("-inf")]] * h])
    out, lse = merge_attention(out_a, lse_a, out_b, lse_b)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out[:, 0], out_a[:, 0])
    torch.testing.assert_close(out[:, 1], out_b[:, 1])
    assert (out[:, 2] == 0).all() and torch.isneginf(lse[:, :, 2]).all()
    torch.testing.assert_close(lse[:, :, :2], torch.tensor([[[0.5, 1.5]] * h]))


def test_merge_matches_stable_sigmoid_form(gen):
    out_a, out_b = randn(2, 9, 3, 8, gen=gen), randn(2, 9, 3, 8, gen=gen)
    lse_a, lse_b = randn(2, 3, 9, gen=gen) * 5, randn(2, 3, 9, gen=gen) * 5
    out, lse = merge_attention(out_a, lse_a, out_b, lse_b)
    w = torch.sigmoid(lse_b - lse_a).transpose(1, 2)[..., None]
    torch.testing.assert_close(out, out_a - w * (out_a - out_b), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse_a - torch.nn.functional.logsigmoid(lse_a - lse_b))


def test_merge_does_not_modify_inputs(gen):
    args = (
        randn(1, 5, 2, 4, gen=gen),
        randn(1, 2, 5, gen=gen),
        randn(1, 5, 2, 4, gen=gen),
        randn(1, 2, 5, gen=gen),
    )
    copies = [a.clone() for a in args]
    merge_attention(*args)
    assert all(torch.equal(a, c) for a, c in zip(args, copies, strict=True))


def _qkv(**over):
    base = dict(q=torch.randn(1, 8, 4, 16), k=torch.randn(1, 8, 2, 16), v=torch.randn(1, 8, 2, 16))
    base.update(over)
    return base


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(_qkv(q=torch.randn(8, 4, 16)), causal=True), "q must have 4 dimensions"),
        (
            dict(_qkv(k=torch.randn(1, 8, 3, 16), v=torch.randn(1, 8, 3, 16)), causal=True),
            "multiple of key/value heads",
        ),
        (dict(_qkv(v=torch.randn(1, 7, 2, 16)), causal=True), "k and v must have the same length"),
        (dict(_qkv(q=torch.randn(1, 8, 4, 16).bfloat16()), causal=True), "share one dtype"),
        (
            dict(_qkv(k=torch.randn(1, 8, 2, 8), v=torch.randn(1, 8, 2, 8)), causal=True),
            "head dims",
        ),
        (dict(_qkv(q=torch.randint(0, 3, (1, 8, 4, 16))), causal=True), "dtype"),
        (dict(_qkv(), causal=1), "causal must be True or False"),
        (dict(_qkv(), causal=True, q_offset=1.5), "q_offset must be an int"),
        (dict(_qkv(), causal=True, k_offset="0"), "k_offset must be an int"),
        (dict(_qkv(), causal=True, scale=-1.0), "scale must be a positive"),
        (dict(_qkv(q="nope"), causal=True), "q must be a torch.Tensor"),
    ],
)
def test_block_attention_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        block_attention(**kwargs)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            (
                torch.zeros(1, 4, 2, 8),
                torch.zeros(1, 2, 4),
                torch.zeros(1, 5, 2, 8),
                torch.zeros(1, 2, 5),
            ),
            "same shape",
        ),
        (
            (
                torch.zeros(1, 4, 2, 8),
                torch.zeros(1, 4, 2),
                torch.zeros(1, 4, 2, 8),
                torch.zeros(1, 2, 4),
            ),
            r"lse_a must have shape \[B, H, T\]",
        ),
        (
            (
                torch.zeros(1, 4, 2, 8),
                torch.zeros(1, 2, 4),
                torch.zeros(1, 4, 2, 8),
                torch.zeros(1, 2, 4).double(),
            ),
            "lse_b must be float32",
        ),
        (
            (
                torch.zeros(1, 4, 2, 8),
                torch.zeros(2, 4),
                torch.zeros(1, 4, 2, 8),
                torch.zeros(1, 2, 4),
            ),
            "lse_a must have 3 dimensions",
        ),
    ],
)
def test_merge_errors(args, match):
    with pytest.raises(ValueError, match=match):
        merge_attention(*args)


def test_backend_errors_on_cpu():
    q = torch.randn(1, 4, 2, 8)
    assert resolve_backend("auto", q) == "triton"
    with pytest.raises(ValueError, match="needs CUDA"):
        resolve_backend("cudnn", q)
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("fast", q)


def test_gluon_kernel_refuses_what_it_cannot_run(gen):
    """The Gluon module imports with this machine's Triton, and names why it cannot run."""
    from kernels.attention.gluon_fwd import block_attention_gluon, gluon_unsupported

    q, k, v = (randn(1, 64, 2, 128, dtype=torch.bfloat16, gen=gen) for _ in range(3))
    why = gluon_unsupported(q, k, v, causal=True, q_offset=0, k_offset=0)
    assert why is not None and "Hopper" in why
    with pytest.raises(ValueError, match="Hopper"):
        block_attention_gluon(q, k, v, causal=True)
    # CPU tensors never reach it through the public function.
    out, lse = block_attention(q, k, v, causal=True)
    assert_attention_close(
        out, lse, *block_attention_naive(q.float(), k.float(), v.float(), causal=True)
    )


def test_without_gluon_block_attention_falls_back_once(gen, monkeypatch):
    """A Triton without Gluon (pyproject allows 3.2) turns the Gluon path off with one warning."""
    import sys

    import kernels._gluon_switch as switch

    ba = importlib.import_module(
        "kernels.attention.block_attention"
    )  # the module, not the function
    monkeypatch.setattr(switch, "OFF", {})
    monkeypatch.setattr(switch, "on_hopper", lambda x: True)  # as if on an H200
    # The import fails: no module, and no attribute left on the package by an earlier import.
    monkeypatch.setitem(sys.modules, "kernels.attention.gluon_fwd", None)
    monkeypatch.delattr(importlib.import_module("kernels.attention"), "gluon_fwd", raising=False)
    q, k, v = (randn(1, 64, 2, 128, dtype=torch.bfloat16, gen=gen) for _ in range(3))
    args = dict(causal=True, q_offset=0, k_offset=0, scale=0.1)
    with pytest.warns(RuntimeWarning, match="no usable Gluon.*uses its Triton kernel"):
        assert ba._try_gluon(q, k, v, **args) is None
    assert "block_attention" in switch.OFF
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call neither warns nor retries
        assert ba._try_gluon(q, k, v, **args) is None


def test_gluon_compile_error_falls_back(gen, monkeypatch):
    """A Triton whose Gluon API the kernel does not compile against: the Triton kernel serves."""
    from triton.compiler.errors import CompilationError

    import kernels._gluon_switch as switch
    import kernels.attention.gluon_fwd as gluon_fwd

    ba = importlib.import_module("kernels.attention.block_attention")

    def broken(*a, **kw):
        raise CompilationError("", None, "unknown builtin")

    monkeypatch.setattr(switch, "OFF", {})
    monkeypatch.setattr(switch, "on_hopper", lambda x: True)  # as if on an H200
    monkeypatch.setattr(gluon_fwd, "gluon_unsupported", lambda *a, **kw: None)
    monkeypatch.setattr(gluon_fwd, "block_attention_gluon", broken)
    q, k, v = (randn(1, 64, 2, 128, dtype=torch.bfloat16, gen=gen) for _ in range(3))
    with pytest.warns(RuntimeWarning, match="does not compile.*unknown builtin"):
        assert ba._try_gluon(q, k, v, causal=False, q_offset=0, k_offset=0, scale=0.1) is None
    assert "does not compile" in switch.OFF["block_attention"]
