"""Shared checker helpers: secret-mixed seeds, input distributions, tolerances, comparisons."""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from workers.verdicts import Verdict

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def case_seed(secret: bytes, *parts: object) -> int:
    """HMAC the server secret into a case seed, so seeds cannot be derived from public data."""
    msg = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hmac.new(secret, msg, hashlib.sha256).digest()[:8], "little") >> 1


def rng(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def sample(shape: tuple[int, ...] | list[int], dist: str, g: torch.Generator) -> torch.Tensor:
    """fp32 CPU samples; several distributions so degenerate-input special cases fail (spec §3)."""
    shape = tuple(shape)
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    if dist == "normal":
        return x
    if dist == "peaked":  # large logits: an unstable or low-precision softmax breaks
        return x * 3.0
    if dist == "heavy":  # Student-t(3): rare big values
        chi = torch.randn((3, *shape), generator=g).pow(2).sum(0) / 3.0
        return (x / chi.clamp_min(0.05).sqrt()).clamp(-30, 30)
    if dist == "large":  # logits past exp()'s fp32 range: no max subtraction overflows
        return x * 10.0
    if dist == "uniform":
        return torch.rand(shape, generator=g) * 2 - 1
    raise ValueError(f"unknown distribution {dist!r}")


#: ``sample``'s distributions as row variants of the runner's timing generator (gen spec
#: ``mix``): one timed call holds rows of every hidden distribution at once.
BENCH_MIX: dict[str, float | str] = {"normal": 1.0, "peaked": 3.0, "large": 10.0, "heavy": "heavy"}


def bench_mix(dists: Sequence[str]) -> dict[str, Any]:
    """The gen-spec ``mix`` entry for a list of ``sample`` distributions (spec ``hidden.dists``)."""
    return {"values": [BENCH_MIX[d] for d in dists]}


@dataclass
class Check:
    """Outcome of checking one call. verdict None means passed."""

    verdict: Verdict | None = None
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.verdict is None


def fail(verdict: Verdict, message: str, **metrics: Any) -> Check:
    return Check(verdict, message, metrics)


def compare(
    name: str,
    out: torch.Tensor,
    gold: torch.Tensor,
    lowref: torch.Tensor | None,
    *,
    k: float,
    atol_floor: float,
    rel_rms: float | None = None,
    allclose: tuple[float, float] | None = None,
    max_abs: float | None = None,
    rms_k: float | None = None,
    rms_floor: float = 0.0,
) -> Check:
    """All-element comparison against fp64 gold (spec §4).

    Bound: max|out-gold| <= k * max|lowref-gold| + atol_floor, where lowref is the honest
    computation in the submission's precision (fp32 math, one final cast). With ``rms_k``, also
    RMS(out-gold) <= rms_k * RMS(lowref-gold) + rms_floor: an honest kernel rounds once and
    lands on lowref's RMS error, a shortcut through 16-bit intermediates rounds several times
    and lands well above it even where its largest error stays within k. Positions where gold
    is -inf must be exactly -inf (empty rows); any other non-finite value fails.
    """
    out = out.to(torch.float64)
    gold = gold.to(torch.float64)
    low = lowref.to(torch.float64) if lowref is not None else None
    neg = torch.isneginf(gold)
    # Masked copies only where there are empty rows: without them the flat views are the same
    # elements, and a CPU rehearsal's checker spent most of each check copying them.
    if bool(neg.any()):
        missing = neg & ~torch.isneginf(out)
        if bool(missing.any()):
            return fail(
                Verdict.WRONG_ANSWER,
                f"{name}: {_count(int(missing.sum()), 'position')} should be -inf (empty rows) "
                f"and are not; the first: {_element(name, out, gold, missing)}",
            )
        fin = ~neg
        o, gd = out[fin], gold[fin]
        low = low[fin] if low is not None else None
    else:
        o, gd = out.reshape(-1), gold.reshape(-1)
        low = low.reshape(-1) if low is not None else None
    if not bool(torch.isfinite(gd).all()):
        raise RuntimeError(f"{name}: gold is not finite (task bug)")
    if not bool(torch.isfinite(o).all()):
        nonfinite = ~torch.isfinite(out) & ~neg
        bad = int(nonfinite.sum())
        return fail(
            Verdict.WRONG_ANSWER,
            f"{name}: {_count(bad, 'NaN/Inf value')}; the first: "
            f"{_element(name, out, gold, nonfinite)}",
        )
    if o.numel() == 0:
        return Check()
    err = (o - gd).abs()
    max_err = float(err.max())
    low_err = (low - gd).abs() if low is not None else None
    ref_err = float(low_err.max()) if low_err is not None else 0.0
    bound = k * ref_err + atol_floor
    m: dict[str, Any] = {"max_err": max_err, "bound": bound, "ref_err": ref_err}
    # The messages below (failures only: locating costs a pass over the tensors) say which
    # element is worst, what it holds against the gold, and what the tolerance is made of.
    if max_err > bound:
        made_of = (
            f"{k:g} x {ref_err:.3g} (the largest error of the honest kernel: fp32 maths, one "
            f"rounding to the output dtype) + {atol_floor:.3g}"
            if low is not None
            else "an absolute floor"
        )
        return fail(
            Verdict.WRONG_ANSWER,
            f"{name}: max abs error {max_err:.3g} exceeds the tolerance {bound:.3g}, at "
            f"{_worst(name, out, gold, neg)}; tolerance = {made_of}",
            **m,
        )
    rms = float(err.square().mean().sqrt()) if rms_k is not None or rel_rms is not None else 0.0
    if rms_k is not None and low_err is not None:
        low_rms = float(low_err.square().mean().sqrt())
        rms_bound = rms_k * low_rms + rms_floor
        m.update(rms_err=rms, rms_bound=rms_bound)
        if rms > rms_bound:
            return fail(
                Verdict.WRONG_ANSWER,
                f"{name}: RMS error {rms:.3g} exceeds {rms_bound:.3g} ({rms_k:g} x the honest "
                f"kernel's {low_rms:.3g}, + {rms_floor:.3g}: lower-precision intermediates?); "
                f"its largest error {max_err:.3g} is at {_worst(name, out, gold, neg)}",
                **m,
            )
    if rel_rms is not None:
        rms_ref = float(gd.square().mean().sqrt())
        r = rms / max(rms_ref, 1e-30)
        m["rel_rms"] = r
        if r > rel_rms:
            return fail(
                Verdict.WRONG_ANSWER,
                f"{name}: relative RMS error {r:.3g} exceeds {rel_rms:g}; its largest error "
                f"{max_err:.3g} is at {_worst(name, out, gold, neg)}",
                **m,
            )
    if allclose is not None:
        atol, rtol = allclose
        outside = err > atol + rtol * gd.abs()
        if bool(outside.any()):
            over = (out - gold).abs() - (atol + rtol * gold.abs())
            return fail(
                Verdict.WRONG_ANSWER,
                f"{name}: {_count(int(outside.sum()), 'element')} outside |error| <= {atol:g} + "
                f"{rtol:g} x |expected|; the furthest at {_worst(name, out, gold, neg, over)}",
                **m,
            )
    if max_abs is not None and max_err > max_abs:
        return fail(
            Verdict.WRONG_ANSWER,
            f"{name}: max abs error {max_err:.3g} exceeds the absolute limit {max_abs:g}, at "
            f"{_worst(name, out, gold, neg)}",
            **m,
        )
    return Check(None, "", m)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _element(name: str, out: torch.Tensor, gold: torch.Tensor, pick: torch.Tensor) -> str:
    """The first element where ``pick`` (a boolean tensor of ``out``'s shape) holds, as
    ``out[0, 17, 3, 5] = nan (expected 0.8125)``."""
    flat = int(torch.argmax(pick.reshape(-1).to(torch.uint8)))
    return _describe(name, out, gold, flat)


def _worst(
    name: str,
    out: torch.Tensor,
    gold: torch.Tensor,
    neg: torch.Tensor,
    score: torch.Tensor | None = None,
) -> str:
    """The element of largest ``score`` (default: absolute error), empty rows (``neg``) aside,
    as ``_element`` writes it."""
    if score is None:
        score = (out - gold).abs()
    score = score.masked_fill(neg, -math.inf).nan_to_num(nan=-math.inf)
    return _describe(name, out, gold, int(torch.argmax(score.reshape(-1))))


def _describe(name: str, out: torch.Tensor, gold: torch.Tensor, flat: int) -> str:
    idx = []
    rest = flat
    for n in reversed(out.shape):
        idx.append(rest % n)
        rest //= n
    where = ", ".join(str(i) for i in reversed(idx))
    got, want = float(out.reshape(-1)[flat]), float(gold.reshape(-1)[flat])
    return f"{name}[{where}] = {got:.6g} (expected {want:.6g}; shape {list(out.shape)})"


def attention_gold(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    q_offset: int = 0,
    k_offset: int = 0,
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain dense attention in ``dtype``: out [B,Tq,Hq,D], lse [B,Hq,Tq]; empty rows -> (0, -inf)."""
    B, Tq, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    sc = (1.0 / math.sqrt(D)) if scale is None else float(scale)
    qh = q.to(dtype).permute(0, 2, 1, 3)  # B,Hq,Tq,D
    kh = k.to(dtype).permute(0, 2, 1, 3).repeat_interleave(G, dim=1)
    vh = v.to(dtype).permute(0, 2, 1, 3).repeat_interleave(G, dim=1)
    s = torch.matmul(qh, kh.transpose(-1, -2)) * sc
    if causal:
        qi = torch.arange(Tq, device=q.device).view(-1, 1) + q_offset
        kj = torch.arange(k.shape[1], device=q.device).view(1, -1) + k_offset
        s = s.masked_fill(~(qi >= kj), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf for empty rows
    p = torch.exp(s - lse.unsqueeze(-1).masked_fill(torch.isneginf(lse).unsqueeze(-1), 0.0))
    p = torch.nan_to_num(p, nan=0.0)
    out = torch.matmul(p, vh).permute(0, 2, 1, 3)
    return out, lse


def out_floor(tol: dict[str, Any], dtype: torch.dtype, gmax: float) -> float:
    """Absolute floor of the output bound: ``floor_eps`` fp32 ulps of max|gold| (honest fp32
    chains such as ring merges add a few), plus one ulp of a 16-bit output dtype (a final cast
    that truncates, as the Triton interpreter's does, is still an honest single cast)."""
    f = float(tol["floor_eps"]) * torch.finfo(torch.float32).eps * gmax
    if dtype in (torch.bfloat16, torch.float16):
        f += torch.finfo(dtype).eps * gmax
    return f


def lowprec(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The honest kernel's own rounding: fp32 math cast once to the output dtype."""
    return x.to(torch.float32).to(dtype)


def attention_flops(B: int, Hq: int, Tq: int, Tk: int, D: int, causal: bool) -> float:
    f = 4.0 * B * Hq * Tq * Tk * D
    return f / 2 if causal else f


def public_cases(ex: Any) -> list[Any]:
    """The exercise's public cases, in spec order, visible to the student."""
    from workers.problems.base import CaseDef

    return [
        CaseDef(f"public/{c['name']}", "visible", dict(c), int(c.get("seed", i)))
        for i, c in enumerate(ex.public_cases)
    ]


def shape_picker(secret: bytes, nonce: str) -> Callable[[Sequence[Any]], Any]:
    """Draws hidden-case options from a generator keyed by the server secret and the run nonce,
    so neither the runner nor a student who has seen earlier runs can predict the shapes."""
    g = torch.Generator().manual_seed(case_seed(secret, nonce, "shapes"))

    def pick(opts: Sequence[Any]) -> Any:
        return opts[int(torch.randint(len(opts), (1,), generator=g))]

    return pick


def hidden_shape(h: dict[str, Any], pick: Callable[[Sequence[Any]], Any], i: int) -> dict[str, Any]:
    """Hidden case ``i``'s B, T, heads, D and dtype from a spec's ``hidden:`` options, drawn in
    this order (a problem's further draws follow, so a secret keeps giving the same cases)."""
    hq, hkv = pick(h["heads"])
    return {
        "B": pick(h["B"]),
        "T": pick(h["T"]),
        "Hq": hq,
        "Hkv": hkv,
        "D": pick(h["D"]),
        "dtype": h["dtypes"][i % len(h["dtypes"])],
    }
