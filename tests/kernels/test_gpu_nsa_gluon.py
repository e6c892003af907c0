"""The Gluon compressed branch (variants g2h, g2p, g2p4: kernels/nsa/compressed_gluon.py) on an H200.

PREPARED: written and compiled for sm_90 with Triton 3.6 and 3.9 (test_gluon_compile.py), not
yet run. Each check is one the Triton variants pass in test_gpu_nsa.py, plus each Gluon variant
against v2h on the same inputs.
"""

from __future__ import annotations

import pytest
import torch

import kernels.nsa.attention as nsa_attention_mod
from kernels.nsa import NSAConfig, nsa_attention
from kernels.nsa.compressed import COMPRESSED_IMPLS
from tests.kernels.test_nsa_utils import assert_lse_close, assert_matches, make_inputs, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
        reason="the Gluon kernel needs sm_90",
    ),
]
PAPER = NSAConfig()


GLUON = ("g2h", "g2p", "g2p4")


@pytest.fixture(params=GLUON[:2])
def variant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """nsa_attention's compressed branch on a Gluon variant, with NaN-poisoned outputs."""
    monkeypatch.setattr(nsa_attention_mod, "POISON_OUTPUTS", True)
    monkeypatch.setitem(nsa_attention_mod.VARIANTS, "compressed", request.param)
    return request.param


@pytest.mark.usefixtures("variant")
@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
def test_gluon_groups_odd_length(group: int) -> None:
    t, hkv = 1777, 2
    q, k, v, g = make_inputs(1, t, group * hkv, hkv, 64, torch.bfloat16, seed=group, device="cuda")
    cfg = NSAConfig(window=256, sel_count=8)
    out, aux = nsa_attention(q, k, v, g, cfg, return_aux=True)
    ref_out, ref_aux = reference(q, k, v, g, cfg, block_indices=aux.block_indices)
    assert_matches(out, aux, ref_out, ref_aux, torch.bfloat16, check_indices=False)
    _, ref_aux3 = reference(q, k, v, g, cfg)
    same = (aux.block_indices == ref_aux3.block_indices).all(-1).float().mean().item()
    assert same >= 0.999, same


@pytest.mark.usefixtures("variant")
def test_gluon_benchmark_shape_stage3_selection() -> None:
    """As test_gpu_nsa's: T=8k, 16 query heads on 1 KV head, D=128, paper config, ≥ 99.95 %."""
    q, k, v, g = make_inputs(1, 8192, 16, 1, 128, torch.bfloat16, seed=8, device="cuda")
    _, aux = nsa_attention(q, k, v, g, PAPER, return_aux=True)
    _, ref = reference(q, k, v, g, PAPER)
    same = (aux.block_indices == ref.block_indices).all(-1).float().mean().item()
    assert same >= 0.9995, same
    assert_lse_close(aux.lse_cmp, ref.lse_cmp, 1e-4, "lse_cmp")


@pytest.mark.parametrize("scores", [True, False])
@pytest.mark.parametrize("name", GLUON)
def test_gluon_against_v2h_same_inputs(name: str, scores: bool) -> None:
    """Paper shape at 4k: o, lse and the top-n of a Gluon variant against v2h on one input."""
    q, k, v, _ = make_inputs(1, 4096, 64, 4, 128, torch.bfloat16, seed=11, device="cuda")
    tc = (4096 - PAPER.cmp_block) // PAPER.cmp_stride + 1
    gen = torch.Generator(device="cuda").manual_seed(12)
    kc = torch.randn(1, tc, 4, 128, device="cuda", generator=gen)  # fp32 k̃, split below
    vc = torch.randn(1, tc, 4, 128, device="cuda", generator=gen).to(torch.bfloat16)
    hi = kc.to(torch.float16)
    lo = (kc - hi.float()).to(torch.float16)
    scale = 128**-0.5
    o1, l1, i1 = COMPRESSED_IMPLS["v2h"](q, hi, vc, PAPER, scale, scores, kc_lo=lo)
    o2, l2, i2 = COMPRESSED_IMPLS[name](q, hi, vc, PAPER, scale, scores, kc_lo=lo)
    assert torch.isfinite(o2).all() and not torch.isnan(l2).any()
    assert ((o2 - o1).norm() / o1.norm()).item() < 1e-5
    fin = torch.isfinite(l1)
    assert torch.equal(fin, torch.isfinite(l2))
    assert (l2[fin] - l1[fin]).abs().max().item() < 1e-5
    if scores:
        same = (i1 == i2).all(-1).float().mean().item()
        assert same >= 0.9999, same
