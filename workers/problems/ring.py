"""ring-attention: one process per rank, K/V passed around the ring by P2P (kernels spec §3).

Checked on every rank against that rank's shard of the global fp64 gold. The ring contract is
checked from the c10d ops the runner's profiler saw: no collective (all-gather, broadcast, ...)
and at least P-1 point-to-point transfers per rank.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from workers.problems.base import BenchShape, Call, CaseDef, OutSpec, value
from workers.problems.block import bench_gens as block_bench_gens
from workers.problems.block import check_attention
from workers.problems.common import (
    DTYPES,
    Check,
    Verdict,
    attention_flops,
    attention_gold,
    case_seed,
    fail,
    hidden_shape,
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
#: Elements of one fp64 score tile, and of all of them, when a timed call is checked: rank 0's
#: 32k rows against 64k keys and 32 heads would be 2^36; 2^31 keeps 1024 random rows.
GOLD_CHUNK = 1 << 26
GOLD_BUDGET = 1 << 31
_SYSRAND = random.SystemRandom()  # which rows are checked: not derivable from anything public


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
        p = {
            **hidden_shape(h, pick, i),
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
        # a rank's shard; the hidden distributions, row by row, as in block-attention
        gens = block_bench_gens(ex, [B, n, Hq, D], [B, n, Hkv, D], dt)
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


def _gold_rows(
    q: torch.Tensor,
    qpos: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention of query rows q [B, R, Hq, D] at global positions ``qpos`` against the
    whole sequence k, v [B, T, Hkv, D], in ``dtype``: out [B, R, Hq, D], lse [B, Hq, R].
    Row chunks bound the score tile (a rank's rows against 64k keys do not fit at once)."""
    B, R, Hq, D = q.shape
    T, G = k.shape[1], Hq // k.shape[2]
    sc = (1.0 / math.sqrt(D)) if scale is None else float(scale)
    kh = k.to(dtype).permute(0, 2, 1, 3).repeat_interleave(G, dim=1)  # [B, Hq, T, D]
    vh = v.to(dtype).permute(0, 2, 1, 3).repeat_interleave(G, dim=1)
    kpos = torch.arange(T, device=q.device).view(1, -1)
    step = max(1, GOLD_CHUNK // max(1, B * Hq * T))
    outs, lses = [], []
    for i in range(0, R, step):
        s = q[:, i : i + step].to(dtype).permute(0, 2, 1, 3) @ kh.transpose(-1, -2) * sc
        if causal:
            s = s.masked_fill(qpos[i : i + step].view(-1, 1) < kpos, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # [B, Hq, r]; -inf for rows that see no key
        p = torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0.0).unsqueeze(-1))
        outs.append((p.nan_to_num(0.0) @ vh).permute(0, 2, 1, 3))
        lses.append(lse)
    return torch.cat(outs, 1), torch.cat(lses, 2)


def check_bench(
    ex: Any,
    shape: BenchShape,
    x: dict[str, torch.Tensor],
    out: dict[str, torch.Tensor],
    shards: list[dict[str, torch.Tensor]] | None = None,
) -> Check:
    """A timed call's rank-0 outputs against the gold of the whole ring.

    ``x`` is rank 0's shard and ``shards`` every rank's (each rank draws its own: a ring that
    skipped its transfers would otherwise compute the right answer from its own shard); without
    ``shards`` every rank is taken to hold ``x``. Rank 0's rows are checked: all of them on
    small shapes, else a random subset the submission cannot foresee (``GOLD_BUDGET``).
    """
    p = shape.params
    P = int(ex.world_size)
    layout = p.get("layout", "zigzag")
    causal = bool(p["causal"])
    q = x["q"]
    B, n, Hq, _ = q.shape
    T = n * P
    dev = q.device
    shards = shards or [x] * P  # rank r's inputs
    glob = {}
    for name in ("k", "v"):
        t = x[name].new_empty((B, T, *x[name].shape[2:]))  # [B, T, Hkv, D]
        for r in range(P):
            t[:, positions(T, P, r, layout).to(dev)] = shards[r][name]
        glob[name] = t
    rows = torch.arange(n, device=dev)
    keep = max(1, GOLD_BUDGET // max(1, B * Hq * T))
    if keep < n:
        rows = torch.tensor(sorted(_SYSRAND.sample(range(n), keep)), device=dev)
    qpos = positions(T, P, 0, layout).to(dev)[rows]
    args = (q[:, rows], qpos, glob["k"], glob["v"])
    kw = {"causal": causal, "scale": p.get("scale")}
    go, gl = _gold_rows(*args, dtype=torch.float64, **kw)
    lo, ll = _gold_rows(*args, dtype=torch.float32, **kw)
    mine = {"out": out["out"][:, rows], "lse": out["lse"][:, :, rows]}
    c = check_attention(ex, mine, go, gl, lowprec(lo, q.dtype), ll)
    if not c.ok:
        c.message = f"rank 0: {c.message}"
    return c
