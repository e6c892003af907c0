"""Native Sparse Attention (arXiv 2502.11089) reference kernels: spec §4.

``nsa_attention`` is the fast path (Triton on CUDA or under TRITON_INTERPRET=1, chunked
PyTorch on CPU), trainable: Triton backward kernels in ``backward.py`` and ``*_bwd.py``,
autograd on the PyTorch path; ``kernels.nsa.naive.nsa_attention_naive`` is the dense ground
truth.
"""

from kernels.nsa.attention import nsa_attention
from kernels.nsa.config import NSAAux, NSAConfig, num_cmp_blocks, num_sel_blocks
from kernels.nsa.naive import nsa_attention_naive

__all__ = [
    "NSAAux",
    "NSAConfig",
    "nsa_attention",
    "nsa_attention_naive",
    "num_cmp_blocks",
    "num_sel_blocks",
]
