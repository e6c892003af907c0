"""Outputs of any strides (a transpose, an ``einsum``): accepted with the right shape, dtype and
device, captured, digested and snapshotted correctly; refused when they alias an input or when
several of their elements are one memory location (an expanded tensor)."""

from __future__ import annotations

import itertools
import types

import pytest
import torch

from workers.harness import grade
from workers.harness.contract import output_violation, shares_memory_within
from workers.harness.sandboxed.digests import digest_weights, input_digest, output_digest
from workers.harness.sandboxed.wire import raw_view
from workers.verdicts import Verdict

# attention-merge, right values, both outputs non-contiguous views of fresh memory
MERGE_STRIDED = """
import torch


def merge_attention(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)  # B, H, T
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a - safe).unsqueeze(-1)
    wb = torch.exp(lse_b - safe).unsqueeze(-1)
    oa = out_a.float().permute(0, 2, 1, 3)  # B, H, T, D
    ob = out_b.float().permute(0, 2, 1, 3)
    out_bhtd = (oa * wa + ob * wb).to(out_a.dtype).contiguous()
    out = torch.einsum("bhtd->bthd", out_bhtd)  # a permuted view: not contiguous
    lse_t = lse.transpose(1, 2).contiguous()  # B, T, H in memory
    return out, lse_t.transpose(1, 2)  # B, H, T again, not contiguous
"""

# block-attention straight from einsum (its result's layout is whatever einsum makes)
BLOCK_EINSUM = """
import math

import torch


def block_attention(q, k, v, *, causal, q_offset=0, k_offset=0, scale=None):
    B, Tq, Hq, D = q.shape
    G = Hq // k.shape[2]
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    kf = k.float().repeat_interleave(G, 2)
    vf = v.float().repeat_interleave(G, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) * sc
    if causal:
        i = torch.arange(Tq, device=q.device).view(-1, 1) + q_offset
        j = torch.arange(k.shape[1], device=q.device).view(1, -1) + k_offset
        s = s.masked_fill(i < j, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse).unsqueeze(-1))
    out = torch.einsum("bhqk,bkhd->bqhd", p, vf).to(q.dtype)
    return out, lse
"""

# right values written into a non-contiguous view of an input: an alias, refused
MERGE_ALIAS = """
import torch


def merge_attention(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a - safe).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lse_b - safe).transpose(1, 2).unsqueeze(-1)
    out = (out_a.float() * wa + out_b.float() * wb).to(out_a.dtype)
    B, T, H, D = out_a.shape
    view = out_a.view(B, H, T, D).transpose(1, 2)  # out_a's memory, shaped B, T, H, D
    view.copy_(out)
    return view, lse.contiguous()
"""

# an expanded (stride 0) output: one memory location per row of lse
MERGE_EXPANDED = """
import torch


def merge_attention(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a - safe).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lse_b - safe).transpose(1, 2).unsqueeze(-1)
    out = (out_a.float() * wa + out_b.float() * wb).to(out_a.dtype)
    return out.contiguous(), lse[..., :1].clone().expand(lse.shape)
"""


def _load(src: str) -> types.ModuleType:
    mod = types.ModuleType("sol")
    exec(compile(src, "sol", "exec"), mod.__dict__)
    return mod


def test_the_strided_solutions_really_return_strided_tensors() -> None:
    g = torch.Generator().manual_seed(0)
    B, T, H, D = 2, 5, 3, 4
    x = [torch.randn(B, T, H, D, generator=g).bfloat16(), torch.randn(B, H, T, generator=g)]
    y = [torch.randn(B, T, H, D, generator=g).bfloat16(), torch.randn(B, H, T, generator=g)]
    out, lse = _load(MERGE_STRIDED).merge_attention(x[0], x[1], y[0], y[1])
    assert out.shape == (B, T, H, D) and not out.is_contiguous()
    assert lse.shape == (B, H, T) and not lse.is_contiguous()
    q = torch.randn(B, T, 4, D, generator=g)
    kv = torch.randn(B, T, 2, D, generator=g)
    out, lse = _load(BLOCK_EINSUM).block_attention(q, kv, kv, causal=True)
    assert out.shape == (B, T, 4, D) and lse.shape == (B, 4, T)
    assert not (out.is_contiguous() and lse.is_contiguous())


