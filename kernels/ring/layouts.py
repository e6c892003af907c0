"""Token layouts for Ring Attention (spec §3.1): which global positions each rank holds.

``positions(r)`` lists rank r's global token indices in local order:

* contiguous: ``[r·T/P, (r+1)·T/P)``
* zigzag: chunks r and 2P−1−r of 2P equal chunks (causal load balance; the split of
  zhuzilin/ring-flash-attention, PyTorch context parallel and Megatron-LM)
* stripe: ``r, r+P, r+2P, …``
"""

from __future__ import annotations

import torch

from .._validate import check_int, check_layout, check_ring_length

LAYOUTS = ("contiguous", "zigzag", "stripe")


def _check_rank(rank: int, world_size: int) -> None:
    check_int("world_size", world_size, minimum=1)
    check_int("rank", rank, minimum=0)
    if rank >= world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")


def positions(total_len: int, rank: int, world_size: int, layout: str) -> torch.Tensor:
    """Global token indices held by ``rank`` (int64, local order)."""
    check_int("total_len", total_len, minimum=0)
    _check_rank(rank, world_size)
    check_layout(layout)
    check_ring_length("sequence", total_len, world_size, layout)
    if layout == "contiguous":
        n = total_len // world_size
        return torch.arange(rank * n, (rank + 1) * n)
    if layout == "zigzag":
        c = total_len // (2 * world_size)
        j = 2 * world_size - 1 - rank
        return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange(j * c, (j + 1) * c)])
    return torch.arange(rank, total_len, world_size)  # stripe


def _check_dim(x: torch.Tensor, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_int("dim", dim)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim {dim} is out of range for a tensor of shape {tuple(x.shape)}")
    return dim % x.dim()


def shard(x: torch.Tensor, rank: int, world_size: int, layout: str, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s part of the global tensor ``x`` along ``dim`` (a new contiguous tensor).

    Use ``dim=1`` for BTHD activations and ``dim=2`` for lse ``[B, H, T]``.
    """
    dim = _check_dim(x, dim)
    _check_rank(rank, world_size)
    check_layout(layout)
    t = x.shape[dim]
    check_ring_length(f"x (dim {dim})", t, world_size, layout)
    if layout == "contiguous":
        n = t // world_size
        return x.narrow(dim, rank * n, n).contiguous()
    if layout == "zigzag":
        c = t // (2 * world_size)
        j = 2 * world_size - 1 - rank
        return torch.cat([x.narrow(dim, rank * c, c), x.narrow(dim, j * c, c)], dim=dim)
    # stripe: tokens rank, rank+P, ...: a strided view, then one copy.
    idx = [slice(None)] * x.dim()
    idx[dim] = slice(rank, None, world_size)
    return x[tuple(idx)].contiguous()


def unshard(
    parts: list[torch.Tensor] | tuple[torch.Tensor, ...], world_size: int, layout: str, dim: int = 1
) -> torch.Tensor:
    """Inverse of ``shard``: the P rank parts (rank order) back in global token order."""
    check_int("world_size", world_size, minimum=1)
    check_layout(layout)
    if not isinstance(parts, (list, tuple)) or len(parts) != world_size:
        n = len(parts) if isinstance(parts, (list, tuple)) else type(parts).__name__
        raise ValueError(f"parts must be a list of world_size={world_size} tensors, got {n}")
    dim = _check_dim(parts[0], dim)
    shape0 = parts[0].shape
    for r, p in enumerate(parts):
        if not isinstance(p, torch.Tensor) or p.shape != shape0:
            got = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(f"parts[{r}] must be a tensor of shape {tuple(shape0)}, got {got}")
    if layout == "contiguous":
        return torch.cat(list(parts), dim=dim)
    n = shape0[dim]
    if layout == "zigzag":
        if n % 2:
            raise ValueError(f"zigzag parts need an even length along dim {dim}, got {n}")
        c = n // 2
        firsts = [p.narrow(dim, 0, c) for p in parts]  # chunks 0 .. P-1
        seconds = [p.narrow(dim, c, c) for p in parts]  # chunks 2P-1 .. P
        return torch.cat(firsts + seconds[::-1], dim=dim)
    # stripe: interleave; stacking after dim puts token i·P + r at [i, r].
    stacked = torch.stack(list(parts), dim=dim + 1)  # [..., n, P, ...]
    return stacked.flatten(dim, dim + 1)
