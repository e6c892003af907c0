"""Timing inputs made from a seed on the device (the runner) and regenerated from the same seed
by the checker, which checks timed calls against them: the same values bit for bit on the same
device, since every step is elementwise on seeded generators. A gen spec is the JSON the
benchmark plan carries per input tensor (see ``gen_tensor``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from .wire import dtype_of

# Keys a gen spec may carry (a typo must fail loudly, not silently fall back to normal values).
GEN_KEYS = frozenset(
    {"shape", "dtype", "dist", "scale", "shift", "mix", "empty", "favour", "select"}
)
HEAVY = "heavy"  # a "mix" variant: Student-t(3) values instead of the scaled normal ones


def _stream_seed(seed: int, label: str) -> int:
    """A 63-bit generator seed for one named random stream of a call. A keyed hash, not
    ``hash()`` (salted per process) nor ``seed + i`` (neighbouring seeds would share streams):
    runner and checker must derive the very same seeds."""
    d = hashlib.sha256(f"{int(seed)}:{label}".encode()).digest()
    return int.from_bytes(d[:8], "little") >> 1


def rank_seed(seed: int, rank: int) -> int:
    """The seed of one rank's shard in a timed call: rank 0 keeps the call's own, every other
    rank gets its own draw (identical shards would let a ring skip its transfers unseen)."""
    return int(seed) if rank == 0 else _stream_seed(seed, f"rank:{rank}")


def _uniform(shape: list[int], seed: int, device: str) -> Any:
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.rand(shape, generator=g, device=device, dtype=torch.float32)


class SharedDraws:
    """The uniform [0, 1) draws of one call that several tensors reference by key (an empty-row
    mask shared by ``out_a`` and ``lse_a``, a row scale shared by ``lse_a`` and ``lse_b``)."""

    def __init__(self, seed: int, device: str) -> None:
        self.seed, self.device = int(seed), device
        self.draws: dict[str, Any] = {}

    def get(self, key: str, shape: list[int]) -> Any:
        u = self.draws.get(key)
        if u is None:
            u = self.draws[key] = _uniform(
                shape, _stream_seed(self.seed, f"shared:{key}"), self.device
            )
        if list(u.shape) != shape:
            raise ValueError(f"shared draw {key!r} used with shapes {list(u.shape)} and {shape}")
        return u


def _selector(
    sel: dict[str, Any], tshape: list[int], seed: int, label: str, device: str, shared: Any
) -> Any:
    """Uniform draws for a "mix", "empty" or "favour" entry, viewed to broadcast against a tensor
    of shape ``tshape``: one value per index of ``sel["shape"]`` (default: every axis but the
    last, i.e. one per row), mapped onto the tensor's axes ``sel["dims"]`` (default: leading)."""
    shape = [int(s) for s in sel.get("shape", tshape[:-1])]
    dims = [int(d) for d in sel.get("dims", range(len(shape)))]
    if len(dims) != len(shape) or len(set(dims)) != len(dims):
        raise ValueError(f"bad selector dims {dims} for draw shape {shape}")
    if any(tshape[d] != s for d, s in zip(dims, shape, strict=True)):
        raise ValueError(f"draw shape {shape} does not fit tensor shape {tshape} at axes {dims}")
    key = sel.get("key")
    if key is None:
        u = _uniform(shape, _stream_seed(seed, label), device)
    elif shared is None:
        raise ValueError(f"shared draw {key!r} outside gen_inputs")
    else:
        u = shared.get(str(key), shape)
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    view = [1] * len(tshape)
    for i in order:
        view[dims[i]] = shape[i]
    return u.permute(order).reshape(view)


