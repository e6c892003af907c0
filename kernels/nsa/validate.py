"""Argument checks for ``nsa_attention`` and ``nsa_attention_naive`` (shared by both)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from kernels._validate import check_bthd, check_scale, check_tensor
from kernels.nsa.config import NSAConfig, num_cmp_blocks, num_sel_blocks

SUPPORTED_GROUPS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class NSADims:
    batch: int
    seq_len: int
    hq: int
    hkv: int
    group: int
    dk: int
    dv: int
    tc: int
    ts: int
    scale: float
    # max |x| over q, k, v (and a given k̃, ṽ) when the caller asked for it (peak_abs=True):
    # attention._compressed_dtype picks k̃'s storage from it; NaN if any input is NaN
    peak_abs: float | None = None
    # the value checks launched but not yet read (check_nsa_args(defer=True)); ``settled``
    # reads them
    checks: ValueChecks | None = field(default=None, compare=False, repr=False)

    def settled(self) -> NSADims:
        """These dims with the deferred value checks read: raises ValueError on bad gates,
        fills ``peak_abs``. Waits for the check kernels only (``ValueChecks.read``)."""
        if self.checks is None:
            return self
        return replace(self, peak_abs=self.checks.read(), checks=None)


def check_nsa_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    config: NSAConfig,
    k_cmp: torch.Tensor | None,
    v_cmp: torch.Tensor | None,
    block_indices: torch.Tensor | None,
    *,
    peak_abs: bool = False,
    defer: bool = False,
    late_q: bool = False,
) -> NSADims:
    """Every check of the arguments; the value checks (gates in [0, 1], and max |x| when
    ``peak_abs``) share one host read, the call's only one without ``block_indices``.
    ``defer``: only launch the value checks; the caller launches its kernels, then reads
    them with ``NSADims.settled()`` (which raises on bad gates). ``late_q`` (with ``defer``):
    q's max |x| is left to a kernel the caller launches (``ValueChecks.late_peak``)."""
    if not isinstance(config, NSAConfig):
        raise ValueError(f"config must be an NSAConfig, got {type(config).__name__}")
    b, t, _, hq, hkv, dk, dv = check_bthd(q, k, v, same_len=True, same_head_dim=False)
    if t == 0:
        raise ValueError("sequence length T (dim 1 of q) must be >= 1")
    group = hq // hkv
    if group not in SUPPORTED_GROUPS:
        raise ValueError(
            f"G = Hq/Hkv = {hq}/{hkv} = {group} is not supported; use G in {SUPPORTED_GROUPS}"
        )
    scale = check_scale(config.scale, dk)

    check_tensor("gates", gates, 4)
    if tuple(gates.shape) != (b, t, hq, 3):
        raise ValueError(
            f"gates must have shape [B, T, Hq, 3] = {(b, t, hq, 3)}, got {tuple(gates.shape)}"
        )
    if not gates.is_floating_point():
        raise ValueError(f"gates must be a floating tensor, got {gates.dtype}")
    if gates.device != q.device:
        raise ValueError(f"gates must be on q's device {q.device}, got {gates.device}")

    tc = num_cmp_blocks(t, config)
    ts = num_sel_blocks(t, config)
    if config.compress == "mean":
        if k_cmp is not None or v_cmp is not None:
            raise ValueError(
                'k_cmp/v_cmp are only accepted with NSAConfig(compress="given"); '
                'compress="mean" pools k and v itself'
            )
    else:
        if k_cmp is None or v_cmp is None:
            raise ValueError('NSAConfig(compress="given") requires both k_cmp and v_cmp')
        check_tensor("k_cmp", k_cmp, 4)
        check_tensor("v_cmp", v_cmp, 4)
        for name, x, dim in (("k_cmp", k_cmp, dk), ("v_cmp", v_cmp, dv)):
            if tuple(x.shape) != (b, tc, hkv, dim):
                raise ValueError(
                    f"{name} must have shape [B, Tc, Hkv, D] = {(b, tc, hkv, dim)} "
                    f"(Tc = floor((T-l)/d)+1 = {tc}), got {tuple(x.shape)}"
                )
            if x.dtype != k.dtype:
                raise ValueError(f"{name} must have k's dtype {k.dtype}, got {x.dtype}")
            if x.device != k.device:
                raise ValueError(f"{name} must be on k's device {k.device}, got {x.device}")

    if block_indices is not None:
        check_block_indices(block_indices, b, t, hkv, ts, config, q.device)
    late = q if peak_abs and defer and late_q else None
    peak_of = None
    if peak_abs:  # q among them unless a kernel delivers its peak
        peak_of = (k, v, k_cmp, v_cmp) if late is not None else (q, k, v, k_cmp, v_cmp)
    checks = ValueChecks(gates, peak_of, late)
    dims = NSADims(b, t, hq, hkv, group, dk, dv, tc, ts, scale, checks=checks)
    return dims if defer else dims.settled()


