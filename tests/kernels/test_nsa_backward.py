"""Gradients of ``nsa_attention`` against autograd through ``nsa_attention_naive``.

The path under test follows the environment: plain CPU tensors take the chunked PyTorch path
(autograd through it); with TRITON_INTERPRET=1 (``test_triton_interpret.py`` re-runs this
module that way in a child process) the same tests run the Triton forward and backward
kernels. Every kernel output, gradient buffers included, starts NaN-poisoned, so an element
a kernel forgot to write fails.

The reference is handed our block indices (the selection is a discrete choice: gradients do
not depend on how it was made), and for fp32 inputs the indices must equal its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
import triton

import kernels.nsa.attention as nsa_attention_mod
import kernels.nsa.compressed_bwd as compressed_bwd_mod
import kernels.nsa.selection as selection_mod
import kernels.nsa.selection_bwd as selection_bwd_mod
from kernels.nsa import NSAConfig, nsa_attention, nsa_attention_naive
from kernels.nsa._triton_common import interpreting
from kernels.nsa.config import num_cmp_blocks
from tests.kernels.test_nsa_utils import err_ratio, make_inputs

# All three branches matter at T ≈ 100: 7 selection blocks (4 chosen), window 32, Tc ≈ 11.
CFG = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=4, window=32)
GIVEN = replace(CFG, compress="given")
# l′/d = 3 is not a power of two: the forward's compressed branch falls back to PyTorch, the
# backward still runs the Triton kernels on its o_cmp / lse_cmp; a custom softmax scale
ODD_RATIO = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=24, sel_count=4, window=20, scale=0.3)
# d = 2: from t ≈ 65 on a row sees ≥ 32 compressed blocks, so the compressed backward's
# mask-free tiles (dq's interior blocks, dk̃/dṽ's interior query tiles) run under the
# interpreter's 32-wide tiles, not only their masked edges.
FINE = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=8, sel_count=4, window=16)
# l′ = 64 as in the paper: the selection kernels' block tile can be split into key sub-tiles
SUBTILES = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=64, sel_count=3, sel_local=1, window=32)
NAMES = ("q", "k", "v", "gates", "k_cmp", "v_cmp")


@pytest.fixture(autouse=True)
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nsa_attention_mod, "POISON_OUTPUTS", True)


# The Triton backward's ways to the selection's dq: added by the dk/dv kernel (the default),
# by its own kernel, or read back from the dS the dk/dv kernel stored. Each stays covered
# whichever is the default.
SELECTION_DQ = ["fused", "separate", "ds"]


def _spy_dq_kernel(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The selection dq kernel's launches from now on (either tuner: recomputing, or reading a
    stored dS back), each as its FROM_DS flag."""
    launched: list[bool] = []

    class Spy:
        def __init__(self, real: object) -> None:
            self.real = real

        def __getitem__(self, grid: object) -> Callable[..., object]:
            def launch(*args: object, **kw: object) -> object:
                launched.append(bool(kw.get("FROM_DS")))
                return self.real[grid](*args, **kw)  # type: ignore[index]

            return launch

    for name in ("nsa_selection_bwd_dq_kernel", "nsa_selection_bwd_dq_from_ds_kernel"):
        monkeypatch.setattr(selection_bwd_mod, name, Spy(getattr(selection_bwd_mod, name)))
    return launched