@pytest.mark.parametrize(
    ("shape", "stride", "shares"),
    [
        ([2, 3, 4], [12, 4, 1], False),  # contiguous
        ([2, 3, 4], [12, 1, 3], False),  # transposed
        ([2, 3, 4], [1, 2, 6], False),  # fully permuted
        ([2, 3, 4], [24, 8, 2], False),  # a slice with gaps
        ([2, 1, 4], [4, 0, 1], False),  # stride 0 on an axis of one
        ([2, 3, 4], [12, 0, 1], True),  # expanded
        ([2, 3, 4], [4, 4, 1], True),  # two axes on the same memory
        ([2, 3, 4], [3, 1, 1], True),  # overlapping rows
        ([0, 3], [0, 0], False),  # no elements
        ([3], [1, 1], True),  # malformed
    ],
)
def test_which_strides_share_memory(shape: list[int], stride: list[int], shares: bool) -> None:
    assert shares_memory_within(shape, stride) is shares
    if shares:
        return
    # every layout judged apart really has distinct offsets
    offsets = {sum(i * s for i, s in zip(idx, stride, strict=True)) for idx in _indices(shape)}
    assert len(offsets) == torch.Size(shape).numel()


def _indices(shape: list[int]) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(n) for n in shape)))


def _desc(t: torch.Tensor) -> dict[str, object]:
    st = t.untyped_storage()
    return {
        "exact": True,
        "dtype": str(t.dtype).replace("torch.", ""),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "device": t.device.type,
        "storage": [st.data_ptr(), st.nbytes()],
    }


def test_the_contract_on_strided_aliased_and_expanded_outputs() -> None:
    q = torch.randn(2, 6, 3, 4)
    inputs = {"q": {"storage": [q.untyped_storage().data_ptr(), q.untyped_storage().nbytes()]}}
    want = ("float32", [2, 3, 6, 4], "cpu")
    fresh = torch.randn(2, 6, 3, 4).transpose(1, 2)
    assert output_violation("out", _desc(fresh), *want, inputs) is None
    alias = q.transpose(1, 2)
    assert "shares storage with input 'q'" in str(
        output_violation("out", _desc(alias), *want, inputs)
    )
    expanded = torch.randn(2, 3, 1, 4).expand(2, 3, 6, 4)
    why = str(output_violation("out", _desc(expanded), *want, inputs))
    assert "one memory location" in why and "[2, 3, 6, 4]" in why


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_digests_and_raw_bytes_read_strides_row_major(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    base = torch.randn(4, 6, 5, generator=g).to(dtype)
    views = [base.transpose(0, 2), base[:, ::2], base[:, :1].expand(4, 6, 5)]
    for v in views:
        c = v.contiguous()
        assert bytes(raw_view(v)) == bytes(raw_view(c))
        assert input_digest(v, 99) == input_digest(c, 99)
        n = c.numel() * c.element_size() // 2
        w = digest_weights(n, 7, "cpu")
        assert output_digest(v, w) == output_digest(c, w)


def test_a_strided_correct_result_passes_tests_and_timed_loop() -> None:
    """The rehearsal covers the timed path: the capture inside the window, its digest, and
    the snapshot the checker reads after the batch."""
    r = grade("attention-merge", MERGE_STRIDED, device="cpu", rehearsal=True)
    assert r.verdict is Verdict.PASS, f"{r.output}\n{r.logs[-2000:]}"
    assert r.timings and r.details.get("rehearsal")
    assert r.roofline is None and all(t.roofline is None for t in r.timings)  # CPU: no roofline


def test_an_einsum_result_passes() -> None:
    r = grade("block-attention", BLOCK_EINSUM, device="cpu")
    assert r.verdict is Verdict.PASS, f"{r.output}\n{r.logs[-2000:]}"


def test_a_strided_alias_of_an_input_is_refused() -> None:
    r = grade("attention-merge", MERGE_ALIAS, device="cpu")
    assert r.verdict is Verdict.TYPE_VIOLATION, r.output
    assert "shares storage with input 'out_a'" in r.output


def test_an_expanded_output_is_refused() -> None:
    r = grade("attention-merge", MERGE_EXPANDED, device="cpu")
    assert r.verdict is Verdict.TYPE_VIOLATION, r.output
    assert "'lse'" in r.output and "one memory location" in r.output