class ValueChecks:
    """Whether every gate lies in [0, 1], and max |x| over ``peak_of`` and ``late`` (None when
    neither is given): launched on the device at construction, read on the host by ``read``.

    On CUDA the results go to pinned host memory behind an event, so ``read`` waits for the
    check kernels only, not for what was launched after them. Read at a call's start, the
    wait drains the device's queue and the device idles while the host launches what
    follows; read after the call's launches, the device has its work queued and the check
    kernels have long finished (0.35 ms less of a 44 ms forward at T = 64k, run 61).

    ``late``: a tensor whose max |x| a kernel of the caller's computes on the way (into
    ``late_peak()``'s buffer, then ``late_done()``), so it is not read a second time here: q
    is 1 GiB at T = 64k (paper config), 0.46 of the checks' 0.57 ms (run 99), and the
    compressed kernel loads every row of it anyway. If no kernel did, ``read`` computes it."""

    def __init__(
        self,
        gates: torch.Tensor,
        peak_of: tuple[torch.Tensor | None, ...] | None,
        late: torch.Tensor | None = None,
    ) -> None:
        stats: list[torch.Tensor] = []
        self._gates = gates.numel() > 0
        with torch.no_grad():  # reads only: no autograd graph over the inputs
            if self._gates:  # NaN propagates into both
                stats.extend(t.float() for t in torch.aminmax(gates))
            live = [x for x in peak_of or () if x is not None and x.numel() > 0]
            # one fused launch for all of them, no |x| temporary
            if live:
                stats.append(torch.stack(torch._foreach_norm(live, float("inf"))).max().float())
            self._host, self._event = _to_host(torch.stack(stats) if stats else None)
        self._late = late if late is not None and late.numel() > 0 else None
        self._peak: bool | None = None if peak_of is None and late is None else bool(live)
        self._late_buf: torch.Tensor | None = None
        self._late_host: tuple[torch.Tensor | None, torch.cuda.Event | None] | None = None

    def late_peak(self) -> torch.Tensor | None:
        """A zeroed [1] fp32 buffer on ``late``'s device for a kernel to raise to max |late|
        (an atomic max of non-negative floats), or None when there is no ``late``."""
        if self._late is not None and self._late_buf is None:
            self._late_buf = torch.zeros(1, dtype=torch.float32, device=self._late.device)
        return self._late_buf

    def late_done(self) -> None:
        """The kernel that fills ``late_peak()`` is launched (on the current stream)."""
        assert self._late_buf is not None, "late_done() without late_peak()"
        self._late_host = _to_host(self._late_buf)

    def read(self) -> float | None:
        """Raises unless every gate lies in [0, 1]; returns max |x| (0.0 over no values)."""
        if self._event is not None:
            self._event.synchronize()
        vals = self._host.tolist() if self._host is not None else []
        # NaN fails both comparisons, so it is caught here too
        if self._gates and not (vals[0] >= 0 and vals[1] <= 1):
            raise ValueError("gates must lie in [0, 1] (apply sigmoid first) and contain no NaN")
        if self._peak is None:
            return None
        peak = vals[-1] if self._peak else 0.0
        if self._late is not None:
            if self._late_host is None:  # no kernel computed it: read it here
                with torch.no_grad():
                    late = float(torch._foreach_norm([self._late], float("inf"))[0])
            else:
                host, event = self._late_host
                if event is not None:
                    event.synchronize()
                assert host is not None
                late = float(host[0])
            peak = late if late != late or late > peak else peak  # NaN wins, as in max()
        return peak


def _to_host(x: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.cuda.Event | None]:
    """x's values on the host: on CUDA a pinned copy queued behind the current stream and the
    event that marks it done, so reading waits for x's kernels only; elsewhere x itself."""
    if x is None or not x.is_cuda:
        return x, None
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def check_block_indices(
    idx: torch.Tensor,
    b: int,
    t: int,
    hkv: int,
    ts: int,
    config: NSAConfig,
    device: torch.device,
) -> None:
    check_tensor("block_indices", idx, 4)
    n = config.sel_count
    if tuple(idx.shape) != (b, t, hkv, n):
        raise ValueError(
            f"block_indices must have shape [B, T, Hkv, n] = {(b, t, hkv, n)}, "
            f"got {tuple(idx.shape)}"
        )
    if idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"block_indices must be int32 or int64, got {idx.dtype}")
    if idx.device != device:
        raise ValueError(f"block_indices must be on q's device {device}, got {idx.device}")
    if n == 0 or idx.numel() == 0:
        return
    pos = torch.arange(t, device=device).view(1, t, 1, 1)
    current = pos // config.sel_block  # last eligible block per query position
    empty = idx == -1
    bad = ~empty & ((idx < 0) | (idx > current))
    if bool(bad.any()):
        where = tuple(int(x) for x in bad.nonzero()[0])
        raise ValueError(
            "block_indices entries must be -1 (empty) or an eligible block j <= floor(t/l') "
            f"(first offender at [b, t, g, slot] = {where}, value {int(idx[where])})"
        )
    # Duplicates would attend to one block twice in the fast path but once in the mask.
    srt = torch.where(empty, torch.full_like(idx, -2), idx).sort(dim=-1).values
    dup = (srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)
    if bool(dup.any()):
        raise ValueError("block_indices must not repeat a block within one (b, t, g) row")
