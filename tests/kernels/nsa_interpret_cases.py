"""NSA Triton kernels under the Triton CPU interpreter, against the naive reference.

These only run in a process started with TRITON_INTERPRET=1 (set before Triton is imported),
which ``test_triton_interpret.py`` launches. Sizes stay
tiny: the interpreter executes each program instance one by one in numpy.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

import kernels.nsa.attention as nsa_attention_mod
import kernels.nsa.compressed as compressed_mod
from kernels.nsa import NSAConfig, nsa_attention
from kernels.nsa._bwd_common import bwd_preprocess
from kernels.nsa.attention import _split_fp16
from kernels.nsa.compressed import banded_scores_ok
from kernels.nsa.config import num_cmp_blocks, num_sel_blocks, omega_matrix
from kernels.nsa.selection import SELECTION_IMPLS, forced_and_combined
from kernels.nsa.topn import TOPN_FORMS, TopnForm, topn_triton
from kernels.nsa.torch_path import compressed_torch
from kernels.nsa.window import window_triton
from tests.kernels.test_nsa_utils import (
    MID,
    SMALL,
    assert_matches,
    assert_rounds_alike,
    make_inputs,
    planted_inputs,
    reference,
)

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="interpreter cases: run through test_triton_interpret.py (sets TRITON_INTERPRET=1)",
)


@pytest.fixture(autouse=True)
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every kernel output starts as NaN: an element a kernel forgot to write fails the test.
    monkeypatch.setattr(nsa_attention_mod, "POISON_OUTPUTS", True)


@pytest.mark.parametrize(
    ("t", "hq", "hkv", "dtype", "gates"),
    [
        (77, 4, 2, torch.float32, None),
        (61, 16, 1, torch.bfloat16, None),
        (50, 8, 1, torch.float32, "slc"),
        (45, 1, 1, torch.bfloat16, "cmp"),
        (40, 2, 1, torch.float32, "win"),
    ],
)
def test_triton_matches_naive(
    t: int, hq: int, hkv: int, dtype: torch.dtype, gates: str | None
) -> None:
    q, k, v, g = make_inputs(1, t, hq, hkv, 16, dtype, seed=t, gates=gates)
    out, aux = nsa_attention(q, k, v, g, SMALL, return_aux=True)
    ref_out, ref_aux = reference(q, k, v, g, SMALL)
    assert_matches(out, aux, ref_out, ref_aux, dtype)


def test_triton_paper_blocks_and_dk_ne_dv() -> None:
    cfg = NSAConfig(sel_count=3, window=40)  # l=32, d=16, l′=64
    q, k, v, g = make_inputs(1, 140, 4, 2, 16, torch.float32, dv=32, seed=2)
    out, aux = nsa_attention(q, k, v, g, cfg, return_aux=True)
    ref_out, ref_aux = reference(q, k, v, g, cfg)
    assert_matches(out, aux, ref_out, ref_aux, torch.float32)


def test_triton_given_indices_and_compression() -> None:
    cfg = NSAConfig(
        cmp_block=16,
        cmp_stride=8,
        sel_block=16,
        sel_count=4,
        sel_local=1,
        window=24,
        compress="given",
    )
    q, k, v, g = make_inputs(1, 70, 4, 1, 16, torch.bfloat16, seed=5)
    gen = torch.Generator().manual_seed(1)
    tc = (70 - 16) // 8 + 1
    kc = torch.randn(1, tc, 1, 16, generator=gen).to(torch.bfloat16)
    vc = torch.randn(1, tc, 1, 16, generator=gen).to(torch.bfloat16)
    idx = torch.full((1, 70, 1, 4), -1, dtype=torch.int32)
    for t in range(70):
        cur = t // 16
        chosen = sorted({0, cur} | ({cur - 2} if cur >= 3 else set()))
        idx[0, t, 0, : len(chosen)] = torch.tensor(chosen)
    out, aux = nsa_attention(
        q, k, v, g, cfg, k_cmp=kc, v_cmp=vc, block_indices=idx, return_aux=True
    )
    ref_out, ref_aux = reference(q, k, v, g, cfg, k_cmp=kc, v_cmp=vc, block_indices=idx)
    assert torch.equal(aux.block_indices, idx)
    assert_matches(out, aux, ref_out, ref_aux, torch.bfloat16)


def test_selection_v5_runs_as_v2_on_given_indices(use_variants) -> None:  # noqa: ANN001
    """Given indices need not hold the forced blocks that v5 leaves to the window kernel
    (here: the init block only on even positions), so v5 runs v2 there: the same out and aux
    bit for bit, both right against the reference; and without aux, the same out."""
    cfg = replace(SMALL, compress="mean")
    q, k, v, g = make_inputs(1, 70, 4, 1, 16, torch.float32, seed=9)
    idx = torch.full((1, 70, 1, cfg.sel_count), -1, dtype=torch.int32)
    for t in range(70):
        cur = t // cfg.sel_block
        chosen = sorted({cur} | ({0} if t % 2 == 0 else set()))
        idx[0, t, 0, : len(chosen)] = torch.tensor(chosen)
    runs = {}
    for name in ("v2", "v5"):
        use_variants(name, "v2h")
        runs[name] = nsa_attention(q, k, v, g, cfg, block_indices=idx, return_aux=True)
        assert torch.equal(nsa_attention(q, k, v, g, cfg, block_indices=idx), runs[name][0])
    (o2, a2), (o5, a5) = runs["v2"], runs["v5"]
    assert torch.equal(o5, o2) and torch.equal(a5.o_slc, a2.o_slc)
    ref_out, ref_aux = reference(q, k, v, g, cfg, block_indices=idx)
    assert_matches(o5, a5, ref_out, ref_aux, torch.float32)


def test_triton_planted_scores_stage1() -> None:
    q, k, v, g, expected = planted_inputs(100, 4, 2, 16, MID, torch.bfloat16, seed=4)
    out, aux = nsa_attention(q, k, v, g, MID, return_aux=True)
    for t in range(100):
        for grp in range(2):
            got = {int(j) for j in aux.block_indices[0, t, grp] if j >= 0}
            assert got == expected[t][grp], (t, grp)
    ref_out, ref_aux = reference(q, k, v, g, MID, block_indices=aux.block_indices)
    assert_matches(out, aux, ref_out, ref_aux, torch.bfloat16)


@pytest.mark.parametrize("form", ["float4k", "float16k", "packed8k"])
def test_topn_kernel_ties_to_smaller_index(form: str) -> None:
    """Equal scores everywhere: the kernel must pick forced blocks, then the smallest ones."""
    cfg = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=3, sel_local=1)
    t, ts = 100, 7
    sa = torch.ones(1, 1, t, ts)
    sb = torch.zeros(1, 1, t, ts)
    idx = topn_triton(sa, sb, t, 1, cfg, form=form)
    for pos in (0, 15, 16, 40, 99):
        cur = pos // 16
        want = sorted({0, cur} | ({1} if cur >= 2 else set()))
        want += [-1] * (3 - len(want))
        assert idx[0, pos, 0].tolist() == want, pos


# ---- kernel variants (kernels.nsa.attention.VARIANTS): same checks as v1 ----
# FINE has d=2, so a program's first row sees ≥ 64 compressed blocks from t ≈ 130 on: the
# mask-free interior-tile loops of compressed v2/v3 run, not only the causal-edge loop.
FINE = NSAConfig(
    cmp_block=4, cmp_stride=2, sel_block=8, sel_count=4, sel_init=1, sel_local=1, window=16
)


@pytest.fixture
def use_variants(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - pytest fixture factory
    def apply(selection: str, compressed: str, positions: int | None = None) -> None:
        monkeypatch.setitem(nsa_attention_mod.VARIANTS, "selection", selection)
        monkeypatch.setitem(nsa_attention_mod.VARIANTS, "compressed", compressed)
        if positions is not None:
            monkeypatch.setenv("KGRADE_NSA_SELECTION_R", str(positions))

    return apply


@pytest.mark.parametrize(
    ("slc", "cmp", "r", "t", "hq", "hkv", "dtype", "cfg"),
    [
        ("v2", "v2", None, 300, 2, 1, torch.bfloat16, FINE),  # 129+ blocks: wide pass 1 interior
        ("v3", "v3", 2, 150, 8, 1, torch.float32, FINE),
        ("v3", "v3", 4, 61, 16, 1, torch.bfloat16, SMALL),  # T % R ≠ 0: padded union rows
        ("v2", "v3", None, 77, 4, 2, torch.float32, SMALL),
        ("v3", "v2", 2, 100, 8, 2, torch.bfloat16, MID),
        ("v1", "v2h", None, 161, 8, 1, torch.bfloat16, FINE),
        ("v2", "v3h", None, 90, 4, 2, torch.float32, SMALL),
        # v5: the forced blocks in the window kernel, the picked ones in v2's, the combine
        # after; MID's local blocks reach past its window, FINE's rows fill n from t = 24
        ("v5", "v2h", None, 77, 4, 2, torch.float32, SMALL),
        ("v5", "v2h", None, 100, 8, 1, torch.bfloat16, MID),
        ("v5", "v2h", None, 61, 16, 1, torch.bfloat16, FINE),
        # no forced blocks: the window kernel's partial is empty (lse −inf) on every row,
        # and the merge must add nothing (every row still has a picked block: its own)
        ("v5", "v2h", None, 70, 4, 1, torch.float32, replace(SMALL, sel_init=0, sel_local=0)),
    ],
)
def test_triton_variants_match_naive(
    use_variants,  # noqa: ANN001
    slc: str,
    cmp: str,
    r: int | None,
    t: int,
    hq: int,
    hkv: int,
    dtype: torch.dtype,
    cfg: NSAConfig,
) -> None:
    use_variants(slc, cmp, r)
    q, k, v, g = make_inputs(1, t, hq, hkv, 16, dtype, seed=t)
    out, aux = nsa_attention(q, k, v, g, cfg, return_aux=True)
    ref_out, ref_aux = reference(q, k, v, g, cfg)
    assert_matches(out, aux, ref_out, ref_aux, dtype)


def test_triton_variant_v3_given_indices_with_holes(use_variants) -> None:  # noqa: ANN001
    """Given indices with −1 holes in the middle and per-position different lists: the union
    walk must mask, per row, every block its own position did not choose."""
    use_variants("v3", "v1", 4)
    cfg = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=4, sel_local=1)
    q, k, v, g = make_inputs(1, 70, 8, 2, 16, torch.bfloat16, seed=6, gates="slc")
    idx = torch.full((1, 70, 2, 4), -1, dtype=torch.int32)
    for t in range(70):
        cur = t // 16
        for grp in range(2):
            extra = {(t + grp) % (cur + 1)} if t % 3 else set()
            chosen = sorted({0, cur} | extra)
            idx[0, t, grp, : len(chosen)] = torch.tensor(chosen)
            if len(chosen) < 4 and t % 2:  # a hole before a real entry
                idx[0, t, grp] = torch.tensor([-1, *chosen, *([-1] * (3 - len(chosen)))])
    out, aux = nsa_attention(q, k, v, g, cfg, block_indices=idx, return_aux=True)
    ref_out, ref_aux = reference(q, k, v, g, cfg, block_indices=idx)
    assert_matches(out, aux, ref_out, ref_aux, torch.bfloat16)


# ---- k̃ as fp16 hi + lo parts (what the GPU path runs for bf16 inputs) ----


def _compressed_fp64(
    q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, cfg: NSAConfig, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp64 compressed branch: o [B,T,Hq,Dv], lse [B,T,Hq], block scores [B,Hkv,T,Ts]."""
    b, t, hq, _ = q.shape
    tc, hkv = kc.shape[1], kc.shape[2]
    qd = q.double().reshape(b, t, hkv, hq // hkv, -1)
    logits = scale * torch.einsum("bthgd,bchd->bhgtc", qd, kc.double())
    pos, ci = torch.arange(t), torch.arange(tc)
    vis = ci[None, :] * cfg.cmp_stride + cfg.cmp_block - 1 <= pos[:, None]  # [T, Tc]
    logits = logits.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(logits, -1)  # [B, Hkv, G, T]
    p = torch.exp(logits - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    o = torch.einsum("bhgtc,bchd->bthgd", p, vc.double()).reshape(b, t, hq, -1)
    omega = omega_matrix(tc, num_sel_blocks(t, cfg), cfg).double()
    scores = p.sum(2) @ omega
    return o, lse.permute(0, 3, 1, 2).reshape(b, t, hq), scores


def _own_block_written(t: int, ts: int, cfg: NSAConfig) -> torch.Tensor:
    """[T, Ts]: selection blocks whose first compressed block position t sees, the ones whose
    score halves the compressed kernel writes (the rest may be unwritten)."""
    num = torch.arange(t) + 1 - cfg.cmp_block
    imax = torch.where(num >= 0, num // cfg.cmp_stride, -1)[:, None]
    return torch.arange(ts)[None, :] * (cfg.sel_block // cfg.cmp_stride) <= imax


def _kernel_scores(sa: torch.Tensor, sb: torch.Tensor, cfg: NSAConfig) -> torch.Tensor:
    """Block scores from the kernel's banded halves, read the way the top-n kernel reads them
    (unwritten entries, NaN under POISON_OUTPUTS, are masked)."""
    va = _own_block_written(sa.shape[2], sa.shape[3], cfg)
    vb = torch.cat([torch.zeros_like(va[:, :1]), va[:, :-1]], dim=-1)  # block j − 1's
    sb_next = torch.cat([torch.zeros_like(sb[..., :1]), sb[..., :-1]], dim=-1)
    return torch.where(va, sa, 0.0).double() + torch.where(vb, sb_next, 0.0).double()


@pytest.mark.parametrize("variant", ["v1", "v2", "v3", "v2h", "v3h"])
def test_compressed_kc_split_gives_fp32_logits(
    monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    """kc_lo wired into every QK̃ loop: an fp32 k̃ passed as fp16 hi + lo reproduces fp32
    logits (lse and block scores ≈ 1e-6 off an fp64 reference), while hi alone (the old fp16
    k̃) is off by ≈ 2^-12 relative in the logits, far above that."""
    captured: dict[str, torch.Tensor] = {}
    topn = compressed_mod.topn_triton

    def spy(sa: torch.Tensor, sb: torch.Tensor, *args: object, **kw: object) -> torch.Tensor:
        captured["scores"] = _kernel_scores(sa, sb, FINE)
        return topn(sa, sb, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(compressed_mod, "topn_triton", spy)
    cfg, (b, t, hq, hkv, d) = FINE, (2, 160, 4, 2, 32)  # d=2: v2/v3 interior tiles run
    gen = torch.Generator().manual_seed(17)
    tc = num_cmp_blocks(t, cfg)
    q = (2 * torch.randn(b, t, hq, d, generator=gen)).to(torch.bfloat16)  # exact in fp16
    kc32 = torch.randn(b, tc, hkv, d, generator=gen)
    vc = torch.randn(b, tc, hkv, d, generator=gen).half()
    scale = d**-0.5
    hi = kc32.half()
    lo = (kc32 - hi.float()).half()
    assert (hi.float() + lo.float() - kc32).abs().max() < 1e-6 * kc32.abs().max()
    ref_o, ref_lse, ref_s = _compressed_fp64(q, kc32, vc, cfg, scale)
    fn = compressed_mod.COMPRESSED_IMPLS[variant]
    alloc = nsa_attention_mod._alloc
    fin = torch.isfinite(ref_lse)

    def errors(kc_lo: torch.Tensor | None) -> tuple[float, float, float, torch.Tensor]:
        o, lse, idx = fn(q, hi, vc, cfg, scale, True, alloc, kc_lo=kc_lo)
        assert idx is not None
        assert torch.equal(torch.isfinite(lse), fin)
        e_lse = (lse[fin].double() - ref_lse[fin]).abs().max().item()
        e_s = (captured["scores"] - ref_s).abs().max().item() / ref_s.abs().max().item()
        e_o = (o.double() - ref_o).abs().max().item()
        return e_lse, e_s, e_o, idx

    split_lse, split_s, split_o, idx = errors(lo)
    hi_lse, hi_s, _, _ = errors(None)
    print(f"{variant}: lse {split_lse:.2e} (hi {hi_lse:.2e}) scores {split_s:.2e} (hi {hi_s:.2e})")
    assert split_lse < 5e-6, split_lse
    assert 20 * split_lse < hi_lse, (split_lse, hi_lse)
    if variant.endswith("h"):
        # pass 1 on hi only: o and lse are corrected exactly, but each head's scores keep the
        # factor 2^(its pass-1 lse error): one factor per head for all its blocks, so orders
        # within a row move only through heads that disagree (idx is checked below). At these
        # peaked logits that factor is a logit's error, ≈ 2^-12·|logit|, hence the bound.
        assert split_s < 2e-3, (split_s, hi_s)
    else:
        assert split_s < 5e-6 and 20 * split_s < hi_s, (split_s, hi_s)
    # the split path rounds p to fp16 for p·ṽ (hi alone runs fp32 dots here): a loose check
    assert split_o < 2e-3, split_o
    _, _, ref_idx = compressed_torch(q.float(), kc32, vc.float(), cfg, scale, True)
    assert torch.equal(idx, ref_idx)


ODD_RATIO = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=24, sel_count=4, window=20)


# l′/d = 32: a 64-block tile of the Gluon kernel would split a selection block
WIDE_RATIO = NSAConfig(
    cmp_block=4, cmp_stride=2, sel_block=64, sel_count=2, sel_init=1, sel_local=1, window=16
)


@pytest.mark.parametrize("name", ["g2h", "g2p", "g2p4", "g2p8", "g3h8", "g2p8s", "g3h8s", "g3h8sq"])
@pytest.mark.parametrize("case", ["k̃ split", "k̃ whole (no lo part)", "l′/d = 32"])
def test_gluon_compressed_variants_fall_back_to_v2h(name: str, case: str):
    """A Gluon compressed variant (Hopper only) gives v2h's result wherever its kernel cannot
    run, so choosing one never turns an input into an error: here the CPU, under the
    interpreter, where v2h runs and Gluon could not. The max |q| it owes the range check
    (``q_peak``) is computed there too."""
    cfg = WIDE_RATIO if case == "l′/d = 32" else FINE
    gen = torch.Generator().manual_seed(23)
    b, t, hq, hkv, d = 1, 150, 4, 2, 16
    tc = num_cmp_blocks(t, cfg)
    q = torch.randn(b, t, hq, d, generator=gen).to(torch.bfloat16)
    kc32 = torch.randn(b, tc, hkv, d, generator=gen)
    vc = torch.randn(b, tc, hkv, d, generator=gen).half()
    hi, lo = _split_fp16(kc32)
    kc, kc_lo = (kc32.to(torch.bfloat16), None) if "whole" in case else (hi, lo)
    args = (q, kc, vc, cfg, d**-0.5, True)
    want = compressed_mod.COMPRESSED_IMPLS["v2h"](*args, kc_lo=kc_lo)
    q_peak = torch.zeros(1)
    got = compressed_mod.COMPRESSED_IMPLS[name](*args, kc_lo=kc_lo, q_peak=q_peak)
    for x, y in zip(got, want, strict=True):
        assert x is not None and y is not None
        assert torch.equal(x, y)
    assert compressed_mod.fills_q_peak(compressed_mod.COMPRESSED_IMPLS[name])
    assert float(q_peak) == float(q.float().abs().max())


def test_gluon_compressed_kernel_names_what_it_cannot_take(monkeypatch: pytest.MonkeyPatch):
    """Each reason, as if on a Hopper GPU (the device check stubbed out); None for the paper
    shape, which it takes."""
    import kernels.nsa.compressed_gluon as cg

    monkeypatch.setattr(cg, "on_hopper", lambda x: True)
    paper = NSAConfig()
    q = torch.zeros(1, 64, 32, 128, dtype=torch.bfloat16)
    kc = torch.zeros(1, 3, 2, 128, dtype=torch.float16)
    vc = torch.zeros(1, 3, 2, 128, dtype=torch.bfloat16)
    assert cg.compressed_gluon_unsupported(q, kc, vc, paper, kc) is None
    why = cg.compressed_gluon_unsupported
    assert "fp16 hi" in str(why(q, kc, vc, paper, None))
    assert "kc's shape" in str(why(q, kc, vc, paper, kc[:, :2]))
    assert "16-bit" in str(why(q, kc, vc.float(), paper, kc))
    assert "l′/d ≤ 16" in str(why(q, kc, vc, WIDE_RATIO, kc))
    assert "power of two" in str(why(q[:, :, :6], kc, vc, paper, kc))  # G = 3
    assert "D 64 or 128" in str(why(q[..., :96], kc[..., :96], vc[..., :96], paper, kc[..., :96]))
    monkeypatch.undo()
    assert "Hopper" in str(cg.compressed_gluon_unsupported(q, kc, vc, paper, kc))


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("kernels.nsa.compressed_gluon", "the NSA compressed branch"),
        ("kernels.nsa.window_gluon", "the NSA window branch"),
    ],
)
def test_gluon_variants_without_gluon_warn_once_and_fall_back(
    monkeypatch: pytest.MonkeyPatch, use_variants, module: str, name: str
) -> None:
    """A Triton without Gluon: choosing the Gluon variants still gives the Triton kernels'
    result, with one RuntimeWarning naming the branch (kernels._gluon_switch)."""
    import sys
    import warnings

    import kernels._gluon_switch as switch

    q, k, v, g = make_inputs(1, 40, 4, 2, 16, torch.bfloat16, seed=32)
    want = nsa_attention(q, k, v, g, FINE)  # on the CPU: the Triton kernels, no warning
    monkeypatch.setattr(switch, "OFF", {})
    monkeypatch.setattr(switch, "on_hopper", lambda x: True)  # as if on an H200
    monkeypatch.setitem(sys.modules, module, None)  # its import now raises ImportError
    use_variants("v2", "g2p")
    monkeypatch.setitem(nsa_attention_mod.VARIANTS, "window", "g1")
    with pytest.warns(RuntimeWarning, match=f"no usable Gluon.*; {name} uses its Triton kernel"):
        got = nsa_attention(q, k, v, g, FINE)
    assert torch.equal(got, want)
    assert name in switch.OFF
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # once per process, not per call
        assert torch.equal(nsa_attention(q, k, v, g, FINE), want)


@pytest.mark.parametrize("module", ["kernels.nsa.compressed_gluon", "kernels.nsa.window_gluon"])
def test_gluon_variants_on_the_cpu_never_import_gluon(
    monkeypatch: pytest.MonkeyPatch, use_variants, module: str
) -> None:
    """Off a Hopper GPU a Gluon variant (g3h8s is the default) goes straight to its Triton
    kernel: no import, so a Triton without Gluon neither warns nor turns the kernel off for a
    later GPU call in the same process."""
    import sys
    import warnings

    import kernels._gluon_switch as switch

    q, k, v, g = make_inputs(1, 40, 4, 2, 16, torch.bfloat16, seed=33)
    use_variants("v2", "v2h")
    want = nsa_attention(q, k, v, g, FINE)
    monkeypatch.setattr(switch, "OFF", {})
    monkeypatch.setitem(sys.modules, module, None)  # an import would raise ImportError
    use_variants("v2", "g2p")
    monkeypatch.setitem(nsa_attention_mod.VARIANTS, "window", "g1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert torch.equal(nsa_attention(q, k, v, g, FINE), want)
    assert switch.OFF == {}


def test_gluon_window_variant_falls_back_to_the_triton_kernel(use_variants) -> None:
    """nsa_attention with every Gluon variant chosen gives, where Gluon cannot run (here the
    CPU), exactly what the default variants give."""
    q, k, v, g = make_inputs(1, 40, 4, 2, 16, torch.bfloat16, seed=31)
    want = nsa_attention(q, k, v, g, FINE)
    use_variants("v2", "g2p")
    nsa_attention_mod.VARIANTS["window"] = "g1"
    try:
        got = nsa_attention(q, k, v, g, FINE)
    finally:
        nsa_attention_mod.VARIANTS["window"] = None
    assert torch.equal(got, want)


# window 100 with the interpreter's 32-key tiles: a band has lower-edge, mask-free and
# causal-edge tiles for every G (BLOCK_T = 32 / G positions a program, 2 at G = 16)
@pytest.mark.parametrize(
    ("t", "hq", "hkv", "dtype"),
    [(201, 2, 2, torch.float32), (150, 8, 1, torch.bfloat16), (97, 16, 1, torch.float32)],
)
def test_window_v2_mask_free_interior_matches_v1_and_naive(
    monkeypatch: pytest.MonkeyPatch, t: int, hq: int, hkv: int, dtype: torch.dtype
) -> None:
    """Window variant v2 skips the mask on tiles whose keys every row of the program sees:
    the same outputs as v1 (which masks every tile), and nsa_attention with it the naive
    reference's."""
    cfg = replace(FINE, window=100)
    q, k, v, g = make_inputs(1, t, hq, hkv, 16, dtype, seed=t)
    scale = 16**-0.5
    alloc = nsa_attention_mod._alloc
    gen = torch.Generator().manual_seed(t)
    o_cmp, o_slc = (torch.randn(q.shape, generator=gen) for _ in range(2))
    for kw in ({}, {"combine": (o_cmp, o_slc, g)}):
        o1, lse1 = window_triton(q, k, v, cfg.window, scale, alloc=alloc, **kw)
        o2, lse2 = window_triton(q, k, v, cfg.window, scale, alloc=alloc, split=True, **kw)
        assert not o2.isnan().any() and not lse2.isnan().any()
        # v2 sums the combine's terms in another order: its fp32 result may round to the
        # neighbouring bf16 value (CI drew such inputs), so a bf16 store may differ by one ulp
        assert_rounds_alike(o2, o1)
        assert torch.allclose(lse2, lse1, rtol=1e-6, atol=1e-6)
    monkeypatch.setitem(nsa_attention_mod.VARIANTS, "window", "v2")
    out, aux = nsa_attention(q, k, v, g, cfg, return_aux=True)
    ref_out, ref_aux = reference(q, k, v, g, cfg)
    assert_matches(out, aux, ref_out, ref_aux, dtype)


def test_window_v2_trains_as_v1(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training through window v2 (its kernel also writes o_win for the backward): the
    output and every gradient as with v1. Window 100 at G = 2: a program's band has
    lower-edge, mask-free and causal-edge tiles."""
    cfg = replace(FINE, window=100)
    q, k, v, g = make_inputs(1, 130, 2, 1, 16, torch.float32, seed=13)
    got = {}
    for name in ("v1", "v2"):
        monkeypatch.setitem(nsa_attention_mod.VARIANTS, "window", name)
        xs = [x.clone().requires_grad_(True) for x in (q, k, v, g)]
        o = nsa_attention(*xs, cfg)
        o.backward(torch.ones_like(o))
        got[name] = (o.detach(), *(x.grad for x in xs))
    for a, b in zip(got["v1"], got["v2"], strict=True):
        assert a is not None and b is not None and not b.isnan().any()
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("cfg", "selection"),
    # v5 once: its fp16 wiring is the same at every config (CI time: the interpreter's child
    # took 556 s with all three)
    [(MID, "v2"), (replace(SMALL, compress="given"), "v2"), (ODD_RATIO, "v2"), (MID, "v5")],
)
def test_fp16_compressed_storage_keeps_fp32_logits(
    monkeypatch: pytest.MonkeyPatch, cfg: NSAConfig, selection: str
) -> None:
    """The GPU's storage choice for bf16 inputs (fp16 k̃, ṽ), forced under the interpreter:
    nsa_attention must still give the compressed branch an fp32-accurate k̃ (fp16 hi + lo for
    the kernel, fp32 for the torch fallback that l′/d = 3 takes), so lse_cmp stays ≈ 1e-6
    off the fp32 reference rather than the ≈ 1e-4 of an fp16 k̃ (mean pooling; a bf16 k_cmp
    is fp16-exact, that case checks the wiring only). The combine reads o_cmp and the other
    branch output in the window kernel (v2) or the selection kernel (v5: o_win, and the
    forced blocks' partial in the same dtype)."""
    monkeypatch.setattr(nsa_attention_mod, "_compressed_dtype", lambda *xs: torch.float16)
    monkeypatch.setitem(nsa_attention_mod.VARIANTS, "selection", selection)
    seen: dict[str, tuple[torch.dtype, torch.dtype]] = {}

    def spy(*args: object, combine: tuple[torch.Tensor, ...] | None = None, **kw: object):  # noqa: ANN202
        if combine is not None:
            seen["combine"] = (combine[0].dtype, combine[1].dtype)
        return window_triton(*args, combine=combine, **kw)  # type: ignore[arg-type]

    def spy_v5(*args: tuple[torch.Tensor, ...]):  # noqa: ANN202
        forced, combine = args[6], args[7]
        assert forced[0].dtype == combine[1].dtype
        seen["combine"] = (combine[0].dtype, combine[1].dtype)
        return forced_and_combined(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(nsa_attention_mod, "window_triton", spy)
    monkeypatch.setattr(nsa_attention_mod, "forced_and_combined", spy_v5)
    q, k, v, g = make_inputs(1, 100, 4, 2, 16, torch.bfloat16, seed=12)
    q = 2 * q  # larger logits: an fp16 k̃ would show
    kw: dict[str, torch.Tensor] = {}
    if cfg.compress == "given":
        gen = torch.Generator().manual_seed(3)
        tc = num_cmp_blocks(100, cfg)
        kw = {"k_cmp": torch.randn(1, tc, 2, 16, generator=gen).to(torch.bfloat16)}
        kw["v_cmp"] = torch.randn(1, tc, 2, 16, generator=gen).to(torch.bfloat16)
    out, aux = nsa_attention(q, k, v, g, cfg, return_aux=True, **kw)  # type: ignore[arg-type]
    ref_out, ref_aux = reference(q, k, v, g, cfg, **kw)
    assert_matches(out, aux, ref_out, ref_aux, torch.bfloat16)
    # fp16 k̃ storage → fp16 branch outputs (attention.branch_dtype); the aux stays fp32
    assert seen["combine"][1] == torch.float16
    assert seen["combine"][0] == (torch.float16 if banded_scores_ok(cfg) else torch.float32)
    assert aux.o_cmp.dtype == aux.o_slc.dtype == aux.o_win.dtype == torch.float32
    fin = torch.isfinite(ref_aux.lse_cmp)
    err = (aux.lse_cmp[fin] - ref_aux.lse_cmp[fin]).abs().max().item()
    assert err < 1e-5, err


def _topn_oracle(sa: torch.Tensor, sb: torch.Tensor, t: int, cfg: NSAConfig) -> torch.Tensor:
    """nsa_topn_kernel's contract in torch: s = SA + SB shifted by one block, over the blocks
    whose compressed blocks the position sees; forced blocks first, then by score, ties to the
    smaller index; ascending, −1 padded. [B, T, Hkv, n]"""
    b, hkv, _, ts = sa.shape
    ratio = cfg.sel_block // cfg.cmp_stride
    out = torch.full((b, t, hkv, cfg.sel_count), -1, dtype=torch.int32)
    for pos in range(t):
        num = pos + 1 - cfg.cmp_block
        imax = num // cfg.cmp_stride if num >= 0 else -1
        cur = pos // cfg.sel_block
        for bb in range(b):
            for g in range(hkv):
                ranked = []
                for j in range(min(cur + 1, ts)):
                    s = float(sa[bb, g, pos, j]) if j * ratio <= imax else 0.0
                    if j >= 1 and (j - 1) * ratio <= imax:
                        s = s + float(sb[bb, g, pos, j - 1])
                    s = torch.tensor(s, dtype=torch.float32).item()  # the kernel's fp32 sum
                    forced = j < cfg.sel_init or j > cur - cfg.sel_local
                    ranked.append((0 if forced else 1, -s, j))
                chosen = sorted(j for *_, j in sorted(ranked)[: cfg.sel_count])
                out[bb, pos, g, : len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return out


def _chunk_form(monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    """``chunkC``: the chunked rounds with chunks of C blocks, a form these tests add, so that
    chunks are chosen at their small widths (chunk4k's 4 blocks need bands 8 x 4 x pow2(n)
    wide: 256 at n = 5)."""
    if form.startswith("chunk") and form not in TOPN_FORMS:
        monkeypatch.setitem(TOPN_FORMS, form, TopnForm(False, 4096, int(form[5:])))


@pytest.mark.parametrize("form", ["float4k", "float16k", "packed8k", "chunk2", "chunk4"])
@pytest.mark.parametrize("banded", [True, False])
@pytest.mark.parametrize(
    ("init", "local", "n"),
    # init > 1; forced blocks = n (no round left); no local block, so the current block,
    # often seen through the previous block's spill only, competes on its score
    [(1, 2, 5), (2, 2, 6), (2, 3, 5), (1, 0, 4)],
)
def test_topn_kernel_bands_match_an_oracle(
    monkeypatch: pytest.MonkeyPatch, banded: bool, form: str, init: int, local: int, n: int
) -> None:
    """300 positions with l′ = 4: four bands of widths 16, 32, 64 and 128 (``topn._bands``),
    or one launch 128 wide; scores drawn from 4 values so ties are everywhere; every row
    against a torch oracle. The chunked forms choose chunks in the bands at least 8 times
    their candidates wide (``chunk2`` at n = 5 or 6: the band of 128, or the one launch)."""
    _chunk_form(monkeypatch, form)
    cfg = NSAConfig(
        cmp_block=4, cmp_stride=2, sel_block=4, sel_count=n, sel_init=init, sel_local=local
    )
    t, hkv = 300, 2
    ts = -(-t // cfg.sel_block)
    gen = torch.Generator().manual_seed(5)
    sa = torch.randint(0, 4, (1, hkv, t, ts), generator=gen).float() / 4
    sb = torch.randint(0, 4, (1, hkv, t, ts), generator=gen).float() / 8
    # A block's halves are written once its first compressed block is visible; the rest may
    # be unwritten (NaN under POISON_OUTPUTS), and no pick may depend on them.
    written = _own_block_written(t, ts, cfg)
    sa = torch.where(written, sa, float("nan"))
    sb = torch.where(written, sb, float("nan"))
    got = topn_triton(sa, sb, t, hkv, cfg, banded=banded, form=form)
    want = _topn_oracle(sa, sb, t, cfg)
    bad = (got != want).any(-1).nonzero().tolist()
    assert not bad, f"{len(bad)} rows differ, first {bad[:3]}"


@pytest.mark.parametrize("form", list(TOPN_FORMS))
def test_topn_forms_through_the_environment(monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    """Each form KGRADE_NSA_TOPN names is the one nsa_attention's top-n runs (its variant
    "topn", handed down through the compressed branch), and picks what the oracle picks; a
    name that is not a form is refused with the list of forms."""
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, sel_count=5, sel_local=1)
    t = 120
    ts = -(-t // cfg.sel_block)
    gen = torch.Generator().manual_seed(9)
    sa = torch.randint(0, 4, (1, 1, t, ts), generator=gen).float() / 4
    sb = torch.randint(0, 4, (1, 1, t, ts), generator=gen).float() / 8
    written = _own_block_written(t, ts, cfg)
    sa, sb = (torch.where(written, x, float("nan")) for x in (sa, sb))
    monkeypatch.setenv("KGRADE_NSA_TOPN", form)
    assert nsa_attention_mod.variant("topn") == form
    seen: list[object] = []
    topn = compressed_mod.topn_triton

    def spy(*args: object, **kw: object) -> torch.Tensor:
        seen.append(kw.get("form"))
        return topn(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(compressed_mod, "topn_triton", spy)
    monkeypatch.setitem(nsa_attention_mod.VARIANTS, "compressed", "v2h")
    q, k, v, g = make_inputs(1, 40, 2, 1, 16, torch.float32, seed=5)
    nsa_attention(q, k, v, g, cfg)
    assert seen == [form]
    got = topn(sa, sb, t, 1, cfg, form=nsa_attention_mod.variant("topn"))
    assert torch.equal(got, _topn_oracle(sa, sb, t, cfg))
    monkeypatch.setenv("KGRADE_NSA_TOPN", "packed")
    with pytest.raises(ValueError, match="packed8k"):
        nsa_attention(q, k, v, g, cfg)
    with pytest.raises(ValueError, match="packed8k"):
        topn(sa, sb, t, 1, cfg, form="packed")


def test_topn_packed_keys_order_signed_and_zero_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packed rounds map fp32 scores to ordered int64 keys: negative scores, −0 and +0
    (equal, so the smaller index wins) rank as the float rounds and the oracle rank them."""
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, sel_count=6, sel_local=1)
    t = 200
    ts = -(-t // cfg.sel_block)
    gen = torch.Generator().manual_seed(8)
    sa = (torch.randint(-3, 4, (1, 1, t, ts), generator=gen).float() / 4).contiguous()
    sa[sa == 0] = torch.where(torch.rand(int((sa == 0).sum()), generator=gen) < 0.5, -0.0, 0.0)
    assert (sa == 0).any() and torch.signbit(sa[sa == 0]).any()  # both zeros present
    sb = torch.full_like(sa, -0.0)  # −0 + −0 stays −0 in the kernel's sa + sb
    written = _own_block_written(t, ts, cfg)
    sa = torch.where(written, sa, float("nan"))
    sb = torch.where(written, sb, float("nan"))
    want = _topn_oracle(sa, sb, t, cfg)
    _chunk_form(monkeypatch, "chunk1")  # chunks of one block: the band 64 wide
    for form in ("float4k", "float16k", "packed8k", "chunk1"):
        got = topn_triton(sa, sb, t, 1, cfg, form=form)
        bad = (got != want).any(-1).nonzero().tolist()
        assert not bad, f"{form}: {len(bad)} rows differ, first {bad[:3]}"


# v3 is v2's kernel; v5 stores the forced blocks' partial in the branch dtype too, so its
# fp16 o_slc is rounded twice (its accuracy: test_triton_variants_match_naive)
@pytest.mark.parametrize("sel_variant", ["v1", "v2"])
def test_fp16_branch_outputs_round_only_the_store(sel_variant: str) -> None:
    """o_cmp and o_slc stored as fp16 (``attention.branch_dtype``) are the fp32 results
    rounded once at the store, bit for bit, and the fused combine and the backward's
    preprocess read them as fp32 (nsa_attention's choice of fp16: the test below)."""
    cfg = MID
    q, k, v, g = make_inputs(1, 100, 4, 2, 16, torch.bfloat16, seed=21)
    scale = 16**-0.5
    alloc = nsa_attention_mod._alloc
    kc, kc_lo = _split_fp16(torch.randn(1, num_cmp_blocks(100, cfg), 2, 16))
    vc = torch.randn(kc.shape).half()
    cmp_fn = compressed_mod.COMPRESSED_IMPLS["v2h"]
    outs = {}
    for dt in (torch.float32, torch.float16):
        o_c, lse_c, idx = cmp_fn(q, kc, vc, cfg, scale, True, alloc, kc_lo=kc_lo, out_dtype=dt)
        assert idx is not None
        o_s, lse_s = SELECTION_IMPLS[sel_variant](q, k, v, idx, cfg, scale, alloc, dt)
        assert o_c.dtype == o_s.dtype == dt
        outs[dt] = (o_c, lse_c, idx, o_s, lse_s)
    (c32, l32, i32, s32, m32), (c16, l16, i16, s16, m16) = outs[torch.float32], outs[torch.float16]
    assert torch.equal(c16, c32.half()) and torch.equal(s16, s32.half())
    assert torch.equal(l16, l32) and torch.equal(i16, i32) and torch.equal(m16, m32)
    assert (c16.float() - c32).abs().max() > 0  # the rounding is real, so the check can fail
    fused16, _ = window_triton(q, k, v, cfg.window, scale, combine=(c16, s16, g), alloc=alloc)
    fused32, _ = window_triton(
        q, k, v, cfg.window, scale, combine=(c16.float(), s16.float(), g), alloc=alloc
    )
    assert torch.equal(fused16, fused32)
    dout = torch.randn(q.shape).to(torch.bfloat16)
    d16 = bwd_preprocess(dout, c16, s16, s16, alloc)
    d32 = bwd_preprocess(dout, c16.float(), s16.float(), s16.float(), alloc)
    assert torch.equal(d16, d32)


# ---- batches past 2^31 elements (attention.INDEX_LIMIT), scaled down to a small limit ----
def _per_row(t: int, hq: int, hkv: int, d: int, cfg: NSAConfig) -> int:
    return t * max(hq * d, hkv * num_sel_blocks(t, cfg))


def _sliced_calls(monkeypatch: pytest.MonkeyPatch, limit: int) -> list[int]:
    """Lower INDEX_LIMIT and record the batch sizes of the calls nsa_attention makes."""
    monkeypatch.setattr(nsa_attention_mod, "INDEX_LIMIT", limit)
    inner = nsa_attention_mod.nsa_attention
    sizes: list[int] = []

    def spy(q: torch.Tensor, *args: object, **kw: object):  # noqa: ANN202
        sizes.append(q.shape[0])
        return inner(q, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(nsa_attention_mod, "nsa_attention", spy)
    return sizes


def test_batches_past_the_index_limit_run_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three batch rows under a limit that fits two: the call runs as slices of 2 and 1 rows
    and returns exactly the unsliced output and aux (no kernel reads across batch rows)."""
    cfg = replace(FINE, compress="given")  # k_cmp, v_cmp sliced too
    q, k, v, g = make_inputs(3, 40, 4, 2, 16, torch.float32, seed=41)
    gen = torch.Generator().manual_seed(41)
    tc = num_cmp_blocks(40, cfg)
    kc, vc = (torch.randn(3, tc, 2, 16, generator=gen) for _ in range(2))
    kw = {"k_cmp": kc, "v_cmp": vc, "return_aux": True}
    want_out, want_aux = nsa_attention(q, k, v, g, cfg, **kw)
    sizes = _sliced_calls(monkeypatch, 2 * _per_row(40, 4, 2, 16, cfg) + 1)
    out, aux = nsa_attention(q, k, v, g, cfg, **kw)
    assert sizes == [2, 1]
    assert torch.equal(out, want_out)
    for name in ("block_indices", "lse_cmp", "lse_slc", "lse_win", "o_cmp", "o_slc", "o_win"):
        assert torch.equal(getattr(aux, name), getattr(want_aux, name)), name


def test_sliced_batches_train() -> None:
    """Gradients reach every slice through the concatenation, as without slicing."""
    q, k, v, g = make_inputs(3, 50, 2, 1, 16, torch.float32, seed=42)
    got = []
    sizes: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        for limit in (None, _per_row(50, 2, 1, 16, FINE) + 1):  # unsliced, then 1 row a call
            if limit is not None:
                sizes = _sliced_calls(mp, limit)
            xs = [x.clone().requires_grad_(True) for x in (q, k, v, g)]
            o = nsa_attention(*xs, FINE)
            o.backward(torch.ones_like(o))
            got.append((o.detach(), *(x.grad for x in xs)))
    assert sizes == [1, 1, 1]
    for a, b in zip(*got, strict=True):
        assert a is not None and b is not None and not b.isnan().any()
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_one_row_past_the_index_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v, g = make_inputs(1, 40, 2, 1, 16, torch.float32, seed=43)
    per_row = _per_row(40, 2, 1, 16, FINE)
    monkeypatch.setattr(nsa_attention_mod, "INDEX_LIMIT", per_row)
    with pytest.raises(ValueError, match=f"one batch row needs {per_row:,} elements"):
        nsa_attention(q, k, v, g, FINE)
