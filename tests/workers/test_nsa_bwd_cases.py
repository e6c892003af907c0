"""nsa-backward's hidden cases with a given random selection: whatever the secret draws, they
tell a backward that uses the given block indices from one that re-selects the top-n itself
(``solutions/wrong/own_selection.py``).

CI at ``91c727b`` graded own_selection PASS: a random-selection case that draws
``sel_block`` 32 at T = 80 has no row with a choice (every eligible block fits the slots), and
a random draw could also land on the top-n where a choice was left. Over 300 secrets, the
exact top-n gradients passed both random cases for 7 secrets before the fix (each case alone
for 33-37), for none after it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.workers.test_bench_inputs import _assert_legal_selection
from workers.exercises import load_exercise
from workers.problems import nsa_bwd
from workers.problems.nsa import _cfg, nsa_gold

EX = load_exercise("nsa-backward")
SECRETS = [bytes([i]) * 32 for i in range(48)]


def _random_cases(secret: bytes) -> list[Any]:
    return [c for c in nsa_bwd.build_cases(EX, secret, "nonce") if c.params["select"] == "random"]


def test_every_hidden_length_has_a_config_with_a_choice() -> None:
    """The spec's lists let every drawn T meet a config where a selection can differ."""
    for T in EX.hidden["T"]:
        assert any(nsa_bwd.has_choice(T, _cfg(c)) for c in EX.hidden["configs"]), T


def test_random_selection_cases_leave_a_choice() -> None:
    for secret in SECRETS:
        for case in _random_cases(secret):
            assert nsa_bwd.has_choice(case.params["T"], _cfg(case.params["config"])), case.params


@pytest.mark.parametrize("T", sorted(set(EX.hidden["T"])))
@pytest.mark.parametrize("ci", range(len(EX.hidden["configs"])))
def test_random_selection_is_legal_and_avoids_the_topn(T: int, ci: int) -> None:
    """Legal (right count, ascending, forced blocks kept), and on every row and KV head with a
    choice to make, not the fp64 top-n."""
    cfg = _cfg(EX.hidden["configs"][ci])
    p = {"B": 1, "T": T, "Hq": 4, "Hkv": 2, "D": 16, "dtype": "float32", "select": "random"}
    x = nsa_bwd.case_inputs(p, 11 + T + ci, cfg)
    bi = x["block_indices"]
    _assert_legal_selection(bi, cfg)
    topn = nsa_gold(x["q"], x["k"], x["v"], x["gates"], cfg)["block_indices"]
    cur = torch.arange(T) // int(cfg["sel_block"])
    choice = (cur + 1 > int(cfg["sel_count"])).view(1, T, 1).expand(bi.shape[:3])
    differs = (bi != topn).any(-1)
    assert torch.equal(differs, choice), (int(choice.sum()), int(differs.sum()))


@pytest.mark.parametrize("i", range(16))
def test_a_reselecting_backward_fails_every_random_case(i: int) -> None:
    """The exact gradients of the top-n's forward (what own_selection computes, here in fp64:
    the most favourable to it) are judged wrong on each random-selection case."""
    for case in _random_cases(SECRETS[i]):
        call = nsa_bwd.materialize(EX, case)
        x, cfg = call.inputs[0], call.context["cfg"]
        topn = nsa_gold(x["q"], x["k"], x["v"], x["gates"], cfg)["block_indices"]
        own = nsa_bwd.grads_gold({**x, "block_indices": topn}, cfg)
        res = nsa_bwd.check(EX, case, call, [{n: g.to(x["q"].dtype) for n, g in own.items()}])
        assert not res.ok, (case.params, res.metrics)
