"""Timed-call inputs as hard as the hidden tests (issue "Speed you can trust").

For every exercise and every benchmark and rehearsal shape (benchmark shapes scaled down to
CPU size), inputs drawn by the runner's generator from several per-call seeds:
(a) the honest solutions and our reference pass ``check_bench``;
(b) the known-wrong ``solutions/wrong/bench_low_precision.py`` path fails it on every seed;
(c) the inputs hold the hard features (empty rows, large LSEs, peaked and large logits,
    favoured gates).
Plus the generator itself: deterministic per seed (also across processes), new values per
seed, shared draws coordinated between tensors.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from workers.exercises import Exercise, Solution, load_exercise
from workers.harness.sandboxed import inputs as gen
from workers.harness.sandboxed import wire
from workers.problems import load_problem
from workers.problems.base import BenchShape
from workers.verdicts import Verdict

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (11, 12, 13)
# CPU-sized stand-ins for the GPU benchmark shapes: sequence lengths capped, heads divided by
# one factor (the GQA ratio kept where it fits), head dim and flags kept.
T_CAP = {
    "attention-merge": 2048,
    "block-attention": 256,
    "nsa-attention": 512,
    "nsa-backward": 256,
}
RING_T_CAP = 512
H_CAP = 4


def _load(path: Path) -> ModuleType:
    if "# include:" in path.read_text():  # one file as graded: its includes inlined
        sol = Solution(path, Verdict.PASS)
        mod = ModuleType(f"bi_{path.parent.name}_{path.stem}")
        exec(compile(sol.source(), str(path), "exec"), mod.__dict__)
        return mod
    spec = importlib.util.spec_from_file_location(f"bi_{path.parent.name}_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _scaled(s: dict[str, Any], t_cap: int) -> dict[str, Any]:
    s = dict(s, name=f"{s['name']}@cpu")
    for k in ("T", "Tq", "Tk"):
        if k in s:
            s[k] = min(int(s[k]), t_cap)
    if "Hq" in s:
        f = max(1, int(s["Hq"]) // H_CAP)
        s["Hq"], s["Hkv"] = max(1, int(s["Hq"]) // f), max(1, int(s["Hkv"]) // f)
    elif "H" in s:
        s["H"] = min(int(s["H"]), H_CAP)
    return s


def _shapes(ex: Exercise, t_cap: int) -> list[tuple[BenchShape, bool]]:
    """(shape, is the spec's own) for the rehearsal shapes and the scaled benchmark shapes."""
    prob = load_problem(ex.problem)
    real = prob.bench_calls(dataclasses.replace(ex, benchmark=ex.rehearsal))
    small = prob.bench_calls(
        dataclasses.replace(ex, benchmark=[_scaled(s, t_cap) for s in ex.benchmark])
    )
    return [(s, True) for s in real] + [(s, False) for s in small]


def _cases(ex_id: str) -> list[tuple[str, BenchShape, bool]]:
    ex = load_exercise(ex_id)
    return [(ex_id, s, own) for s, own in _shapes(ex, T_CAP[ex_id])]


CASES = [c for e in T_CAP for c in _cases(e)]
IDS = [f"{e}:{s.name}" for e, s, _ in CASES]


def _call(ex_id: str, mod: ModuleType, x: dict[str, torch.Tensor], shape: BenchShape, low: bool):
    """The outputs ``check_bench`` reads, from one solution module; ``low`` forces the
    low-precision path of bench_low_precision.py (its own detection only knows the real
    shapes), else the module's entry point runs as the harness would call it."""
    if ex_id == "attention-merge":
        fn = mod.merge_low_precision if low else mod.merge_attention
        o, lse = fn(x["out_a"], x["lse_a"], x["out_b"], x["lse_b"])
        return {"out": o, "lse": lse}
    if ex_id == "block-attention":
        kw = {k: v["v"] for k, v in shape.kwargs.items()}
        if low:
            o, lse = mod.attention(x["q"], x["k"], x["v"], low_precision=True, **kw)
        else:
            o, lse = mod.block_attention(x["q"], x["k"], x["v"], **kw)
        return {"out": o, "lse": lse}
    if ex_id == "nsa-backward":
        cfg = SimpleNamespace(**shape.args[5]["v"])
        args = (x["q"], x["k"], x["v"], x["gates"], x["dout"], cfg, x["block_indices"])
        fn = mod.low_precision_backward if low else mod.nsa_backward
        return dict(zip(("dq", "dk", "dv", "dgates"), fn(*args), strict=True))
    cfg = SimpleNamespace(**shape.args[4]["v"])
    args = (x["q"], x["k"], x["v"], x["gates"], cfg)
    if low:
        o, aux = mod.nsa(*args, return_aux=True, low_precision=True)
    else:
        o, aux = mod.nsa_attention(*args, return_aux=True)
    names = ("block_indices", "lse_cmp", "lse_slc", "lse_win")
    return {"out": o, **{n: getattr(aux, n) for n in names}}


# Our references too, where their CPU path is an honest fp32 computation: block-attention's CPU
# fallback (aten's CPU flash attention) misses the LSE bound on the public bf16 test already.
HONEST = {
    "attention-merge": ["solutions/correct/stable_fp32.py", "reference.py"],
    "block-attention": ["solutions/correct/dense_fp32.py", "solutions/correct/blockwise_torch.py"],
    "nsa-attention": ["solutions/correct/masked_torch.py", "reference.py"],
    "nsa-backward": [
        "solutions/correct/dense_autograd.py",
        "solutions/correct/manual_grads.py",
        "reference.py",
    ],
}
LOWPREC = "solutions/wrong/bench_low_precision.py"


@pytest.mark.parametrize(("ex_id", "shape", "own"), CASES, ids=IDS)
def test_honest_passes_and_low_precision_fails(ex_id: str, shape: BenchShape, own: bool) -> None:
    ex = load_exercise(ex_id)
    prob = load_problem(ex.problem)
    kernels = importlib.util.find_spec("kernels") is not None
    honest = [_load(ex.path / r) for r in HONEST[ex_id] if kernels or r != "reference.py"]
    low = _load(ex.path / LOWPREC)
    for seed in SEEDS:
        x = gen.gen_inputs(shape.gens, seed, "cpu")
        _assert_hard(ex_id, ex, shape, x)
        for mod in honest:
            c = prob.check_bench(ex, shape, x, _call(ex_id, mod, x, shape, low=False))
            assert c.ok, f"{mod.__name__} seed {seed}: {c.message}"
        # On the spec's own shapes the file must spot them itself, as in the real grading.
        c = prob.check_bench(ex, shape, x, _call(ex_id, low, x, shape, low=not own))
        assert not c.ok, f"low precision passed seed {seed}: {c.metrics}"


def _bench_key(ex_id: str, s: dict[str, Any]) -> tuple[Any, ...]:
    """How bench_low_precision.py recognises a spec shape (what its entry point sees)."""
    if ex_id == "attention-merge":
        return tuple(int(s[k]) for k in ("B", "T", "H", "D"))
    if ex_id == "block-attention":
        dims = tuple(int(s[k]) for k in ("B", "Tq", "Tk", "Hq", "Hkv", "D"))
        return (*dims, bool(s["causal"]))
    if ex_id in ("nsa-attention", "nsa-backward"):
        c = load_problem("nsa")._cfg(s.get("config") or {})
        fields = ("cmp_block", "cmp_stride", "sel_block", "sel_count", "sel_init", "sel_local")
        cfg = tuple(c[f] for f in (*fields, "window"))
        return (*(int(s[k]) for k in ("B", "T", "Hq", "Hkv", "D")), cfg)
    P = int(load_exercise(ex_id).world_size)
    dims = (int(s["B"]), int(s["T"]) // P, int(s["Hq"]), int(s["Hkv"]), int(s["D"]))
    return (*dims, bool(s["causal"]), s.get("layout", "zigzag"))


@pytest.mark.parametrize("ex_id", [*T_CAP, "ring-attention"])
def test_low_precision_file_knows_every_public_benchmark_shape(ex_id: str) -> None:
    # else it would quietly stop cheating on a changed spec shape and prove nothing
    ex = load_exercise(ex_id)
    low = _load(ex.path / LOWPREC)
    for s in [*ex.benchmark, *ex.rehearsal]:
        assert s["dtype"] == "bfloat16" and _bench_key(ex_id, s) in low.BENCH_SHAPES, s["name"]


# --------------------------------------------------------------------------- hard features


def _logits(x: dict[str, torch.Tensor]) -> torch.Tensor:
    q, k = x["q"].float(), x["k"].float()
    G = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(G, 2)
    return torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])  # [B, Hq, Tq, Tk]