def _heavy(shape: list[int], seed: int, device: str) -> Any:
    """1/sqrt(chi2_3/3): times a standard normal, a Student-t(3) sample (the checker's "heavy")."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    chi = torch.zeros(shape, device=device, dtype=torch.float32)
    for _ in range(3):  # one normal at a time: a [3, *shape] draw would triple the peak memory
        z = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
        chi.addcmul_(z, z)
    return (chi / 3.0).clamp_min(0.05).rsqrt()


def random_selection(
    shape: list[int], sel: dict[str, Any], seed: int, device: str, avoid: Any = None
) -> Any:
    """NSA block indices ``[B, T, Hkv, n]`` int32: per row a random legal selection (kernels
    spec §4.2): the forced blocks (``j < sel_init`` and the ``sel_local`` latest eligible ones)
    plus random eligible others, ``min(n, ⌊t/l′⌋ + 1)`` in all, ascending, -1 padded. The
    inputs of a backward: the forward's choice, whatever it was. A stable sort of uniform draws
    (forced +2, ineligible -1), so runner and checker agree on the same device.

    avoid: block indices of the same layout (-1 padded) to keep out where another eligible
    block can take the slot (their draws lowered by 1): a checker's selection that differs
    from the top-n on every row with a choice to make."""
    import torch

    B, T, H, n = (int(s) for s in shape)
    lp = int(sel["sel_block"])
    Ts = -(-T // lp)
    u = _uniform([B, T, H, Ts], seed, device)
    cur = (torch.arange(T, device=device) // lp).view(1, T, 1, 1)
    j = torch.arange(Ts, device=device)
    elig = j <= cur
    forced = elig & ((j < int(sel["sel_init"])) | (j > cur - int(sel["sel_local"])))
    if avoid is not None:  # [B, T, H, n] → [B, T, H, Ts]; -1 padding lands in a spare column
        hit = torch.zeros([B, T, H, Ts + 1], dtype=torch.bool, device=device)
        hit.scatter_(-1, torch.where(avoid < 0, Ts, avoid).long(), True)
        u = u - hit[..., :Ts].to(u.dtype)
    score = u.masked_fill(forced, 2.0).masked_fill(~elig, -1.0)
    top = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :n]
    keep = torch.arange(top.shape[-1], device=device) < (cur + 1).clamp(max=n)
    top = torch.sort(torch.where(keep, top, Ts + 1), dim=-1).values
    top = torch.where(top > Ts, -1, top)
    out = torch.full([B, T, H, n], -1, dtype=torch.int32, device=device)
    out[..., : top.shape[-1]] = top
    return out


def gen_tensor(
    spec: dict[str, Any], seed: int, device: str, shared: SharedDraws | None = None
) -> Any:
    """One timing input, made on the device from a seed the parent draws at call time; the
    checker regenerates it with this same function to check timed probes (same device: the
    same values bit for bit, since every step is elementwise on seeded generators).

    ``spec`` (JSON): ``shape``, ``dtype`` (required) and, applied in this order:

    - ``dist``: base samples, ``"normal"`` (default) or ``"uniform"`` on [0, 1);
      then ``x = sample * scale + shift`` (``scale`` 1, ``shift`` 0 by default).
    - ``mix``: ``{"values": [...], <selector>}``: each row draws one of ``values``: a number
      multiplies its row (after the shift: ``[1, 3, 10]`` with ``shift: 10`` gives
      ``c * (N + 10)``, the merge tests' LSEs), ``"heavy"`` makes the row Student-t(3) values
      (clamped to +-30) scaled and shifted instead. With q and k mixed over
      ``[1, 3, 10, "heavy"]`` every call holds the checker's normal, peaked, large and heavy
      logits at once. Normal base only.
    - ``empty``: ``{"frac": f, "fill": v, <selector>}``: rows whose draw is below ``f`` are set
      to ``v`` (a number or ``"-inf"``): empty attention rows, out 0 and lse -inf.
    - ``favour``: ``{<selector>}``: one channel of the last axis per row is favoured:
      ``0.5 + 0.5 x`` there, ``0.5 x`` elsewhere (NSA gates; uniform base).
    - ``select``: ``{"sel_block", "sel_init", "sel_local"}``: instead of all of the above, NSA
      block indices of ``shape`` ``[B, T, Hkv, n]`` (``dtype`` int32), see ``random_selection``.

    A selector picks which values share a draw: ``shape`` (default: the tensor's shape without
    its last axis, one draw per row), ``dims`` (the tensor axes those map to, in order; default
    the leading ones), and ``key``: without one the draw is the tensor's own; with one it comes
    from ``shared``, so every tensor of the call naming that key sees the same draw (``out_a``
    with ``{"key": "a", "shape": [B, H, T], "dims": [0, 2, 1]}`` and ``lse_a`` with
    ``{"key": "a", "shape": [B, H, T]}`` empty the same rows). Use distinct keys for unrelated
    features: one draw read twice is one event.
    """
    import torch

    bad = set(spec) - GEN_KEYS
    if bad:
        raise ValueError(f"unknown gen spec keys {sorted(bad)}")
    if "select" in spec:
        if set(spec) != {"shape", "dtype", "select"} or spec["dtype"] != "int32":
            raise ValueError("a select gen spec has only shape, dtype int32 and select")
        return random_selection(list(spec["shape"]), spec["select"], seed, device)
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    shape = [int(s) for s in spec["shape"]]
    dist = spec.get("dist", "normal")
    scale, shift = float(spec.get("scale", 1.0)), float(spec.get("shift", 0.0))
    if dist == "uniform":
        n = torch.rand(shape, generator=g, device=device, dtype=torch.float32)
    elif dist == "normal":
        n = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
    else:
        raise ValueError(f"unknown gen dist {dist!r}")
    x = n * scale + shift
    if "mix" in spec:
        if dist != "normal":
            raise ValueError("mix needs the normal base")
        vals = list(spec["mix"]["values"])
        u = _selector(spec["mix"], shape, seed, "mix", device, shared)
        idx = (u * len(vals)).long().clamp_max(len(vals) - 1)
        mult = torch.tensor(
            [1.0 if v == HEAVY else float(v) for v in vals], device=device, dtype=torch.float32
        )
        x = x * mult[idx]
        if HEAVY in vals:
            t = (n * _heavy(shape, _stream_seed(seed, "heavy"), device)).clamp_(-30.0, 30.0)
            x = torch.where(idx == vals.index(HEAVY), t * scale + shift, x)
    if "empty" in spec:
        e = spec["empty"]
        u = _selector(e, shape, seed, "empty", device, shared)
        x = x.masked_fill(u < float(e["frac"]), float(e["fill"]))
    if "favour" in spec:
        u = _selector(spec["favour"], shape, seed, "favour", device, shared)
        c = shape[-1]
        pick = (u * c).long().clamp_max(c - 1)
        chan = torch.arange(c, device=device).view([1] * (len(shape) - 1) + [c])
        x = torch.where(chan == pick, 0.5 + 0.5 * x, 0.5 * x)
    return x.to(dtype_of(spec["dtype"]))


def gen_inputs(gens: dict[str, Any], seed: int, device: str) -> dict[str, Any]:
    """A timed call's inputs from the per-call seed (runner and checker alike): each tensor from
    its own stream, plus the call's shared draws (see ``gen_tensor``)."""
    shared = SharedDraws(seed, device)
    return {
        name: gen_tensor(spec, _stream_seed(seed, f"tensor:{name}"), device, shared)
        for name, spec in sorted(gens.items())
    }
