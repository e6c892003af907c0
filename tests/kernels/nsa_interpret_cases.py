"""NSA Triton kernels under the Triton CPU interpreter, against the naive reference.

These only run in a process started with TRITON_INTERPRET=1 (set before Triton is imported),
which ``test_triton_interpret.py`` launches. Sizes stay
tiny: the interpreter executes each program instance one by one in numpy.
"""

from __future__ import annotations

import os

import pytest
import torch

import kernels.nsa.attention as nsa_attention_mod
from kernels.nsa import NSAConfig, nsa_attention
from kernels.nsa.compressed import topn_triton
from tests.kernels.test_nsa_utils import (
    MID,
    SMALL,
    assert_matches,
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


def test_triton_planted_scores_stage1() -> None:
    q, k, v, g, expected = planted_inputs(100, 4, 2, 16, MID, torch.bfloat16, seed=4)
    out, aux = nsa_attention(q, k, v, g, MID, return_aux=True)
    for t in range(100):
        for grp in range(2):
            got = {int(j) for j in aux.block_indices[0, t, grp] if j >= 0}
            assert got == expected[t][grp], (t, grp)
    ref_out, ref_aux = reference(q, k, v, g, MID, block_indices=aux.block_indices)
    assert_matches(out, aux, ref_out, ref_aux, torch.bfloat16)


def test_topn_kernel_ties_to_smaller_index() -> None:
    """Equal scores everywhere: the kernel must pick forced blocks, then the smallest ones."""
    cfg = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=3, sel_local=1)
    t, ts = 100, 7
    sa = torch.ones(1, 1, t, ts)
    sb = torch.zeros(1, 1, t, ts)
    idx = topn_triton(sa, sb, t, 1, cfg)
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
        ("v2", "v2", None, 203, 2, 1, torch.bfloat16, FINE),
        ("v3", "v3", 2, 150, 8, 1, torch.float32, FINE),
        ("v3", "v3", 4, 61, 16, 1, torch.bfloat16, SMALL),  # T % R ≠ 0: padded union rows
        ("v2", "v3", None, 77, 4, 2, torch.float32, SMALL),
        ("v3", "v2", 2, 100, 8, 2, torch.bfloat16, MID),
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
