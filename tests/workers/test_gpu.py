"""GPU-only grader checks (skip cleanly without CUDA)."""

from __future__ import annotations

import pytest

from workers.exercises import load_exercise
from workers.harness import grade
from workers.verdicts import Verdict

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
def test_timed_correct_solution_passes_with_speedup() -> None:
    ex = load_exercise("attention-merge")
    r = grade(ex.id, (ex.path / "solutions/correct/stable_fp32.py").read_bytes(), device="cuda")
    assert r.verdict is Verdict.PASS, r.output
    assert r.speedup is not None and r.timings
    for t in r.timings:
        assert t.n >= 10 and t.median_ms >= t.floor_ms


@needs_cuda
def test_side_stream_cheat_is_integrity_violation() -> None:
    src = """
import torch
_s = torch.cuda.Stream()
def merge_attention(out_a, lse_a, out_b, lse_b):
    with torch.cuda.stream(_s):
        lse = torch.logaddexp(lse_a, lse_b)
        safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
        out = out_a.float() * torch.exp(lse_a - safe).transpose(1, 2).unsqueeze(-1)
        out = out + out_b.float() * torch.exp(lse_b - safe).transpose(1, 2).unsqueeze(-1)
        for _ in range(20):
            out = out + 0
        return out.to(out_a.dtype), lse
"""
    r = grade("attention-merge", src, device="cuda")
    assert r.verdict in (Verdict.INTEGRITY_VIOLATION, Verdict.WRONG_ANSWER), r.output


GPU_ONLY = [
    (ex_id, s)
    for ex_id in (
        "attention-merge",
        "block-attention",
        "nsa-attention",
        "nsa-backward",
        "ring-attention",
        "ring-attention-x4",  # skipped below on fewer than 4 GPUs
    )
    for s in load_exercise(ex_id).solutions()
    if s.needs == "gpu"
]


@needs_cuda
@pytest.mark.parametrize(("ex_id", "sol"), GPU_ONLY, ids=[f"{e}:{s.name}" for e, s in GPU_ONLY])
def test_gpu_only_known_solutions(ex_id: str, sol) -> None:  # type: ignore[no-untyped-def]
    world = load_exercise(ex_id).world_size
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    r = grade(ex_id, sol.source(), device="cuda")
    assert r.verdict is sol.expected, r.output
    assert "benchmark" in r.output


@needs_cuda
@pytest.mark.parametrize("sol", ["dense_autograd", "manual_grads"])
def test_nsa_backward_honest_solutions_pass_beside_the_triton_reference(sol: str) -> None:
    """The GPU risks of the backward exercise: autograd's device threads (started by the
    runners' warm-up, not counted against the submission), the fp64 gradient gold at T = 4k on
    the checker's GPU, and the Triton reference's bf16 numerics (P, dS in bf16) within the
    tolerance when its timed calls are checked beside the submission."""
    ex = load_exercise("nsa-backward")
    r = grade(ex.id, (ex.path / f"solutions/correct/{sol}.py").read_bytes(), device="cuda")
    assert r.verdict is Verdict.PASS, r.output
    assert r.timings and all(t.n >= 10 for t in r.timings)


@needs_cuda
def test_nsa_backward_triton_reference_is_within_the_tolerance() -> None:
    """Our reference's own timed calls are not checked in a grading: its Triton backward's
    bf16 numerics against the checker's gradient gold and tolerance, on the benchmark shape's
    timing inputs (several seeds), here."""
    import importlib.util
    from types import SimpleNamespace

    from workers.harness.sandboxed import inputs as gen
    from workers.problems import load_problem

    ex = load_exercise("nsa-backward")
    prob = load_problem(ex.problem)
    spec = importlib.util.spec_from_file_location("nsa_bwd_reference", ex.reference)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    for shape in prob.bench_calls(ex):
        cfg = SimpleNamespace(**shape.args[5]["v"])
        for seed in (1, 2, 3):
            x = gen.gen_inputs(shape.gens, seed, "cuda")
            args = (x["q"], x["k"], x["v"], x["gates"], x["dout"], cfg, x["block_indices"])
            got = dict(zip(prob.GRADS, ref.nsa_backward(*args), strict=True))
            c = prob.check_bench(ex, shape, x, got)
            assert c.ok, f"{shape.name} seed {seed}: {c.message}"
