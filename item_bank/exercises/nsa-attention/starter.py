import torch


def nsa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    config,
    *,
    block_indices: torch.Tensor | None = None,
    return_aux: bool = False,
):
    """Native Sparse Attention forward. See README.md."""
    raise NotImplementedError
