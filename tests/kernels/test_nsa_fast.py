"""The CPU fast path (chunked PyTorch) of ``nsa_attention`` against the naive reference."""

from __future__ import annotations

import pytest
import torch

import kernels.nsa.torch_path as torch_path
from kernels.nsa import NSAConfig, nsa_attention
from kernels.nsa.torch_path import compress_mean_fast
from tests.kernels.test_nsa_utils import (
    MID,
    PAPER,
    SMALL,
    assert_matches,
    make_inputs,
    planted_inputs,
    reference,
)

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "hq", "hkv"), [(77, 2, 2), (200, 8, 4), (333, 16, 4), (130, 8, 1)])
def test_fast_matches_naive(t: int, hq: int, hkv: int, dtype: torch.dtype) -> None:
    q, k, v, gates = make_inputs(2, t, hq, hkv, 32, dtype, seed=t + hq)
    out, aux = nsa_attention(q, k, v, gates, MID, return_aux=True)
    ref_out, ref_aux = reference(q, k, v, gates, MID)
    assert_matches(out, aux, ref_out, ref_aux, dtype)


@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
def test_all_group_sizes_paper_config(group: int) -> None:
    q, k, v, gates = make_inputs(1, 300, group, 1, 16, torch.float32, seed=group)
    cfg = NSAConfig(window=100, sel_count=4)  # paper blocks, fewer slots so T=300 is sparse
    out, aux = nsa_attention(q, k, v, gates, cfg, return_aux=True)
    ref_out, ref_aux = reference(q, k, v, gates, cfg)
    assert_matches(out, aux, ref_out, ref_aux, torch.float32)


