import torch


def nsa_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    dout: torch.Tensor,
    config,
    block_indices: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv, dgates) of the NSA forward, selection fixed. See README.md."""
    raise NotImplementedError
