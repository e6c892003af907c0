import torch


def block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    q_offset: int = 0,
    k_offset: int = 0,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise attention with global causal offsets. See README.md."""
    raise NotImplementedError