def _row_scales(t: torch.Tensor) -> torch.Tensor:
    return t.float().std(-1).flatten()  # one per (b, t, h) row


def _assert_hard(ex_id: str, ex: Exercise, shape: BenchShape, x: dict[str, torch.Tensor]) -> None:
    if ex_id == "attention-merge":
        n_rows = x["lse_a"].numel()
        empty = {}
        for side in "ab":
            e = torch.isneginf(x[f"lse_{side}"])  # [B, H, T]
            rows = x[f"out_{side}"].permute(0, 2, 1, 3)  # [B, H, T, D]
            assert bool((rows[e] == 0).all()), "an empty side's out row must be zero"
            assert bool((rows[~e] != 0).any(-1).all()), "only empty sides are zero"
            empty[side] = e
        both = int((empty["a"] & empty["b"]).sum())
        one = int((empty["a"] ^ empty["b"]).sum())
        assert both > 0 and one > 0.2 * n_rows, (both, one)
        lse = torch.cat([x["lse_a"], x["lse_b"]]).flatten()
        fin = lse[torch.isfinite(lse)]
        assert float(fin.max()) > 90 and float(fin.min()) < 20  # scales 1 to 10, offset x10
        return
    if ex_id == "nsa-backward":
        _assert_legal_selection(x["block_indices"], shape.args[5]["v"])
        assert float(x["dout"].float().std()) > 0.5  # a real upstream gradient, not zeros
    if ex_id in ("nsa-attention", "nsa-backward"):
        g = x["gates"].float()  # [B, T, Hq, 3]
        fav = g.argmax(-1)
        assert set(fav.unique().tolist()) == {0, 1, 2}  # each branch favoured in every call
        top = g.max(-1).values
        assert bool((top >= 0.5).all()) and bool(((g <= 0.5).sum(-1) >= 2).all())
        sd = _row_scales(x["q"])
        assert float((sd > 2).float().mean()) > 0.3 and float((sd < 1.5).float().mean()) > 0.3
        return
    s = _logits(x)
    assert float(s.abs().max()) > 88.8  # exp() overflows fp32 without max subtraction
    sd = _row_scales(x["q"])
    for lo, hi in ((0.5, 1.5), (2.0, 4.0), (7.0, 13.0)):  # normal, peaked, large rows
        assert int(((sd > lo) & (sd < hi)).sum()) > 0, (lo, hi)


