"""nsa-backward: the gradients of the NSA forward (kernels spec §4.2 "Backward").

The submission gets q, k, v, gates, the upstream gradient dout and the forward's block_indices
and returns (dq, dk, dv, dgates): the gradients of ``out = Σ_c g_c·o_c`` (mean compression
differentiated) with the selection held fixed: the top-n is a discrete choice and gets no
gradient. Given indices, so top-n ties never decide (kernels spec §4.3, stage 2): in the
public case and half the hidden ones they are the fp64 top-n, in the others a random legal
selection (the forward's ``block_indices=`` accepts any) that differs from the top-n on every
row with a choice to make, drawn with a config that leaves some row such a choice at the
case's T. A backward that re-selects on its own is wrong there, whatever the secret draws.
(Before, with any config and a plain random draw, 7 secrets in 300 let it pass:
``tests/workers/test_nsa_bwd_cases.py``.)

Gold: plain torch autograd through the checker's own dense fp64 NSA (``nsa.nsa_gold``), never
the reference kernels. Each gradient's bound is the spec §4 error ratio against the same
autograd in fp32 cast once to the input dtype (the honest kernel), plus an fp32-ulp floor, a
16-bit floor for bf16 operands of tensor-core dots (FlashAttention's P and dS), a relative RMS
limit and, against lower-precision intermediates, an RMS bound.
"""

from __future__ import annotations

from typing import Any

import torch

from workers.harness.sandboxed.inputs import random_selection
from workers.problems.base import BenchShape, Call, CaseDef, OutSpec
from workers.problems.common import (
    DTYPES,
    Check,
    case_seed,
    compare,
    hidden_shape,
    rng,
    sample,
    shape_picker,
)
from workers.problems.nsa import PEAKED_Q, _cfg, nsa_gold, nsa_inputs

GRADS = ("dq", "dk", "dv", "dgates")
LEAVES = ("q", "k", "v", "gates")
ARGS: list[str | dict[str, Any]] = ["q", "k", "v", "gates", "dout"]


def grads_gold(
    x: dict[str, torch.Tensor],
    cfg: dict[str, Any],
    dtype: torch.dtype = torch.float64,
) -> dict[str, torch.Tensor]:
    """dq, dk, dv, dgates by autograd through the dense NSA in ``dtype``, given
    ``x["block_indices"]`` (no gradient through the selection: indices are integers)."""
    leaves = [x[n].detach().to(dtype).requires_grad_(True) for n in LEAVES]
    # enable_grad: a caller holding grad mode off (a no_grad test or tool) still gets the gold
    with torch.enable_grad():
        out = nsa_gold(*leaves, cfg, block_indices=x["block_indices"], dtype=dtype)["out"]
        got = torch.autograd.grad(out, leaves, x["dout"].to(dtype))
    return {n: g.detach() for n, g in zip(GRADS, got, strict=True)}


