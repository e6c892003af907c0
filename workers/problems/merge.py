"""attention-merge: merge two partial attention results over disjoint key sets (kernels spec §2)."""

from __future__ import annotations

from typing import Any

import torch

from workers.problems.base import BenchShape, Call, CaseDef, OutSpec
from workers.problems.common import (
    DTYPES,
    Check,
    case_seed,
    compare,
    lowprec,
    out_floor,
    public_cases,
    rng,
    sample,
    shape_picker,
)

# LSEs are lse_scale * (N(0, 1) + LSE_OFFSET): at lse_scale 10 they sit near 100, where one
# bf16 ulp is 0.5, so a merge that rounds its LSEs to 16 bits is visibly wrong.
LSE_OFFSET = 10.0


def build_cases(ex: Any, secret: bytes, nonce: str) -> list[CaseDef]:
    cases = public_cases(ex)
    h = ex.hidden
    pick = shape_picker(secret, nonce)

    for i in range(int(h["count"])):
        p = {
            "B": pick(h["B"]),
            "T": pick(h["T"]),
            "H": pick(h["H"]),
            "D": pick(h["D"]),
            "dtype": h["dtypes"][i % len(h["dtypes"])],
            "lse_scale": h["lse_scales"][i % len(h["lse_scales"])],
            "empty_frac": pick(h["empty_fracs"]),
        }
        cases.append(CaseDef(f"hidden/{i}", "hidden", p, case_seed(secret, nonce, "case", i)))
    return cases


def _inputs(p: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    g = rng(seed)
    dt = DTYPES[p["dtype"]]
    B, T, H, D = (int(p[k]) for k in ("B", "T", "H", "D"))
    out_a = sample((B, T, H, D), "normal", g)
    out_b = sample((B, T, H, D), "normal", g)
    sc = float(p.get("lse_scale", 3.0))
    # Large common offsets overflow exp() in any merge that does not subtract the max.
    shift = sc * LSE_OFFSET
    lse_a = sample((B, H, T), "normal", g) * sc + shift
    lse_b = sample((B, H, T), "normal", g) * sc + shift
    ef = float(p.get("empty_frac", 0.0))
    if ef > 0:
        # Empty sides: a block that saw no visible key has out 0 and lse -inf.
        ea = torch.rand((B, H, T), generator=g) < ef
        eb = torch.rand((B, H, T), generator=g) < ef
        lse_a = lse_a.masked_fill(ea, float("-inf"))
        lse_b = lse_b.masked_fill(eb, float("-inf"))
        out_a = out_a.masked_fill(ea.permute(0, 2, 1).unsqueeze(-1), 0.0)
        out_b = out_b.masked_fill(eb.permute(0, 2, 1).unsqueeze(-1), 0.0)
    return {"out_a": out_a.to(dt), "lse_a": lse_a, "out_b": out_b.to(dt), "lse_b": lse_b}


def merge_gold(
    x: dict[str, torch.Tensor], dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    la, lb = x["lse_a"].to(dtype), x["lse_b"].to(dtype)
    oa, ob = x["out_a"].to(dtype), x["out_b"].to(dtype)
    lse = torch.logaddexp(la, lb)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(la - safe).permute(0, 2, 1).unsqueeze(-1)
    wb = torch.exp(lb - safe).permute(0, 2, 1).unsqueeze(-1)
    out = oa * wa + ob * wb
    return out, lse


def materialize(ex: Any, case: CaseDef) -> Call:
    x = _inputs(case.params, case.seed)
    B, T, H, D = x["out_a"].shape
    outs = [
        OutSpec("out", [0], x["out_a"].dtype, (B, T, H, D)),
        OutSpec("lse", [1], torch.float32, (B, H, T)),
    ]
    return Call(
        [x], ["out_a", "lse_a", "out_b", "lse_b"], {}, [outs], "tuple", {"params": case.params}
    )


def _check(ex: Any, x: dict[str, torch.Tensor], out: dict[str, torch.Tensor]) -> Check:
    go, gl = merge_gold(x)
    lo, ll = merge_gold(x, torch.float32)
    t = ex.tolerance
    gmax = float(go.abs().max()) if go.numel() else 0.0
    grms = float(go.pow(2).mean().sqrt()) if go.numel() else 0.0
    c = compare(
        "out",
        out["out"],
        go,
        lowprec(lo, x["out_a"].dtype),
        k=t["out"]["k"],
        atol_floor=out_floor(t["out"], out["out"].dtype, gmax),
        rel_rms=t["out"].get("rel_rms"),
        allclose=tuple(t["out"]["allclose"]) if "allclose" in t["out"] else None,
        rms_k=t["out"].get("rms_k"),
        rms_floor=float(t["out"]["floor_eps"]) * torch.finfo(torch.float32).eps * grms,
    )
    if not c.ok:
        return c
    return compare(
        "lse",
        out["lse"],
        gl,
        ll,
        k=t["lse"]["k"],
        atol_floor=t["lse"]["floor_abs"],
        max_abs=t["lse"].get("max_abs"),
    )


def check(ex: Any, case: CaseDef, call: Call, outputs: list[dict[str, torch.Tensor]]) -> Check:
    return _check(ex, call.inputs[0], outputs[0])


def bench_gens(ex: Any, B: int, T: int, H: int, D: int, dt: str) -> dict[str, dict[str, Any]]:
    """Timed-call inputs as hard as the hidden tests: every call mixes the hidden LSE scales row
    by row (one draw shared by both sides, so the two LSEs of a row are comparable) and empties
    rows at the hidden tests' largest rate, independently per side: empty on one side, on the
    other, and on both. An empty side is lse -inf with its out row zero (one draw per side)."""
    h = ex.hidden
    frac = max(float(f) for f in h["empty_fracs"])
    scales = [float(c) for c in h["lse_scales"]]
    rows = [B, H, T]
    gens: dict[str, dict[str, Any]] = {}
    for side in ("a", "b"):
        empty = {"key": f"empty_{side}", "frac": frac, "shape": rows}
        gens[f"out_{side}"] = {
            "shape": [B, T, H, D],
            "dtype": dt,
            "empty": {**empty, "fill": 0.0, "dims": [0, 2, 1]},  # [B, H, T] onto [B, T, H, D]
        }
        gens[f"lse_{side}"] = {
            "shape": rows,
            "dtype": "float32",
            "shift": LSE_OFFSET,
            "mix": {"values": scales, "key": "lse_scale", "shape": rows},
            "empty": {**empty, "fill": "-inf"},
        }
    return gens


def bench_calls(ex: Any) -> list[BenchShape]:
    shapes = []
    for s in ex.benchmark:
        B, T, H, D = (int(s[k]) for k in ("B", "T", "H", "D"))
        dt = s["dtype"]
        gens = bench_gens(ex, B, T, H, D, dt)
        outs = [
            OutSpec("out", [0], DTYPES[dt], (B, T, H, D)),
            OutSpec("lse", [1], torch.float32, (B, H, T)),
        ]
        isz = torch.finfo(DTYPES[dt]).bits // 8
        nbytes = 3 * B * T * H * D * isz + 3 * B * H * T * 4
        shapes.append(
            BenchShape(
                s["name"],
                dict(s),
                gens,
                ["out_a", "lse_a", "out_b", "lse_b"],
                {},
                outs,
                "tuple",
                6.0 * B * T * H * D,
                float(nbytes),
            )
        )
    return shapes


def check_bench(
    ex: Any, shape: BenchShape, x: dict[str, torch.Tensor], out: dict[str, torch.Tensor]
) -> Check:
    return _check(ex, x, out)
