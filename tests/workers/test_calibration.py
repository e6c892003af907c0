"""Tolerance calibration (grader spec §4): honest solutions pass, lower-precision variants fail.

Runs the checker's problem modules in-process on every public and hidden case of one secret;
the solution files are our own (trusted), imported directly here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from workers.exercises import Solution, load_exercise
from workers.problems import load_problem
from workers.verdicts import Verdict

SECRET = b"calibration-secret"
LOWPREC = {
    "attention-merge": ["bf16_merge", "no_max_subtraction"],
    "block-attention": ["bf16_logits", "no_max_subtraction"],
    "nsa-attention": ["bf16_scores"],
    "nsa-backward": ["bf16_intermediates"],
}
HONEST = {
    "attention-merge": ["stable_fp32", "sigmoid_form"],
    "block-attention": ["blockwise_torch", "dense_fp32"],
    "nsa-attention": ["masked_torch", "fp16_compressed"],
    "nsa-backward": ["dense_autograd", "manual_grads"],
}


def _load(path: Path) -> ModuleType:
    if "# include:" in path.read_text():  # one file as graded: its includes inlined
        mod = ModuleType(f"sol_{path.parent.name}_{path.stem}")
        exec(compile(Solution(path, Verdict.PASS).source(), str(path), "exec"), mod.__dict__)
        return mod
    spec = importlib.util.spec_from_file_location(f"sol_{path.parent.name}_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Cfg:
    def __init__(self, d: dict) -> None:  # type: ignore[type-arg]
        self.__dict__.update(d)


def _verdicts(ex_id: str, sol: str, folder: str) -> list[object]:
    ex = load_exercise(ex_id)
    prob = load_problem(ex.problem)
    fn = getattr(_load(ex.path / "solutions" / folder / f"{sol}.py"), ex.entry)
    out = []
    for case in prob.build_cases(ex, SECRET, "nonce"):
        call = prob.materialize(ex, case)
        x = call.inputs[0]
        args = [x[a] if isinstance(a, str) else _Cfg(a["v"]) for a in call.args]
        kwargs = {k: (x[v] if isinstance(v, str) else v["v"]) for k, v in call.kwargs.items()}
        ret = fn(*args, **kwargs)
        outs = {}
        for o in call.outputs[0]:
            cur = ret
            for s in o.sel:
                cur = cur[s] if isinstance(s, int) else getattr(cur, s)
            outs[o.name] = cur
        out.append(prob.check(ex, case, call, [outs]).verdict)
    return out


@pytest.mark.parametrize(("ex_id", "sol"), [(e, s) for e, ss in HONEST.items() for s in ss])
def test_honest_passes_every_case(ex_id: str, sol: str) -> None:
    assert all(v is None for v in _verdicts(ex_id, sol, "correct"))


@pytest.mark.parametrize(("ex_id", "sol"), [(e, s) for e, ss in LOWPREC.items() for s in ss])
def test_lower_precision_variant_fails(ex_id: str, sol: str) -> None:
    assert any(v is not None for v in _verdicts(ex_id, sol, "wrong"))


def test_nsa_gold_matches_reference_naive() -> None:
    """Our fp64 NSA gold against the kernels package's naive reference (where it exists)."""
    naive = pytest.importorskip("kernels.nsa.naive")
    import torch

    from kernels.nsa import NSAConfig
    from workers.problems.nsa import nsa_gold

    g = torch.Generator().manual_seed(0)
    B, T, Hq, Hkv, D = 1, 96, 4, 2, 16
    q, k, v = (torch.randn(B, T, h, D, generator=g) for h in (Hq, Hkv, Hkv))
    gates = torch.rand(B, T, Hq, 3, generator=g)
    cfg = {
        "cmp_block": 16,
        "cmp_stride": 8,
        "sel_block": 16,
        "sel_count": 3,
        "sel_init": 1,
        "sel_local": 1,
        "window": 24,
        "scale": None,
        "compress": "mean",
    }
    mine = nsa_gold(q, k, v, gates, cfg)
    out, aux = naive.nsa_attention_naive(q, k, v, gates, NSAConfig(**cfg), return_aux=True)
    assert torch.equal(mine["block_indices"], aux.block_indices.to(torch.int32))
    assert torch.allclose(mine["out"].float(), out.float(), atol=1e-5)


@pytest.mark.parametrize("select", ["topn", "random"])
def test_nsa_grad_gold_matches_reference_naive_autograd(select: str) -> None:
    """nsa-backward's fp64 gradient gold against autograd through the kernels package's naive
    reference (fp32), on the forward's top-n and on a random legal selection; and the gold is
    finite with empty compressed rows present (t < l - 1)."""
    naive = pytest.importorskip("kernels.nsa.naive")
    import torch

    from kernels.nsa import NSAConfig
    from workers.problems import nsa_bwd

    cfg = nsa_bwd._cfg(
        {"cmp_block": 16, "cmp_stride": 8, "sel_block": 16, "sel_count": 3, "window": 24}
    )
    p = {"B": 1, "T": 96, "Hq": 4, "Hkv": 2, "D": 16, "dtype": "float32", "select": select}
    x = nsa_bwd.case_inputs(p, 5, cfg)
    gold = nsa_bwd.grads_gold(x, cfg)
    leaves = [x[n].clone().requires_grad_(True) for n in nsa_bwd.LEAVES]
    out = naive.nsa_attention_naive(*leaves, NSAConfig(**cfg), block_indices=x["block_indices"])
    got = torch.autograd.grad(out, leaves, x["dout"])
    for name, g in zip(nsa_bwd.GRADS, got, strict=True):
        assert bool(torch.isfinite(gold[name]).all()), name
        err = float((g.double() - gold[name]).abs().max())
        assert err <= 1e-4 * float(gold[name].abs().max()), (name, err)
