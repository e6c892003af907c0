"""Blockwise attention with global causal offsets and the log-sum-exp merge (spec §2).

``block_attention`` runs our Triton kernel on CUDA (our Gluon kernel on Hopper where it applies;
the Triton one on CPU under ``TRITON_INTERPRET=1``), else a PyTorch CPU fallback; ``merge_attention`` combines results over disjoint key sets.
References in ``kernels.attention.naive``.
"""

from .block_attention import block_attention
from .merge import merge_attention

__all__ = ["block_attention", "merge_attention"]
