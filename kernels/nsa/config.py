"""NSA configuration, the aux record, and the small index formulas every path shares.

The formulas live here once (not re-derived in each kernel) so the naive reference, the
PyTorch path and the Triton path cannot drift apart on Tc, Ts or the ω overlap weights.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

COMPRESS_MODES = ("mean", "given")


@dataclass(frozen=True)
class NSAConfig:
    """Paper configuration (arXiv 2502.11089) by default.

    cmp_block (l), cmp_stride (d): compression blocks ``[i·d, i·d+l)``.
    sel_block (l′), sel_count (n, forced blocks included), sel_init, sel_local: selection.
    window (w): sliding-window keys including the query position.
    """

    cmp_block: int = 32
    cmp_stride: int = 16
    sel_block: int = 64
    sel_count: int = 16
    sel_init: int = 1
    sel_local: int = 2
    window: int = 512
    scale: float | None = None
    compress: str = "mean"

    def __post_init__(self) -> None:
        for name in ("cmp_block", "cmp_stride", "sel_block", "sel_count", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"NSAConfig.{name} must be an int >= 1, got {value!r}")
        for name in ("sel_init", "sel_local"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"NSAConfig.{name} must be an int >= 0, got {value!r}")
        l, d, lp = self.cmp_block, self.cmp_stride, self.sel_block
        if l % d != 0:
            raise ValueError(
                f"NSAConfig.cmp_block ({l}) must be a multiple of cmp_stride ({d}) "
                "so compression blocks align with the stride"
            )
        if lp % d != 0:
            raise ValueError(
                f"NSAConfig.sel_block ({lp}) must be a multiple of cmp_stride ({d}) "
                "so selection blocks align with compression blocks"
            )
        if l > lp:
            raise ValueError(
                f"NSAConfig.cmp_block ({l}) must be <= sel_block ({lp}); "
                "a compression block may straddle at most two selection blocks"
            )
        if self.sel_init + self.sel_local > self.sel_count:
            raise ValueError(
                f"NSAConfig.sel_init + sel_local ({self.sel_init} + {self.sel_local}) must be "
                f"<= sel_count ({self.sel_count}): forced blocks count towards n"
            )
        if self.scale is not None and (
            isinstance(self.scale, bool)
            or not isinstance(self.scale, (int, float))
            or not self.scale > 0
        ):
            raise ValueError(
                f"NSAConfig.scale must be a positive float or None, got {self.scale!r}"
            )
        if self.compress not in COMPRESS_MODES:
            raise ValueError(
                f"NSAConfig.compress must be one of {COMPRESS_MODES}, got {self.compress!r}"
            )


@dataclass(frozen=True)
class NSAAux:
    """Side outputs of ``nsa_attention(..., return_aux=True)``.

    block_indices: [B, T, Hkv, n] int32, ascending, −1 padded (the selection actually used).
    lse_*: [B, T, Hq] fp32 natural-log normalisers per branch (−inf where nothing is visible).
    o_*: [B, T, Hq, Dv] fp32 ungated branch outputs (extra, for per-branch grading).
    """

    block_indices: torch.Tensor
    lse_cmp: torch.Tensor
    lse_slc: torch.Tensor
    lse_win: torch.Tensor
    o_cmp: torch.Tensor | None = None
    o_slc: torch.Tensor | None = None
    o_win: torch.Tensor | None = None

    def fp32_outputs(self) -> NSAAux:
        """This aux with o_* as fp32 (the Triton path may store them as fp16:
        ``attention.branch_dtype``); tensors already fp32 are kept, not copied."""

        def up(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.float()

        return replace(self, o_cmp=up(self.o_cmp), o_slc=up(self.o_slc), o_win=up(self.o_win))


def num_cmp_blocks(seq_len: int, cfg: NSAConfig) -> int:
    """Tc = ⌊(T−l)/d⌋ + 1 if T ≥ l else 0."""
    if seq_len < cfg.cmp_block:
        return 0
    return (seq_len - cfg.cmp_block) // cfg.cmp_stride + 1


def num_sel_blocks(seq_len: int, cfg: NSAConfig) -> int:
    """Ts = ⌈T/l′⌉."""
    return -(-seq_len // cfg.sel_block)


def omega_matrix(tc: int, ts: int, cfg: NSAConfig) -> torch.Tensor:
    """ω(i, j) = |[i·d, i·d+l) ∩ [j·l′, (j+1)·l′)| / d as a dense [Tc, Ts] fp32 matrix."""
    l, d, lp = cfg.cmp_block, cfg.cmp_stride, cfg.sel_block
    i = torch.arange(tc, dtype=torch.int64)[:, None]
    j = torch.arange(ts, dtype=torch.int64)[None, :]
    lo = torch.maximum(i * d, j * lp)
    hi = torch.minimum(i * d + l, (j + 1) * lp)
    return (hi - lo).clamp_min(0).to(torch.float32) / d


def omega_band(cfg: NSAConfig) -> tuple[list[float], list[float]]:
    """The banded form of ω used by the fast paths (L = l′/d compressed blocks per sel block).

    For r in [0, L): wa[r] = ω(j·L + r, j) (own block), wb[r] = ω(j·L + r, j + 1) (spill into
    the next block; nonzero only when a compression block crosses the boundary). Because
    l ≤ l′, nothing spills further, so s[j] = Σ_r wa[r]·P[jL+r] + Σ_r wb[r]·P[(j−1)L+r].
    """
    l, d, lp = cfg.cmp_block, cfg.cmp_stride, cfg.sel_block
    ratio = lp // d
    wa = [(min(r * d + l, lp) - r * d) / d for r in range(ratio)]
    wb = [max(r * d + l - lp, 0) / d for r in range(ratio)]
    return wa, wb
