"""nsa-attention: Native Sparse Attention, graded in stages (kernels spec §4.3).

1. selection: aux.block_indices equal (as sets) to the gold on every row whose n-th and
   (n+1)-th gold scores are well separated (peaked inputs), so ties never decide;
2. given the gold block_indices: out and the three per-branch LSEs within tolerance;
3. end to end on random inputs: >= 99.9 % of rows with identical index sets (the others must
   be near-ties), and out within tolerance of the gold computed with the submission's own
   (validated) indices.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from workers.problems.base import BenchShape, Call, CaseDef, OutSpec, value
from workers.problems.common import (
    DTYPES,
    Check,
    Verdict,
    case_seed,
    compare,
    fail,
    hidden_shape,
    lowprec,
    out_floor,
    rng,
    sample,
    shape_picker,
)

PEAKED_Q = 3.0  # q scale of the peaked (stage 1) inputs

CONFIG_FIELDS = (
    "cmp_block",
    "cmp_stride",
    "sel_block",
    "sel_count",
    "sel_init",
    "sel_local",
    "window",
    "scale",
    "compress",
)


def _cfg(c: dict[str, Any]) -> dict[str, Any]:
    d = {
        "cmp_block": 32,
        "cmp_stride": 16,
        "sel_block": 64,
        "sel_count": 16,
        "sel_init": 1,
        "sel_local": 2,
        "window": 512,
        "scale": None,
        "compress": "mean",
    }
    d.update({k: c[k] for k in CONFIG_FIELDS if k in c})
    return d


def _softmax_branch(
    s: torch.Tensor, mask: torch.Tensor, vals: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Masked softmax over the last axis: (out, lse, p); empty rows give (0, -inf, 0)."""
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
    p = torch.nan_to_num(p, nan=0.0)
    return torch.matmul(p, vals), lse, p