@pytest.mark.parametrize("branch", ["cmp", "slc", "win"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_hot_gates(branch: str, dtype: torch.dtype) -> None:
    q, k, v, gates = make_inputs(1, 200, 4, 2, 32, dtype, seed=7, gates=branch)
    out, aux = nsa_attention(q, k, v, gates, MID, return_aux=True)
    ref_out, ref_aux = reference(q, k, v, gates, MID)
    assert_matches(out, aux, ref_out, ref_aux, dtype)


def test_dk_differs_from_dv_and_custom_scale() -> None:
    cfg = NSAConfig(
        cmp_block=16, cmp_stride=8, sel_block=16, sel_count=4, sel_local=1, window=30, scale=0.3
    )
    q, k, v, gates = make_inputs(1, 90, 4, 2, 24, torch.float32, dv=40, seed=2)
    out, aux = nsa_attention(q, k, v, gates, cfg, return_aux=True)
    ref_out, ref_aux = reference(q, k, v, gates, cfg)
    assert out.shape == (1, 90, 4, 40)
    assert_matches(out, aux, ref_out, ref_aux, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_given_block_indices(dtype: torch.dtype) -> None:
    q, k, v, gates = make_inputs(1, 150, 4, 2, 32, dtype, seed=11)
    _, ref_aux = reference(q, k, v, gates, MID)
    idx = ref_aux.block_indices
    # drop one non-forced choice per row (−1 slot) and shuffle the slot order
    idx2 = idx.clone()
    idx2[..., 2] = torch.where(idx2[..., 2] > 0, -1, idx2[..., 2])
    idx2 = idx2.flip(-1)
    out, aux = nsa_attention(q, k, v, gates, MID, block_indices=idx2, return_aux=True)
    ref_out2, ref_aux2 = reference(q, k, v, gates, MID, block_indices=idx2)
    assert torch.equal(aux.block_indices, idx2.to(torch.int32))
    assert_matches(out, aux, ref_out2, ref_aux2, dtype)
    # the computed indices used as given reproduce the computed result
    out_c = nsa_attention(q, k, v, gates, MID)
    out_g = nsa_attention(q, k, v, gates, MID, block_indices=idx.long())
    assert torch.equal(out_c, out_g)


def test_given_compression() -> None:
    cfg = NSAConfig(
        cmp_block=16, cmp_stride=8, sel_block=32, sel_count=5, window=40, compress="given"
    )
    q, k, v, gates = make_inputs(1, 120, 4, 2, 32, torch.float32, seed=4)
    gen = torch.Generator().manual_seed(9)
    tc = (120 - 16) // 8 + 1
    kc = torch.randn(1, tc, 2, 32, generator=gen)
    vc = torch.randn(1, tc, 2, 32, generator=gen)
    out, aux = nsa_attention(q, k, v, gates, cfg, k_cmp=kc, v_cmp=vc, return_aux=True)
    ref_out, ref_aux = reference(q, k, v, gates, cfg, k_cmp=kc, v_cmp=vc)
    assert_matches(out, aux, ref_out, ref_aux, torch.float32)


def test_staged_protocol_planted_scores() -> None:
    """Stage 1: identical index sets on planted well-separated scores; stage 2 given them."""
    q, k, v, gates, expected = planted_inputs(333, 8, 2, 32, MID, torch.bfloat16, seed=1)
    out, aux = nsa_attention(q, k, v, gates, MID, return_aux=True)
    for t in range(333):
        for g in range(2):
            assert {int(j) for j in aux.block_indices[0, t, g] if j >= 0} == expected[t][g]
    ref_out, ref_aux = reference(q, k, v, gates, MID, block_indices=aux.block_indices)
    assert_matches(out, aux, ref_out, ref_aux, torch.bfloat16)


def test_short_sequences_and_tiny_t() -> None:
    for t in (1, 5, 31, 32, 33, 64, 65):
        q, k, v, gates = make_inputs(1, t, 4, 1, 16, torch.float32, seed=t)
        out, aux = nsa_attention(q, k, v, gates, PAPER, return_aux=True)
        ref_out, ref_aux = reference(q, k, v, gates, PAPER)
        assert_matches(out, aux, ref_out, ref_aux, torch.float32)


def test_chunking_does_not_change_results(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v, gates = make_inputs(1, 170, 4, 2, 16, torch.float32, seed=3)
    full = nsa_attention(q, k, v, gates, SMALL, return_aux=True)
    monkeypatch.setattr(torch_path, "_CHUNK_ELEMS", 3000)  # force many small chunks
    small = nsa_attention(q, k, v, gates, SMALL, return_aux=True)
    assert torch.equal(full[1].block_indices, small[1].block_indices)
    assert torch.allclose(full[0], small[0], atol=1e-6, rtol=1e-6)


def test_non_power_of_two_ratio_config() -> None:
    cfg = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=24, sel_count=4, window=20)
    q, k, v, gates = make_inputs(1, 101, 4, 2, 16, torch.float32, seed=8)
    out, aux = nsa_attention(q, k, v, gates, cfg, return_aux=True)
    ref_out, ref_aux = reference(q, k, v, gates, cfg)
    assert_matches(out, aux, ref_out, ref_aux, torch.float32)


def test_compress_mean_fast_matches_unfold() -> None:
    from kernels.nsa.naive import compress_mean

    k = torch.randn(2, 203, 3, 8)
    for cfg in (PAPER, SMALL, MID):
        got = compress_mean_fast(k, cfg, torch.float32)
        assert torch.allclose(got, compress_mean(k, cfg), atol=1e-6, rtol=1e-5)


def test_random_inputs_index_agreement_bf16() -> None:
    """Stage 3 flavour: bf16 inputs, indices from the fast path vs the fp32 reference."""
    q, k, v, gates = make_inputs(1, 400, 8, 2, 32, torch.bfloat16, seed=21)
    _, aux = nsa_attention(q, k, v, gates, MID, return_aux=True)
    _, ref_aux = reference(q, k, v, gates, MID)
    same = (aux.block_indices == ref_aux.block_indices).all(-1).float().mean().item()
    assert same >= 0.999


def test_gradients_flow_and_no_grad_inference_is_unchanged() -> None:
    """nsa_attention used to be forward-only (NotImplementedError when an input required
    grad); it now trains: gradients reach the inputs that require them and match the
    reference, and the no-grad forward on the same tensors is unchanged."""
    from kernels.nsa.naive import nsa_attention_naive

    torch.manual_seed(0)
    cfg = NSAConfig()
    q = torch.randn(1, 64, 4, 32, requires_grad=True)
    k, v = torch.randn(1, 64, 2, 32), torch.randn(1, 64, 2, 32)
    gates = torch.rand(1, 64, 4, 3, requires_grad=True)
    out = nsa_attention(q, k, v, gates, cfg)
    assert out.requires_grad
    dq, dg = torch.autograd.grad(out.square().sum(), [q, gates])
    ref = nsa_attention_naive(q, k, v, gates, cfg)
    rq, rg = torch.autograd.grad(ref.square().sum(), [q, gates])
    torch.testing.assert_close(dq, rq, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(dg, rg, atol=2e-5, rtol=2e-5)
    with torch.no_grad():  # inference on the same tensors is fine, and matches the reference
        out_ng = nsa_attention(q, k, v, gates, cfg)
    assert not out_ng.requires_grad
    torch.testing.assert_close(out_ng, ref.detach(), atol=2e-5, rtol=2e-5)
    assert torch.equal(out_ng, out.detach())
    out = nsa_attention(q.detach(), k, v, gates.detach(), cfg)
    assert not out.requires_grad


def test_peak_abs_over_mixed_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fp16 range check reads max |x| over q, k, v (and a given k̃, ṽ) in one launch,
    in the same host sync as the gates' range check."""
    import kernels.nsa.attention as attention
    from kernels.nsa.attention import _compressed_dtype
    from kernels.nsa.validate import ValueChecks

    def check_values(gates: torch.Tensor, peak_of: tuple | None) -> float | None:
        return ValueChecks(gates, peak_of).read()  # launched and read at once

    monkeypatch.setattr(attention, "interpreting", lambda: False)  # as on the GPU

    q = torch.randn(2, 8, 3, 4).bfloat16()
    k = torch.randn(2, 8, 1, 4).bfloat16()
    kc = torch.randn(2, 3, 1, 4)  # fp32, as a given compression may be
    gates = torch.rand(2, 8, 3, 3).bfloat16()
    k[1, 5, 0, 2] = -41000.0  # the peak is a negative value, past fp16's 30000 guard
    assert check_values(gates, (q, k, None, kc, q[:, :0])) == float(k.float().abs().max())
    assert check_values(gates, (q, None)) == float(q.float().abs().max())
    assert check_values(gates, None) is None
    assert check_values(gates, (q[:, :0],)) == 0.0  # nothing to read: fp16 is safe
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        check_values(gates - 1, (q,))  # the peak read does not skip the gates' check
    assert _compressed_dtype(q, check_values(gates, (q, q, q))) == torch.float16
    assert _compressed_dtype(q, check_values(gates, (q, k, q))) == torch.bfloat16  # 41000
    k[0, 0, 0, 0] = float("nan")
    peak = check_values(gates, (q, k))
    assert peak != peak  # NaN propagates: bf16 storage, never fp16
    assert _compressed_dtype(q, peak) == torch.bfloat16
    assert _compressed_dtype(q.half(), None) == torch.float16  # fp16 inputs need no read


def test_late_peak_is_read_from_its_kernel_or_computed() -> None:
    """``late``: a tensor whose max |x| a kernel delivers (the compressed branch's, for q)
    instead of the checks' own launch; read takes the kernel's value when one was delivered
    (``late_done``), computes it when none was, and NaN wins either way."""
    from kernels.nsa.validate import ValueChecks

    q = torch.randn(2, 8, 3, 4).bfloat16()
    k = torch.randn(2, 8, 1, 4).bfloat16()
    gates = torch.rand(2, 8, 3, 3).bfloat16()
    q[1, 2, 0, 3] = -900.0
    assert ValueChecks(gates, (k,), late=q).read() == 900.0  # no kernel: computed at read
    assert ValueChecks(gates, None, late=q).read() == 900.0
    assert ValueChecks(gates, (k,), late=q[:, :0]).read() == float(k.float().abs().max())
    assert ValueChecks(gates, (k,)).late_peak() is None

    checks = ValueChecks(gates, (k,), late=q)
    buf = checks.late_peak()
    assert buf is not None and buf.dtype == torch.float32 and float(buf) == 0.0
    assert checks.late_peak() is buf  # one buffer for the call
    buf.fill_(40000.0)  # what the kernel wrote: read takes it, it does not read q again
    checks.late_done()
    assert checks.read() == 40000.0
    checks = ValueChecks(gates, (k,), late=q)
    checks.late_peak().fill_(float("nan"))  # type: ignore[union-attr]
    checks.late_done()
    peak = checks.read()
    assert peak is not None and peak != peak
    k[0, 0, 0, 0] = float("nan")
    peak = ValueChecks(gates, (k,), late=q).read()
    assert peak is not None and peak != peak
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ValueChecks(gates - 1, (k,), late=q).read()


def test_deferred_checks_guess_then_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_nsa_args(defer=True) only launches the value checks: bad gates raise when they
    are read (``settled``), k̃'s storage is guessed fp16 meanwhile, and ``settle_dtype``
    names the storage to run again with when a value proves past fp16's range."""
    import kernels.nsa.attention as attention
    from kernels.nsa.attention import launch_dtype, settle_dtype
    from kernels.nsa.validate import check_nsa_args

    monkeypatch.setattr(attention, "interpreting", lambda: False)  # as on the GPU
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=8)
    q = torch.randn(1, 40, 2, 8).bfloat16()
    k = torch.randn(1, 40, 1, 8).bfloat16()
    v = torch.randn(1, 40, 1, 8).bfloat16()
    gates = torch.rand(1, 40, 2, 3).bfloat16()

    def dims_of(gates: torch.Tensor, **kw: bool):  # type: ignore[no-untyped-def]
        return check_nsa_args(q, k, v, gates, cfg, None, None, None, peak_abs=True, **kw)

    pending = dims_of(gates - 1, defer=True)  # no error yet: nothing was read
    assert pending.peak_abs is None and pending.checks is not None
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        pending.settled()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        dims_of(gates - 1)  # read at once without defer

    pending = dims_of(gates, defer=True)
    assert launch_dtype(q, pending) == torch.float16  # the guess
    final, again = settle_dtype(q, pending)
    assert final.checks is None and final.peak_abs == max(
        float(x.float().abs().max()) for x in (q, k, v)
    )
    assert again is None and launch_dtype(q, final) == torch.float16
    assert final == dims_of(gates)  # the same dims as reading at once
    late = dims_of(gates, defer=True, late_q=True)  # q left to a kernel that never ran
    assert late.checks is not None and late.checks.late_peak() is not None
    assert late.settled() == final

    v[0, 3, 0, 1] = 41000.0
    pending = dims_of(gates, defer=True)
    assert launch_dtype(q, pending) == torch.float16
    final, again = settle_dtype(q, pending)
    assert final.peak_abs == 40960.0 and again == torch.bfloat16  # 41000 in bf16
    assert launch_dtype(q, final) == torch.bfloat16
    settled = dims_of(gates)
    assert settle_dtype(q, settled) == (settled, None)  # nothing pending: nothing to redo