def _use_selection_dq(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    if name != nsa_attention_mod.DEFAULT_VARIANTS["selection_dq"] and not interpreting():
        pytest.skip("the PyTorch path has no selection dq variants (run once, at the default)")
    monkeypatch.setitem(nsa_attention_mod.VARIANTS, "selection_dq", name)


def _inputs(
    b: int,
    t: int,
    hq: int,
    hkv: int,
    dk: int,
    dv: int,
    dtype: torch.dtype,
    cfg: NSAConfig,
    seed: int,
) -> dict[str, torch.Tensor]:
    q, k, v, gates = make_inputs(b, t, hq, hkv, dk, dtype, dv=dv, seed=seed)
    x = {"q": q, "k": k, "v": v, "gates": gates}
    if cfg.compress == "given":
        gen = torch.Generator().manual_seed(seed + 100)
        tc = num_cmp_blocks(t, cfg)
        x["k_cmp"] = torch.randn(b, tc, hkv, dk, generator=gen).to(dtype)
        x["v_cmp"] = torch.randn(b, tc, hkv, dv, generator=gen).to(dtype)
    return x


def _run(
    x: dict[str, torch.Tensor],
    cfg: NSAConfig,
    wanted: tuple[str, ...],
    dout: torch.Tensor | None = None,
    block_indices: torch.Tensor | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
    """Our gradients and the reference's for the inputs named in ``wanted``."""
    ours = {n: t.detach().clone().requires_grad_(n in wanted) for n, t in x.items()}
    kw = {n: ours[n] for n in ("k_cmp", "v_cmp") if n in ours}
    out, aux = nsa_attention(
        ours["q"], ours["k"], ours["v"], ours["gates"], cfg, return_aux=True,
        block_indices=block_indices, **kw,
    )  # fmt: skip
    assert out.requires_grad and out.dtype == x["q"].dtype
    gen = torch.Generator().manual_seed(99)
    if dout is None:
        dout = torch.randn(out.shape, generator=gen).to(out.dtype)
    grads = torch.autograd.grad(out, [ours[n] for n in wanted], dout)
    got = dict(zip(wanted, grads, strict=True))
    # reference: fp32 copies of the same (rounded) values, our indices
    ref_in = {n: t.detach().float().requires_grad_(n in wanted) for n, t in x.items()}
    ref_kw = {n: ref_in[n] for n in ("k_cmp", "v_cmp") if n in ref_in}
    ref_out, ref_aux = nsa_attention_naive(
        ref_in["q"], ref_in["k"], ref_in["v"], ref_in["gates"], cfg, return_aux=True,
        block_indices=aux.block_indices, **ref_kw,
    )  # fmt: skip
    ref_grads = torch.autograd.grad(ref_out, [ref_in[n] for n in wanted], dout.float())
    want = dict(zip(wanted, ref_grads, strict=True))
    if x["q"].dtype == torch.float32 and block_indices is None:
        _, own = nsa_attention_naive(
            ref_in["q"], ref_in["k"], ref_in["v"], ref_in["gates"], cfg, return_aux=True,
            **ref_kw,
        )  # fmt: skip
        assert torch.equal(aux.block_indices, own.block_indices), "block_indices differ"
    assert err_ratio(out.detach(), ref_out.detach()) <= 1e-5 * (
        1 if x["q"].dtype == torch.float32 else 500
    )
    return got, want, aux.block_indices


def _check(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    tight = dtype == torch.float32
    limit = 1e-5 if tight else 1e-2  # spec §4.3 stage 2: grads ≤ 1e-2 (bf16)
    for name, g in got.items():
        ref = want[name]
        assert g.shape == ref.shape, name
        assert not torch.isnan(g).any(), f"NaN in d{name} (unwritten gradient element?)"
        if g.numel() == 0:
            continue
        er = err_ratio(g, ref)
        assert er <= limit, f"d{name} err_ratio {er:.2e} > {limit}"
        atol = 1e-5 if tight else 2e-2
        scale = ref.abs().max().item()
        torch.testing.assert_close(g.float(), ref, atol=atol * max(scale, 1.0), rtol=atol)


CASES = [
    # (b, t, hq, hkv, dk, dv, dtype, cfg): odd T, G ∈ {1, 2, 4, 8}, Dk ≠ Dv, both modes
    (2, 97, 4, 1, 16, 32, torch.float32, CFG),
    (1, 101, 2, 2, 16, 16, torch.bfloat16, GIVEN),
    (1, 83, 8, 1, 32, 16, torch.float16, CFG),
    (1, 70, 2, 1, 16, 16, torch.float32, GIVEN),
    (1, 75, 4, 2, 24, 40, torch.float32, ODD_RATIO),  # head dims not powers of two
    (1, 203, 4, 1, 16, 16, torch.float32, FINE),
]


@pytest.mark.parametrize("selection_dq", SELECTION_DQ)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_gradients_match_naive(
    case: int, selection_dq: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    b, t, hq, hkv, dk, dv, dtype, cfg = CASES[case]
    _use_selection_dq(monkeypatch, selection_dq)
    x = _inputs(b, t, hq, hkv, dk, dv, dtype, cfg, seed=t + hq)
    wanted = tuple(n for n in NAMES if n in x)
    got, want, _ = _run(x, cfg, wanted)
    for name in wanted:
        assert got[name].dtype == x[name].dtype, name
    _check(got, want, dtype)


@pytest.mark.parametrize("case", [0, 5])
def test_selection_v5_gradients_match_naive(case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Selection variant v5 (the forced blocks attended to by the window kernel, merged into
    the picked ones' softmax) keeps what the backward reads: o_slc, lse_slc, o_win."""
    b, t, hq, hkv, dk, dv, dtype, cfg = CASES[case]
    monkeypatch.setitem(nsa_attention_mod.VARIANTS, "selection", "v5")
    x = _inputs(b, t, hq, hkv, dk, dv, dtype, cfg, seed=t + hq)
    wanted = tuple(n for n in NAMES if n in x)
    got, want, _ = _run(x, cfg, wanted)
    _check(got, want, dtype)


def test_only_requested_gradients_are_computed() -> None:
    """Inputs that do not require grad get none; the others are still right."""
    x = _inputs(1, 53, 2, 1, 16, 16, torch.float32, GIVEN, seed=5)
    got, want, _ = _run(x, GIVEN, ("q", "gates"))
    _check(got, want, torch.float32)
    got, want, _ = _run(x, GIVEN, ("k_cmp", "v"))
    _check(got, want, torch.float32)
    # .backward(): leaves that do not require grad keep .grad None
    q, k, v, gates = (x[n].clone() for n in ("q", "k", "v", "gates"))
    k.requires_grad_(True)
    out = nsa_attention(q, k, v, gates, GIVEN, k_cmp=x["k_cmp"], v_cmp=x["v_cmp"])
    out.float().square().sum().backward()  # a non-uniform upstream gradient
    assert k.grad is not None and not torch.isnan(k.grad).any()
    assert q.grad is None and v.grad is None and gates.grad is None
    # no graph without grad mode, and the no-grad output is the same
    with torch.no_grad():
        out2 = nsa_attention(q, k, v, gates, GIVEN, k_cmp=x["k_cmp"], v_cmp=x["v_cmp"])
    assert not out2.requires_grad
    torch.testing.assert_close(out2, out.detach(), atol=0, rtol=0)


@pytest.mark.parametrize("selection_dq", SELECTION_DQ)
def test_given_indices_with_holes_and_expanded_dout(
    selection_dq: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given block_indices (−1 holes, shuffled slots) are the ones the backward uses; the
    selection dk/dv kernel splits every block's queries over several chunks (atomics), the
    compressed dk̃/dṽ kernel its queries over several segments (partial sums), the
    upstream gradient is the stride-0 one of .sum(), and q and gates are strided views.
    With stored dS, a hole's slot is never written (NaN-poisoned) and must not be read."""
    _use_selection_dq(monkeypatch, selection_dq)
    monkeypatch.setattr(selection_bwd_mod, "CHUNK_ROWS", 8)
    monkeypatch.setattr(compressed_bwd_mod, "SEG_ROWS", 64)
    b, t, hkv = 1, 70, 2
    x = _inputs(b, t, 4, hkv, 16, 16, torch.float32, CFG, seed=8)
    # strided inputs: q a transposed [B, Hq, T, D] tensor, gates a slice of a wider one
    x["q"] = x["q"].transpose(1, 2).contiguous().transpose(1, 2)
    x["gates"] = torch.cat([x["gates"], x["gates"][..., :1]], dim=-1)[..., :3]
    assert not x["q"].is_contiguous() and not x["gates"].is_contiguous()
    idx = torch.full((b, t, hkv, CFG.sel_count), -1, dtype=torch.int32)
    for pos in range(t):
        cur = pos // CFG.sel_block
        for grp in range(hkv):
            chosen = sorted({0, cur} | ({(pos + grp) % (cur + 1)} if pos % 3 else set()))
            row = [*chosen, *([-1] * (CFG.sel_count - len(chosen)))]
            idx[0, pos, grp] = torch.tensor(row[::-1] if pos % 2 else row)
    dout = torch.ones(b, t, 4, 16).expand(b, t, 4, 16)
    got, want, used = _run(x, CFG, ("q", "k", "v", "gates"), dout=dout, block_indices=idx)
    assert torch.equal(used, idx)
    _check(got, want, torch.float32)


@pytest.mark.parametrize("selection_dq", SELECTION_DQ)
def test_one_hot_gates_and_bf16_gates(selection_dq: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A branch whose gate is 0 contributes no gradient; gates' gradient keeps their dtype.
    G = 16 (the paper's group): the selection dq kernel walks one position per program, the
    fused dk/dv kernel's row tiles hold whole positions."""
    _use_selection_dq(monkeypatch, selection_dq)
    q, k, v, gates = make_inputs(1, 64, 16, 1, 16, torch.bfloat16, seed=3, gates="slc")
    x = {"q": q, "k": k, "v": v, "gates": gates.to(torch.bfloat16)}
    got, want, _ = _run(x, CFG, ("q", "k", "v", "gates"))
    assert got["gates"].dtype == torch.bfloat16
    _check(got, want, torch.bfloat16)


def test_short_sequence_without_compressed_blocks() -> None:
    """T < l: no compressed block exists (Tc = 0); the other branches still train."""
    x = _inputs(1, 12, 2, 1, 16, 16, torch.float32, GIVEN, seed=2)
    assert x["k_cmp"].shape[1] == 0
    got, want, _ = _run(x, GIVEN, NAMES)
    assert got["k_cmp"].shape == x["k_cmp"].shape
    _check(got, want, torch.float32)


def test_16bit_dot_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's 16-bit dots, forced under the interpreter (whose fp16 dots are exact; bf16
    ones are broken there, spec §5): fp16 operands with fp32 accumulation in every backward
    kernel, and k̃ stored as fp16 hi + lo parts, as for bf16/fp16 inputs on a GPU, so the
    compressed backward takes its KC_SPLIT branch. On the PyTorch path this is one more
    fp16 case."""
    import kernels.nsa.window_bwd as window_bwd_mod

    def gpu_dots(dtype: torch.dtype) -> bool:
        return dtype == torch.float32

    for mod in (window_bwd_mod, selection_bwd_mod, compressed_bwd_mod):
        monkeypatch.setattr(mod, "dot_f32", gpu_dots)
    monkeypatch.setattr(nsa_attention_mod, "_compressed_dtype", lambda *xs: torch.float16)
    x = _inputs(1, 67, 4, 2, 16, 32, torch.float16, CFG, seed=13)
    got, want, _ = _run(x, CFG, ("q", "k", "v", "gates"))
    _check(got, want, torch.float16)


@pytest.mark.skipif(not interpreting(), reason="key tiles exist only in the Triton kernels")
@pytest.mark.parametrize("ksplit", [1, 2, 4])
def test_selection_key_subtiles(ksplit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The selection forward and dq kernels walking each selected block whole (KSPLIT 1) or
    in 2 (the GPU's default) or 4 key tiles of 32 or 16 keys (online softmax across them)
    give the reference's output and gradients. The other tests here have l′ ≤ 16, where the
    interpreter's default split would leave tiles under tl.dot's 16 keys: it keeps them whole.
    The dq kernel runs with the selection dq "separate" (recomputing) and "ds" (reading the
    stored dS back per key tile)."""
    for tuner in (
        selection_mod.nsa_selection_fwd_kernel_v2,
        selection_bwd_mod.nsa_selection_bwd_dq_kernel,
        selection_bwd_mod.nsa_selection_bwd_dq_from_ds_kernel,
    ):
        conf = triton.Config({"NUM_STAGES": 1, "KSPLIT": ksplit}, num_warps=4, num_stages=1)
        monkeypatch.setattr(tuner, "configs", [conf])
        monkeypatch.setattr(tuner, "cache", {})
    x = _inputs(1, 157, 16, 1, 16, 16, torch.float32, SUBTILES, seed=ksplit)
    for dq_path in ("separate", "ds"):
        monkeypatch.setitem(nsa_attention_mod.VARIANTS, "selection_dq", dq_path)
        got, want, _ = _run(x, SUBTILES, ("q", "k", "v", "gates"))
        _check(got, want, torch.float32)


@pytest.mark.skipif(not interpreting(), reason="fused dq exists only in the Triton kernels")
@pytest.mark.parametrize("case", [0, 1])  # batch 2 and G 4 in fp32; bf16 with G 1
def test_selection_fused_dq(case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """dq added by the selection dk/dv kernel (atomics per row and chosen block), blocks split
    over several chunks, gives the reference's gradients, and the dq kernel does not run."""
    b, t, hq, hkv, dk, dv, dtype, cfg = CASES[case]
    monkeypatch.setenv("KGRADE_NSA_SELECTION_DQ", "fused")
    monkeypatch.setattr(selection_bwd_mod, "CHUNK_ROWS", 8)
    launched = _spy_dq_kernel(monkeypatch)
    x = _inputs(b, t, hq, hkv, dk, dv, dtype, cfg, seed=t + hq + 1)
    got, want, _ = _run(x, cfg, tuple(n for n in NAMES if n in x))
    _check(got, want, dtype)
    assert not launched, "the dq kernel ran although dq was fused"
    # the environment picks either way, and a typo is an error
    monkeypatch.setenv("KGRADE_NSA_SELECTION_DQ", "separate")
    _run(x, cfg, ("q", "k", "v"))
    assert launched, "KGRADE_NSA_SELECTION_DQ=separate did not run the dq kernel"
    monkeypatch.setenv("KGRADE_NSA_SELECTION_DQ", "fuse")
    with pytest.raises(ValueError, match="KGRADE_NSA_SELECTION_DQ"):
        _run(x, cfg, ("q",))


@pytest.mark.skipif(not interpreting(), reason="the dq paths exist only in the Triton kernels")
def test_selection_dq_paths_overwrite_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """dq_acc=False: the fused and stored-dS paths overwrite a NaN dq as the dq kernel does
    (the fused atomics only add, so it clears dq first); dk and dv are the same every way.
    Stored dS runs the dq kernel reading it back (FROM_DS) under DS_MAX_BYTES, and the fused
    path above it or when the buffer's allocation runs out of memory; an unknown path is an
    error."""
    from kernels.nsa._bwd_common import bwd_preprocess
    from kernels.nsa.attention import check_fast_args
    from kernels.nsa.backward import _forward_parts

    q, k, v, gates = make_inputs(1, 70, 4, 1, 16, torch.float32, seed=3)
    dims = check_fast_args(q, k, v, gates, CFG, None, None, None)
    parts = _forward_parts(q, k, v, gates, None, None, None, CFG, dims)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4))
    dd = bwd_preprocess(dout, *parts["o"])
    sel = (q, k, v, parts["idx"], dout, parts["lse"][1], dd, gates, CFG, dims.scale)
    launched = _spy_dq_kernel(monkeypatch)  # FROM_DS of each dq kernel launch

    poisoned = functools.partial(torch.full, fill_value=float("nan"))

    def run(path: str, alloc: Callable[..., torch.Tensor] = poisoned) -> tuple[torch.Tensor, ...]:
        launched.clear()
        dq = torch.full(q.shape, float("nan"))
        dk, dv = torch.zeros(k.shape), torch.zeros(v.shape)
        selection_bwd_mod.selection_bwd_triton(
            *sel, dq=dq, dk=dk, dv=dv, dq_acc=False, dq_path=path, alloc=alloc
        )
        return dq, dk, dv

    want = run("separate")
    assert launched == [False], "separate: the dq kernel recomputing P and dP"
    for path, runs in (("fused", []), ("ds", [True])):
        got = run(path)
        assert launched == runs, f"{path}: dq kernel launches {launched}"
        for a, b in zip(want, got, strict=True):
            assert not b.isnan().any(), path
            torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)

    def out_of_memory(*args: object, **kw: object) -> torch.Tensor:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    got = run("ds", alloc=out_of_memory)
    assert launched == [], "with no memory for the buffer, ds runs fused"
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
    monkeypatch.setattr(selection_bwd_mod, "DS_MAX_BYTES", 0)  # the buffer would not fit
    got = run("ds")
    assert launched == [], "over the cap, ds runs fused"
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="dq_path"):
        run("fuse")


@pytest.mark.skipif(not interpreting(), reason="dq_out exists only in the Triton kernels")
@pytest.mark.parametrize("acc", [False, True])
def test_compressed_dq_out(acc: bool) -> None:
    """dq_out: the compressed dq kernel, the backward's last to add into dq, writes the
    finished dq in dq_out's dtype (what dq.to(dtype) would give) and leaves dq alone."""
    from kernels.nsa._bwd_common import bwd_preprocess
    from kernels.nsa.attention import check_fast_args
    from kernels.nsa.backward import _forward_parts
    from kernels.nsa.compressed_bwd import compressed_bwd_triton

    q, k, v, gates = make_inputs(1, 203, 4, 2, 16, torch.float32, seed=11)
    dims = check_fast_args(q, k, v, gates, FINE, None, None, None)
    parts = _forward_parts(q, k, v, gates, None, None, None, FINE, dims)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(12))
    dd = bwd_preprocess(dout, *parts["o"])
    args = (q, parts["kc32"], parts["vc"], dout, parts["lse"][0], dd, gates, FINE, dims.scale)
    prior = torch.randn(q.shape, generator=torch.Generator().manual_seed(13))
    dq = prior.clone() if acc else torch.full(q.shape, float("nan"))
    compressed_bwd_triton(*args, parts["split"], dq=dq, dkc=None, dvc=None, dq_acc=acc)
    want = dq.half()
    dq = prior.clone() if acc else torch.full(q.shape, float("nan"))
    out = torch.full(q.shape, float("nan"), dtype=torch.float16)
    compressed_bwd_triton(*args, parts["split"], dq=dq, dkc=None, dvc=None, dq_acc=acc, dq_out=out)
    assert torch.equal(out, want)
    assert torch.equal(dq, prior) if acc else bool(dq.isnan().all()), "dq was written"


def test_double_backward() -> None:
    """Second-order gradients: autograd through the PyTorch path gives them; the Triton
    backward is first-order only and says so instead of dropping the second-order terms."""
    from kernels.nsa._triton_common import use_triton

    q, k, v, gates = make_inputs(1, 40, 2, 1, 16, torch.float32, seed=6)
    q.requires_grad_(True)
    out = nsa_attention(q, k, v, gates, CFG)
    if use_triton(q):
        with pytest.raises(NotImplementedError, match=r"double backward.*create_graph=True"):
            torch.autograd.grad(out.square().sum(), q, create_graph=True)
        return
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    (ddq,) = torch.autograd.grad(dq.square().sum(), q)
    ref = nsa_attention_naive(q, k, v, gates, CFG)
    (rdq,) = torch.autograd.grad(ref.square().sum(), q, create_graph=True)
    (rddq,) = torch.autograd.grad(rdq.square().sum(), q)
    assert err_ratio(ddq, rddq) <= 1e-4