def nsa_gold(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    cfg: dict[str, Any],
    block_indices: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> dict[str, torch.Tensor]:
    """Dense NSA with explicit masks, in ``dtype``. Returns out, lse_*, scores, block_indices."""
    B, T, Hq, Dk = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    l, d, lp, n = cfg["cmp_block"], cfg["cmp_stride"], cfg["sel_block"], cfg["sel_count"]
    w = cfg["window"]
    sc = 1.0 / math.sqrt(Dk) if cfg.get("scale") is None else float(cfg["scale"])
    dev = q.device
    qh = q.to(dtype).permute(0, 2, 1, 3)  # B,Hq,T,D
    kh = k.to(dtype).permute(0, 2, 1, 3)  # B,Hkv,T,D
    vh = v.to(dtype).permute(0, 2, 1, 3)
    t_idx = torch.arange(T, device=dev)
    # compressed branch
    Tc = (T - l) // d + 1 if l <= T else 0
    if Tc > 0:
        starts = torch.arange(Tc, device=dev) * d
        gather = starts.view(-1, 1) + torch.arange(l, device=dev).view(1, -1)  # Tc,l
        kc = kh[:, :, gather].mean(3)  # B,Hkv,Tc,D
        vc = vh[:, :, gather].mean(3)
        kce = kc.repeat_interleave(G, 1)
        vce = vc.repeat_interleave(G, 1)
        vis = (starts.view(1, -1) + l - 1) <= t_idx.view(-1, 1)  # T,Tc
        o_cmp, lse_cmp, p_cmp = _softmax_branch(
            torch.matmul(qh, kce.transpose(-1, -2)) * sc, vis, vce
        )
    else:
        o_cmp = torch.zeros(B, Hq, T, vh.shape[-1], dtype=dtype, device=dev)
        lse_cmp = torch.full((B, Hq, T), float("-inf"), dtype=dtype, device=dev)
        p_cmp = torch.zeros(B, Hq, T, 0, dtype=dtype, device=dev)
    # selection scores: omega(i, j) = overlap of cmp block i and sel block j, over d
    Ts = (T + lp - 1) // lp
    ci = torch.arange(Tc, device=dev).view(-1, 1) * d
    sj = torch.arange(Ts, device=dev).view(1, -1) * lp
    omega = ((torch.minimum(ci + l, sj + lp) - torch.maximum(ci, sj)).clamp_min(0) / d).to(dtype)
    score = torch.matmul(p_cmp, omega)  # B,Hq,T,Ts
    score = score.view(B, Hkv, G, T, Ts).sum(2)  # B,Hkv,T,Ts
    cur = (t_idx // lp).view(-1, 1)
    j = torch.arange(Ts, device=dev).view(1, -1)
    eligible = j <= cur
    forced = eligible & ((j < cfg["sel_init"]) | (j > cur - cfg["sel_local"]))
    s_rank = score.masked_fill(~eligible, float("-inf")).masked_fill(forced, float("inf"))
    count = torch.clamp(cur.view(-1) + 1, max=n)  # T
    if block_indices is None:
        order = torch.sort(
            s_rank, dim=-1, descending=True, stable=True
        ).indices  # ties -> smaller j
        ntake = min(n, Ts)
        top = order[..., :ntake]
        keep = torch.arange(ntake, device=dev).view(1, -1) < count.view(-1, 1)
        top = torch.where(keep, top, torch.full_like(top, Ts + 1))
        top = torch.sort(top, dim=-1).values
        top = torch.where(top > Ts, torch.full_like(top, -1), top)
        bi = torch.full((B, Hkv, T, n), -1, dtype=torch.int64, device=dev)
        bi[..., :ntake] = top
    else:
        bi = block_indices.to(dev).long().permute(0, 2, 1, 3)  # B,T,Hkv,n -> B,Hkv,T,n
    # selection branch: token mask from the chosen blocks, causal inside the current block
    chosen = torch.zeros(B, Hkv, T, Ts + 1, dtype=torch.bool, device=dev)
    chosen.scatter_(-1, torch.where(bi < 0, torch.full_like(bi, Ts), bi), True)
    tok_blk = torch.arange(T, device=dev) // lp
    slc_mask = chosen[..., :Ts][..., tok_blk] & (t_idx.view(1, -1) <= t_idx.view(-1, 1))
    slc_mask = slc_mask.repeat_interleave(G, 1)  # B,Hq,T,T
    khe = kh.repeat_interleave(G, 1)
    vhe = vh.repeat_interleave(G, 1)
    s_full = torch.matmul(qh, khe.transpose(-1, -2)) * sc
    o_slc, lse_slc, _ = _softmax_branch(s_full, slc_mask, vhe)
    diff = t_idx.view(-1, 1) - t_idx.view(1, -1)
    win_mask = (diff >= 0) & (diff < w)
    o_win, lse_win, _ = _softmax_branch(s_full, win_mask.expand_as(s_full), vhe)
    gt = gates.to(dtype).permute(0, 2, 1, 3)  # B,Hq,T,3
    out = gt[..., 0:1] * o_cmp + gt[..., 1:2] * o_slc + gt[..., 2:3] * o_win
    return {
        "out": out.permute(0, 2, 1, 3),
        "lse_cmp": lse_cmp.permute(0, 2, 1),
        "lse_slc": lse_slc.permute(0, 2, 1),
        "lse_win": lse_win.permute(0, 2, 1),
        "block_indices": bi.permute(0, 2, 1, 3).to(torch.int32),  # B,T,Hkv,n
        "scores": s_rank.permute(0, 2, 1, 3),  # B,T,Hkv,Ts (+inf forced, -inf ineligible)
        "count": count,
    }


def build_cases(ex: Any, secret: bytes, nonce: str) -> list[CaseDef]:
    cases = []
    for i, c in enumerate(ex.public_cases):
        for stage in (1, 2, 3):
            cases.append(
                CaseDef(
                    f"public/{c['name']}/stage{stage}",
                    "visible",
                    {**c, "stage": stage},
                    int(c.get("seed", i)) * 7 + stage,
                )
            )
    h = ex.hidden
    pick = shape_picker(secret, nonce)

    for i in range(int(h["count"])):
        p = {
            **hidden_shape(h, pick, i),
            "config": pick(h["configs"]),
            "favour": i % 3,
        }  # each branch favoured in turn by the gates
        for stage in (1, 2, 3):
            cases.append(
                CaseDef(
                    f"hidden/{i}/stage{stage}",
                    "hidden",
                    {**p, "stage": stage},
                    case_seed(secret, nonce, "case", i, stage),
                )
            )
    return cases


def _inputs(p: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    return nsa_inputs(p, seed, peaked=int(p["stage"]) == 1)


def nsa_inputs(p: dict[str, Any], seed: int, *, peaked: bool) -> dict[str, torch.Tensor]:
    """q, k, v, gates of a case (``p``: B, T, Hq, Hkv, D, dtype, optional favour); ``peaked``
    scales q by PEAKED_Q (separated block scores, large logits). Shared with nsa_bwd."""
    g = rng(seed)
    dt = DTYPES[p["dtype"]]
    B, T, Hq, Hkv, D = (int(p[k]) for k in ("B", "T", "Hq", "Hkv", "D"))
    q = sample((B, T, Hq, D), "normal", g)
    k = sample((B, T, Hkv, D), "normal", g)
    if peaked:
        # Planted peaks: one strong direction per selection block makes block scores far
        # apart, so the gold top-n is unambiguous (stage 1 must not hinge on ties).
        q = q * PEAKED_Q
    v = sample((B, T, Hkv, D), "normal", g)
    gates = torch.rand((B, T, Hq, 3), generator=g)
    fav = int(p.get("favour", -1))
    if fav >= 0:  # the same rule as the timing generator's per-row "favour"
        gates[..., fav] = 0.5 + 0.5 * gates[..., fav]
        gates[..., [c for c in range(3) if c != fav]] *= 0.5
    return {"q": q.to(dt), "k": k.to(dt), "v": v.to(dt), "gates": gates.to(dt)}


def _out_specs(
    B: int, T: int, Hq: int, Hkv: int, Dv: int, n: int, dt: torch.dtype
) -> list[OutSpec]:
    return [
        OutSpec("out", [0], dt, (B, T, Hq, Dv)),
        OutSpec("block_indices", [1, "block_indices"], torch.int32, (B, T, Hkv, n)),
        OutSpec("lse_cmp", [1, "lse_cmp"], torch.float32, (B, T, Hq)),
        OutSpec("lse_slc", [1, "lse_slc"], torch.float32, (B, T, Hq)),
        OutSpec("lse_win", [1, "lse_win"], torch.float32, (B, T, Hq)),
    ]


def materialize(ex: Any, case: CaseDef) -> Call:
    p = case.params
    cfg = _cfg(p.get("config") or {})
    x = _inputs(p, case.seed)
    B, T, Hq, D = x["q"].shape
    Hkv = x["k"].shape[2]
    gold = nsa_gold(x["q"], x["k"], x["v"], x["gates"], cfg)
    kw: dict[str, Any] = {"return_aux": value(True)}
    if int(p["stage"]) == 2:
        x["block_indices"] = gold["block_indices"].contiguous()
        kw["block_indices"] = "block_indices"
    outs = _out_specs(B, T, Hq, Hkv, x["v"].shape[-1], cfg["sel_count"], x["q"].dtype)
    return Call(
        [x],
        ["q", "k", "v", "gates", {"t": "nsa_config", "v": cfg}],
        kw,
        [outs],
        "tuple",
        {"params": p, "cfg": cfg, "gold": gold},
    )


def _validate_indices(
    bi: torch.Tensor, gold: dict[str, torch.Tensor], cfg: dict[str, Any]
) -> str | None:
    """The submission's own indices must be a legal selection: right count, eligible, forced."""
    s = gold["scores"]  # B,T,Hkv,Ts
    Ts = s.shape[-1]
    bil = bi.long()
    valid = bil >= 0
    if bool(((bil >= Ts) | (bil < -1)).any()):
        return "block index out of range"
    cnt = valid.sum(-1)  # B,T,Hkv
    want = gold["count"].view(1, -1, 1).expand_as(cnt)
    if not bool((cnt == want).all()):
        return "wrong number of selected blocks"
    srt = torch.sort(torch.where(valid, bil, torch.full_like(bil, Ts + 1)), -1).values
    dup = (srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] <= Ts)
    if bool(dup.any()):
        return "duplicate selected blocks"
    sv = torch.gather(s, -1, bil.clamp_min(0))
    if bool((torch.isneginf(sv) & valid).any()):
        return "selected a block that is not eligible (future block)"
    forced_n = torch.isposinf(s).sum(-1)
    got_forced = (torch.isposinf(sv) & valid).sum(-1)
    if not bool((forced_n == got_forced).all()):
        return "a forced block (initial or local) is missing"
    return None


def _index_sets_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    big = 1 << 30
    sa = torch.sort(torch.where(a < 0, torch.full_like(a, big), a.int()), -1).values
    sb = torch.sort(torch.where(b < 0, torch.full_like(b, big), b.int()), -1).values
    return (sa == sb).all(-1)  # B,T,Hkv


def _check_values(
    ex: Any,
    x: dict[str, torch.Tensor],
    out: dict[str, torch.Tensor],
    gold: dict[str, torch.Tensor],
    low: dict[str, torch.Tensor],
) -> Check:
    t = ex.tolerance
    dt = x["q"].dtype
    gmax = float(gold["out"].abs().max())
    c = compare(
        "out",
        out["out"],
        gold["out"],
        lowprec(low["out"], dt),
        k=t["out"]["k"],
        atol_floor=out_floor(t["out"], out["out"].dtype, gmax),
        rel_rms=t["out"].get("rel_rms"),
        allclose=tuple(t["out"]["allclose"]) if "allclose" in t["out"] else None,
    )
    if not c.ok:
        return c
    for br in ("lse_cmp", "lse_slc", "lse_win"):
        c2 = compare(
            br,
            out[br],
            gold[br],
            low[br],
            k=t["lse"]["k"],
            atol_floor=t["lse"]["floor_abs"],
            max_abs=t["lse"].get("max_abs"),
        )
        if not c2.ok:
            return c2
    return c


def _stage_check(
    ex: Any,
    stage: int,
    cfg: dict[str, Any],
    x: dict[str, torch.Tensor],
    out: dict[str, torch.Tensor],
    gold: dict[str, torch.Tensor],
) -> Check:
    t = ex.tolerance
    args = (x["q"], x["k"], x["v"], x["gates"], cfg)
    bi = out["block_indices"]
    if stage == 2:
        low = nsa_gold(*args, block_indices=x["block_indices"], dtype=torch.float32)
        return _check_values(ex, x, out, gold, low)
    same = _index_sets_equal(bi, gold["block_indices"])
    if stage == 1:
        # Rows whose count-th and (count+1)-th gold scores are close are excluded: a tie there
        # may go either way for an honest kernel.
        s = torch.sort(
            gold["scores"].nan_to_num(posinf=1e30, neginf=-1e30), -1, descending=True
        ).values
        cnt = gold["count"].view(1, -1, 1).expand(s.shape[:-1]).long()
        Ts = s.shape[-1]
        a = torch.gather(s, -1, (cnt - 1).clamp(0, Ts - 1).unsqueeze(-1)).squeeze(-1)
        b = torch.gather(s, -1, cnt.clamp(0, Ts - 1).unsqueeze(-1)).squeeze(-1)
        sep = (cnt >= Ts) | ((a - b) > t["select"]["gap"]) | (b <= -1e29)
        frac_sep = float(sep.double().mean())
        if frac_sep < t["select"]["min_separated"]:
            raise RuntimeError(f"stage-1 input not separated enough ({frac_sep:.3f}): task bug")
        bad = sep & ~same
        if bool(bad.any()):
            return fail(
                Verdict.WRONG_ANSWER,
                f"selection: {int(bad.sum())} rows select other blocks than the top-n",
                separated=frac_sep,
            )
        return Check(None, "", {"separated": frac_sep})
    # stage 3: end to end with the submission's own indices
    frac = float(same.double().mean())
    if frac < t["select"]["min_identical"]:
        return fail(Verdict.WRONG_ANSWER, f"selection: only {frac:.4f} of rows identical")
    msg = _validate_indices(bi, gold, cfg)
    if msg:
        return fail(Verdict.WRONG_ANSWER, f"selection: {msg}")
    if frac < 1.0:
        # Mismatching rows must be near-ties: their gold score sums differ by < gap.
        s = gold["scores"].nan_to_num(posinf=0.0, neginf=0.0)
        mine = torch.gather(s, -1, bi.long().clamp_min(0)).masked_fill(bi < 0, 0).sum(-1)
        ref = (
            torch.gather(s, -1, gold["block_indices"].long().clamp_min(0))
            .masked_fill(gold["block_indices"] < 0, 0)
            .sum(-1)
        )
        if bool(((ref - mine) > t["select"]["gap"]).any()):
            return fail(Verdict.WRONG_ANSWER, "selection: a mismatching row is not a near-tie")
        gold = nsa_gold(*args, block_indices=bi)
    low = nsa_gold(*args, block_indices=bi, dtype=torch.float32)
    return _check_values(ex, x, out, gold, low)


def check(ex: Any, case: CaseDef, call: Call, outputs: list[dict[str, torch.Tensor]]) -> Check:
    c = _stage_check(
        ex,
        int(case.params["stage"]),
        call.context["cfg"],
        call.inputs[0],
        outputs[0],
        call.context["gold"],
    )
    if not c.ok:
        c.message = f"stage {case.params['stage']}: {c.message}"
    return c


def bench_gens(B: int, T: int, Hq: int, Hkv: int, D: int, dt: str) -> dict[str, dict[str, Any]]:
    """Timed-call inputs as hard as the hidden tests, all in every call: q rows normal or
    peaked (the stage-1 scale: separated block scores, logits large enough that 16-bit
    logits miss the per-branch LSE tolerance), and gates that favour one branch per (token,
    head) row, each branch in turn, so a kernel that drops or skimps on a branch is wrong on
    about a third of every call's rows."""
    return {
        "q": {"shape": [B, T, Hq, D], "dtype": dt, "mix": {"values": [1.0, PEAKED_Q]}},
        "k": {"shape": [B, T, Hkv, D], "dtype": dt},
        "v": {"shape": [B, T, Hkv, D], "dtype": dt},
        "gates": {"shape": [B, T, Hq, 3], "dtype": dt, "dist": "uniform", "favour": {}},
    }


def bench_calls(ex: Any) -> list[BenchShape]:
    shapes = []
    for s in ex.benchmark:
        dt = s["dtype"]
        cfg = _cfg(s.get("config") or {})
        B, T, Hq, Hkv, D = (int(s[k]) for k in ("B", "T", "Hq", "Hkv", "D"))
        gens = bench_gens(B, T, Hq, Hkv, D, dt)
        outs = _out_specs(B, T, Hq, Hkv, D, cfg["sel_count"], DTYPES[dt])
        Tc = max(0, (T - cfg["cmp_block"]) // cfg["cmp_stride"] + 1)
        keys = Tc / 2 + cfg["sel_count"] * cfg["sel_block"] + cfg["window"]
        isz = torch.finfo(DTYPES[dt]).bits // 8
        nbytes = isz * B * T * (2 * Hq * D + 2 * Hkv * D + 3 * Hq)
        shapes.append(
            BenchShape(
                s["name"],
                {**s, "stage": 3},
                gens,
                ["q", "k", "v", "gates", {"t": "nsa_config", "v": cfg}],
                {"return_aux": value(True)},
                outs,
                "tuple",
                4.0 * B * Hq * T * keys * D,
                float(nbytes),
            )
        )
    return shapes


def check_bench(
    ex: Any, shape: BenchShape, x: dict[str, torch.Tensor], out: dict[str, torch.Tensor]
) -> Check:
    cfg = _cfg(shape.params.get("config") or {})
    gold = nsa_gold(x["q"], x["k"], x["v"], x["gates"], cfg)
    return _stage_check(ex, 3, cfg, x, out, gold)