def _selection_spec(B: int, T: int, Hkv: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """The gen spec of a random legal selection (the runner's timing generator makes the same)."""
    return {
        "shape": [B, T, Hkv, int(cfg["sel_count"])],
        "dtype": "int32",
        "select": {k: int(cfg[k]) for k in ("sel_block", "sel_init", "sel_local")},
    }


def has_choice(T: int, cfg: dict[str, Any]) -> bool:
    """Whether some row of length T has a selection to make: more eligible blocks than slots,
    and a slot the forced blocks leave free."""
    n = int(cfg["sel_count"])
    eligible = (T - 1) // int(cfg["sel_block"]) + 1
    return eligible > n and int(cfg["sel_init"]) + int(cfg["sel_local"]) < n


def build_cases(ex: Any, secret: bytes, nonce: str) -> list[CaseDef]:
    cases = [
        CaseDef(f"public/{c['name']}", "visible", {**c, "select": "topn"}, int(c.get("seed", i)))
        for i, c in enumerate(ex.public_cases)
    ]
    h = ex.hidden
    pick = shape_picker(secret, nonce)
    for i in range(int(h["count"])):
        shape = hidden_shape(h, pick, i)
        select = "random" if i % 4 in (1, 2) else "topn"
        configs = h["configs"]
        if select == "random":  # spec lists are checked to leave one (tests/workers)
            configs = [c for c in configs if has_choice(shape["T"], _cfg(c))] or configs
        p = {
            **shape,
            "config": pick(configs),
            "favour": i % 3,  # each branch favoured in turn by the gates
            # Large logits (low-precision logits and softmax gradients break) and the random
            # selection each on one case of either dtype: i = 0..3 is fp32 peaked top-n, bf16
            # peaked random, fp32 normal random, bf16 normal top-n.
            "peaked": i % 4 in (0, 1),
            "select": select,
        }
        cases.append(CaseDef(f"hidden/{i}", "hidden", p, case_seed(secret, nonce, "case", i)))
    return cases


def case_inputs(p: dict[str, Any], seed: int, cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """q, k, v, gates as the forward's cases, dout, and the forward's block indices."""
    x = nsa_inputs(p, seed, peaked=bool(p.get("peaked", False)))
    dt = x["q"].dtype
    B, T, Hq, _ = x["q"].shape
    Hkv = x["k"].shape[2]
    # its own stream (keyed on the case seed): not a function of the other inputs' draws
    dout_shape = (*x["q"].shape[:3], x["v"].shape[-1])
    x["dout"] = sample(dout_shape, "normal", rng(case_seed(b"dout", seed))).to(dt)
    topn = nsa_gold(x["q"], x["k"], x["v"], x["gates"], cfg)["block_indices"]
    if p.get("select", "topn") == "topn":
        x["block_indices"] = topn
    else:
        spec = _selection_spec(B, T, Hkv, cfg)
        x["block_indices"] = random_selection(
            spec["shape"], spec["select"], case_seed(b"select", seed), "cpu", avoid=topn
        )
    x["block_indices"] = x["block_indices"].contiguous()
    return x


def _out_specs(x_shapes: dict[str, tuple[int, ...]], dt: torch.dtype) -> list[OutSpec]:
    return [
        OutSpec(g, [i], dt, x_shapes[n]) for i, (g, n) in enumerate(zip(GRADS, LEAVES, strict=True))
    ]


def _args(cfg: dict[str, Any]) -> list[str | dict[str, Any]]:
    return [*ARGS, {"t": "nsa_config", "v": cfg}, "block_indices"]


def materialize(ex: Any, case: CaseDef) -> Call:
    cfg = _cfg(case.params.get("config") or {})
    x = case_inputs(case.params, case.seed, cfg)
    shapes = {n: tuple(x[n].shape) for n in LEAVES}
    return Call(
        [x],
        _args(cfg),
        {},
        [_out_specs(shapes, x["q"].dtype)],
        "tuple",
        {"params": case.params, "cfg": cfg, "gold": grads_gold(x, cfg)},
    )


def check_grads(
    ex: Any,
    x: dict[str, torch.Tensor],
    out: dict[str, torch.Tensor],
    gold: dict[str, torch.Tensor],
    cfg: dict[str, Any],
) -> Check:
    """Each gradient against the fp64 gold; the first one off fails, named in the message."""
    dt = x["q"].dtype
    low = grads_gold(x, cfg, dtype=torch.float32)
    eps32 = torch.finfo(torch.float32).eps
    half = dt in (torch.bfloat16, torch.float16)
    eps16 = torch.finfo(dt).eps if half else 0.0
    checks = {}
    for n in GRADS:
        t = ex.tolerance[n]
        gmax = float(gold[n].abs().max())
        # the max bound's floor: fp32 ulps of max|gold| (other summation orders), plus for
        # 16-bit inputs ulps of that dtype: the output cast and the 16-bit rounding of the
        # operands an honest tensor-core backward feeds its dots (P and dS in FlashAttention-2)
        floor = (float(t["floor_eps"]) * eps32 + float(t["floor_ulps16"]) * eps16) * gmax
        rms_floor = (
            float(t["rms_floor_eps"]) * eps32 + float(t["rms_floor_ulps16"]) * eps16
        ) * gmax
        c = compare(
            n,
            out[n],
            gold[n],
            low[n].to(dt),
            k=float(t["k"]),
            atol_floor=floor,
            rel_rms=t.get("rel_rms"),
            rms_k=float(t["rms_k"]),
            rms_floor=rms_floor,
        )
        if not c.ok:
            return c
        checks[n] = c.metrics
    return Check(None, "", {"grads": checks})


def check(ex: Any, case: CaseDef, call: Call, outputs: list[dict[str, torch.Tensor]]) -> Check:
    return check_grads(ex, call.inputs[0], outputs[0], call.context["gold"], call.context["cfg"])


def bench_gens(
    B: int, T: int, Hq: int, Hkv: int, D: int, dt: str, cfg: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Timed-call inputs as hard as the hidden tests: q rows normal or peaked (large logits),
    gates favouring one branch per row in turn, a normal dout, and a random legal selection
    (a backward must use the indices it is given)."""
    return {
        "q": {"shape": [B, T, Hq, D], "dtype": dt, "mix": {"values": [1.0, PEAKED_Q]}},
        "k": {"shape": [B, T, Hkv, D], "dtype": dt},
        "v": {"shape": [B, T, Hkv, D], "dtype": dt},
        "gates": {"shape": [B, T, Hq, 3], "dtype": dt, "dist": "uniform", "favour": {}},
        "dout": {"shape": [B, T, Hq, D], "dtype": dt},
        "block_indices": _selection_spec(B, T, Hkv, cfg),
    }


def bench_calls(ex: Any) -> list[BenchShape]:
    shapes = []
    for s in ex.benchmark:
        dt = s["dtype"]
        cfg = _cfg(s.get("config") or {})
        B, T, Hq, Hkv, D = (int(s[k]) for k in ("B", "T", "Hq", "Hkv", "D"))
        shp = {"q": (B, T, Hq, D), "k": (B, T, Hkv, D), "v": (B, T, Hkv, D), "gates": (B, T, Hq, 3)}
        Tc = max(0, (T - cfg["cmp_block"]) // cfg["cmp_stride"] + 1)
        keys = Tc / 2 + cfg["sel_count"] * cfg["sel_block"] + cfg["window"]
        isz = torch.finfo(DTYPES[dt]).bits // 8
        # read q, k, v, gates, dout (and the indices); write dq, dk, dv, dgates
        nbytes = (
            isz * B * T * (3 * Hq * D + 4 * Hkv * D + 6 * Hq) + 4 * B * T * Hkv * cfg["sel_count"]
        )
        shapes.append(
            BenchShape(
                s["name"],
                dict(s),
                bench_gens(B, T, Hq, Hkv, D, dt, cfg),
                _args(cfg),
                {},
                _out_specs(shp, DTYPES[dt]),
                "tuple",
                # the forward the backward must recompute (P needs its lse, the gates' gradient
                # its outputs) plus the backward proper, 2.5x a forward (kernels spec §6)
                3.5 * 4.0 * B * Hq * T * keys * D,
                float(nbytes),
            )
        )
    return shapes


def check_bench(
    ex: Any, shape: BenchShape, x: dict[str, torch.Tensor], out: dict[str, torch.Tensor]
) -> Check:
    cfg = _cfg(shape.params.get("config") or {})
    return check_grads(ex, x, out, grads_gold(x, cfg), cfg)
