"""ring-attention: one process per rank, K/V passed around the ring by P2P (kernels spec §3).

Checked on every rank against that rank's shard of the global fp64 gold. The ring contract is
checked from the c10d ops the runner's profiler saw: no collective (all-gather, broadcast, ...)
and at least P-1 point-to-point transfers per rank.
"""

from __future__ import annotations

from typing import Any

import torch

from workers.problems.base import BenchShape, Call, CaseDef, OutSpec, value
from workers.problems.block import check_attention
from workers.problems.common import (
    DTYPES,
    Check,
    Verdict,
    attention_flops,
    attention_gold,
    case_seed,
    fail,
    lowprec,
    public_cases,
    rng,
    sample,
    shape_picker,
)

# c10d op names (profiler / dispatcher) that move a whole tensor to every rank: forbidden here.
COLLECTIVES = (
    "allgather",
    "all_gather",
    "broadcast",
    "allreduce",
    "all_reduce",
    "alltoall",
    "all_to_all",
    "reduce_scatter",
    "gather",
    "scatter",
)
P2P = ("send", "recv", "isend", "irecv")


def positions(T: int, P: int, r: int, layout: str) -> torch.Tensor:
    if layout == "contiguous":
        return torch.arange(r * T // P, (r + 1) * T // P)
    if layout == "zigzag":
        c = T // (2 * P)
        return torch.cat(
            [torch.arange(r * c, (r + 1) * c), torch.arange((2 * P - 1 - r) * c, (2 * P - r) * c)]
        )
    if layout == "stripe":
        return torch.arange(r, T, P)
    raise ValueError(f"unknown layout {layout!r}")


def build_cases(ex: Any, secret: bytes, nonce: str) -> list[CaseDef]:
    cases = public_cases(ex)
    h = ex.hidden
    pick = shape_picker(secret, nonce)

    for i in range(int(h["count"])):
        hq, hkv = pick(h["heads"])
        p = {
            "B": pick(h["B"]),
            "T": pick(h["T"]),
            "Hq": hq,
            "Hkv": hkv,
            "D": pick(h["D"]),
            "dtype": h["dtypes"][i % len(h["dtypes"])],
            "dist": h["dists"][i % len(h["dists"])],
            "causal": bool(i % 2 == 0),
            "layout": h["layouts"][i % len(h["layouts"])],
            "scale": pick(h["scales"]),
        }
        cases.append(CaseDef(f"hidden/{i}", "hidden", p, case_seed(secret, nonce, "case", i)))
    return cases


def materialize(ex: Any, case: CaseDef) -> Call:
    p = case.params
    P = int(ex.world_size)
    g = rng(case.seed)
    dt = DTYPES[p["dtype"]]
    B, T, Hq, Hkv, D = (int(p[k]) for k in ("B", "T", "Hq", "Hkv", "D"))
    dist = p.get("dist", "normal")
    q = sample((B, T, Hq, D), dist, g).to(dt)
    k = sample((B, T, Hkv, D), dist, g).to(dt)
    v = sample((B, T, Hkv, D), "normal", g).to(dt)
    inputs, outs = [], []
    for r in range(P):
        idx = positions(T, P, r, p["layout"])
        inputs.append(
            {"q": q[:, idx].contiguous(), "k": k[:, idx].contiguous(), "v": v[:, idx].contiguous()}
        )
        n = idx.numel()
        outs.append(
            [OutSpec("out", [0], dt, (B, n, Hq, D)), OutSpec("lse", [1], torch.float32, (B, Hq, n))]
        )
    kw = {
        "causal": value(bool(p["causal"])),
        "group": {"t": "group"},
        "layout": value(p["layout"]),
        "scale": value(p.get("scale")),
    }
    return Call(inputs, ["q", "k", "v"], kw, outs, "tuple", {"params": p, "global": (q, k, v)})


def check_contract(P: int, meta: list[dict[str, Any]]) -> Check:
    for r, m in enumerate(meta):
        ops = m.get("c10d_ops") or {}
        coll = {
            k: n
            for k, n in ops.items()
            if any(c in k.lower() for c in COLLECTIVES) and "barrier" not in k.lower()
        }
        if coll:
            return fail(
                Verdict.POLICY_VIOLATION,
                f"rank {r} used collectives {sorted(coll)}: K/V must move by P2P only",
            )
        p2p = sum(
            n
            for k, n in ops.items()
            if any(k.lower().rsplit("::", 1)[-1].rstrip("_") == s for s in P2P)
        )
        if P > 1 and p2p < P - 1:
            return fail(
                Verdict.POLICY_VIOLATION,
                f"rank {r} made {p2p} point-to-point transfers, expected >= {P - 1}",
            )
    return Check()


def check(
    ex: Any,
    case: CaseDef,
    call: Call,
    outputs: list[dict[str, torch.Tensor]],
    meta: list[dict[str, Any]] | None = None,
) -> Check:
    p = call.context["params"]
    q, k, v = call.context["global"]
    P = int(ex.world_size)
    kw = {"causal": bool(p["causal"]), "scale": p.get("scale")}
    go, gl = attention_gold(q, k, v, **kw)
    lo, ll = attention_gold(q, k, v, dtype=torch.float32, **kw)
    lo = lowprec(lo, q.dtype)
    for r in range(P):
        idx = positions(q.shape[1], P, r, p["layout"])
        c = check_attention(ex, outputs[r], go[:, idx], gl[:, :, idx], lo[:, idx], ll[:, :, idx])
        if not c.ok:
            c.message = f"rank {r}: {c.message}"
            return c
    return check_contract(P, meta or [{} for _ in range(P)])


def bench_calls(ex: Any) -> list[BenchShape]:
    shapes = []
    P = int(ex.world_size)
    for s in ex.benchmark:
        dt = s["dtype"]
        B, T, Hq, Hkv, D = (int(s[k]) for k in ("B", "T", "Hq", "Hkv", "D"))
        n = T // P
        gens = {
            "q": {"shape": [B, n, Hq, D], "dtype": dt, "dist": "normal"},
            "k": {"shape": [B, n, Hkv, D], "dtype": dt, "dist": "normal"},
            "v": {"shape": [B, n, Hkv, D], "dtype": dt, "dist": "normal"},
        }
        kw = {
            "causal": value(bool(s["causal"])),
            "group": {"t": "group"},
            "layout": value(s.get("layout", "zigzag")),
            "scale": value(None),
        }
        outs = [
            OutSpec("out", [0], DTYPES[dt], (B, n, Hq, D)),
            OutSpec("lse", [1], torch.float32, (B, Hq, n)),
        ]
        isz = torch.finfo(DTYPES[dt]).bits // 8
        shapes.append(
            BenchShape(
                s["name"],
                dict(s),
                gens,
                ["q", "k", "v"],
                kw,
                outs,
                "tuple",
                attention_flops(B, Hq, T, T, D, bool(s["causal"])) / P,
                float(isz * B * n * (2 * Hq + 2 * Hkv) * D),
            )
        )
    return shapes


def check_bench(
    ex: Any, shape: BenchShape, x: dict[str, torch.Tensor], out: dict[str, torch.Tensor]
) -> Check:
    # Ring timing probes would need all ranks' inputs in one place; correctness is fully
    # covered by the checked cases, so timed probes only check finiteness and shape here.
    o = out["out"]
    if not bool(torch.isfinite(o.float()).all()):
        return fail(Verdict.WRONG_ANSWER, "non-finite output in a timed call")
    return Check()