def _assert_legal_selection(bi: torch.Tensor, cfg: dict[str, Any]) -> None:
    """The timing generator's block indices: per row the right count, ascending, -1 padded,
    eligible, the forced blocks included, and random beyond them (not always the latest)."""
    B, T, H, n = bi.shape
    lp = int(cfg["sel_block"])
    cur = (torch.arange(T) // lp).view(1, T, 1)
    valid = bi >= 0
    assert torch.equal(valid.sum(-1), (cur + 1).clamp(max=n).expand(B, T, H))
    assert bool((valid[..., :-1] | ~valid[..., 1:]).all())  # -1 only as padding at the end
    assert bool(((bi[..., 1:] > bi[..., :-1]) | ~valid[..., 1:]).all())  # ascending, no repeats
    assert bool((bi.long() <= cur.unsqueeze(-1)).all())  # eligible only
    for j in range(int(cfg["sel_init"])):  # forced: the first blocks and the latest ones
        assert bool(((bi == j).any(-1) | (cur < j)).all())
    for back in range(int(cfg["sel_local"])):
        jj = cur - back
        assert bool(((bi.long() == jj.unsqueeze(-1)).any(-1) | (jj < 0)).all())
    full = (cur + 1 > n).expand(B, T, H)  # rows with a choice to make
    if bool(full.any()):
        latest = cur.unsqueeze(-1) - torch.arange(n - 1, -1, -1).view(1, 1, 1, n)
        assert not bool((bi.long() == latest)[full].all())


# --------------------------------------------------------------------------- ring-attention

RING_WORKER = r"""
import sys
sys.path.insert(0, sys.argv[3])
from tests.workers.test_bench_inputs import ring_rank_main
ring_rank_main(int(sys.argv[1]), sys.argv[2])
"""


def _ring_jobs() -> list[dict[str, Any]]:
    ex = load_exercise("ring-attention")
    jobs = []
    for shape, own in _shapes(ex, RING_T_CAP):
        for seed in SEEDS:
            jobs.append(
                {
                    "shape": shape.name,
                    "gens": shape.gens,
                    "seed": seed,
                    "own": own,
                    "kwargs": {k: v.get("v") for k, v in shape.kwargs.items() if k != "group"},
                }
            )
    return jobs


def ring_rank_main(rank: int, folder: str) -> None:
    """One gloo rank: runs every job with the honest ring and the low-precision one (rank 0
    saves the outputs). Every rank draws its own shard, as in a timed call."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rdv", rank=rank, world_size=2)
    ex = load_exercise("ring-attention")
    # (not our reference: its CPU blocks are aten's CPU flash attention, see HONEST)
    sols = {"honest": _load(ex.path / "solutions/correct/p2p_ring.py")}
    low = _load(ex.path / LOWPREC)
    res = {}
    for i, job in enumerate(json.loads(Path(folder, "jobs.json").read_text())):
        x = gen.gen_inputs(job["gens"], gen.rank_seed(job["seed"], rank), "cpu")
        kw = {**job["kwargs"], "group": dist.group.WORLD}
        for name, mod in sols.items():
            res[i, name] = mod.ring_attention_local(x["q"], x["k"], x["v"], **kw)
        if job["own"]:
            res[i, "low"] = low.ring_attention_local(x["q"], x["k"], x["v"], **kw)
        else:
            res[i, "low"] = low.ring(x["q"], x["k"], x["v"], low_precision=True, **kw)
    if rank == 0:
        torch.save(res, Path(folder, "out.pt"))
    dist.destroy_process_group()


def test_ring_honest_passes_and_low_precision_fails(tmp_path: Path) -> None:
    ex = load_exercise("ring-attention")
    prob = load_problem(ex.problem)
    jobs = _ring_jobs()
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RING_WORKER, str(r), str(tmp_path), str(ROOT)], cwd=ROOT, env=env
        )
        for r in range(2)
    ]
    for p in procs:
        assert p.wait(timeout=240) == 0
    res = torch.load(tmp_path / "out.pt")
    shapes = {s.name: s for s, _ in _shapes(ex, RING_T_CAP)}
    for i, job in enumerate(jobs):
        shape = shapes[job["shape"]]
        shards = [gen.gen_inputs(shape.gens, gen.rank_seed(job["seed"], r), "cpu") for r in (0, 1)]
        x = shards[0]
        assert not torch.equal(shards[0]["k"], shards[1]["k"])  # each rank its own draw
        _assert_hard("ring-attention", ex, shape, x)
        for name in ("honest", "low"):
            o, lse = res[i, name]
            c = prob.check_bench(ex, shape, x, {"out": o, "lse": lse}, shards=shards)
            assert c.ok == (name != "low"), f"{name} {job['shape']} seed {job['seed']}: {c.message}"


# --------------------------------------------------------------------------- the generator

MERGE_GENS = load_problem("merge").bench_gens(
    load_exercise("attention-merge"), 2, 24, 3, 8, "bfloat16"
)
ALL_GENS = {
    **MERGE_GENS,
    "q": {"shape": [1, 16, 4, 8], "dtype": "bfloat16", "mix": {"values": [1, 3, 10, "heavy"]}},
    "gates": {"shape": [1, 16, 4, 3], "dtype": "float32", "dist": "uniform", "favour": {}},
    "block_indices": {
        "shape": [1, 96, 2, 3],
        "dtype": "int32",
        "select": {"sel_block": 16, "sel_init": 1, "sel_local": 1},
    },
}


def _digest(x: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(x):
        h.update(name.encode())
        h.update(wire.raw_view(x[name]))
    return h.hexdigest()


def test_gen_inputs_is_deterministic_and_new_per_seed() -> None:
    a = gen.gen_inputs(ALL_GENS, 7, "cpu")
    b = gen.gen_inputs(ALL_GENS, 7, "cpu")
    c = gen.gen_inputs(ALL_GENS, 8, "cpu")
    assert set(a) == set(ALL_GENS)
    for name in ALL_GENS:
        assert a[name].dtype == wire.dtype_of(ALL_GENS[name]["dtype"])
        assert list(a[name].shape) == ALL_GENS[name]["shape"]
        assert torch.equal(a[name], b[name]), name
        assert not torch.equal(a[name], c[name]), name
    # empty-row masks are shared draws: new ones per seed as well
    assert not torch.equal(torch.isneginf(a["lse_a"]), torch.isneginf(c["lse_a"]))


def test_gen_inputs_is_the_same_in_another_process() -> None:
    # The runner and the checker are separate processes (and hash() is salted per process).
    code = (
        "from workers.harness.sandboxed import inputs as gen; "
        "from tests.workers.test_bench_inputs import ALL_GENS, _digest; "
        "print(_digest(gen.gen_inputs(ALL_GENS, 7, 'cpu')))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    assert out == _digest(gen.gen_inputs(ALL_GENS, 7, "cpu"))


def test_mix_draws_a_variant_per_row_shared_by_key() -> None:
    mix = {"values": [1, 100], "key": "m", "shape": [8, 256]}
    gens = {
        "x": {"shape": [8, 256, 64], "dtype": "float32", "mix": mix},
        "y": {"shape": [8, 256], "dtype": "float32", "shift": 10.0, "mix": mix},
    }
    d = gen.gen_inputs(gens, 3, "cpu")
    big = d["x"].std(-1) > 10  # [8, 256]
    assert 0.4 < float(big.float().mean()) < 0.6
    assert bool((d["x"].std(-1)[~big] < 2).all())
    assert torch.equal(big, d["y"] > 100)  # y = c (N + 10): the same rows drew 100


def test_heavy_rows_are_clamped_student_t() -> None:
    x = gen.gen_tensor(
        {"shape": [64, 1024], "dtype": "float32", "mix": {"values": ["heavy"]}}, 4, "cpu"
    )
    assert float(x.abs().max()) <= 30.0
    kurt = float((x**4).mean() / (x**2).mean() ** 2)
    assert kurt > 6.0  # a normal sample's is 3; Student-t(3)'s is unbounded


def test_shared_draws_must_agree_and_specs_are_checked() -> None:
    bad = {  # one key, two draw shapes
        "a": {"shape": [2, 3], "dtype": "float32", "empty": {"key": "k", "frac": 0.5, "fill": 0}},
        "b": {
            "shape": [2, 3],
            "dtype": "float32",
            "mix": {"values": [1], "key": "k", "shape": [2, 3]},
        },
    }
    with pytest.raises(ValueError, match="shared draw"):
        gen.gen_inputs(bad, 1, "cpu")
    with pytest.raises(ValueError, match="unknown gen spec keys"):
        gen.gen_inputs({"a": {"shape": [2], "dtype": "float32", "dits": "normal"}}, 1, "cpu")
    with pytest.raises(ValueError, match="a select gen spec"):
        sel = {"sel_block": 16, "sel_init": 1, "sel_local": 1}
        gen.gen_inputs({"a": {"shape": [1, 4, 1, 2], "dtype": "int64", "select": sel}}, 1, "cpu")
    with pytest.raises(ValueError, match="unknown gen dist"):
        gen.gen_inputs({"a": {"shape": [2], "dtype": "float32", "dist": "large"}}, 1, "cpu")
