"""Ring Attention (spec §3): layouts, single-process simulation and the real per-rank ring.

* ``ring_attention``: all ranks simulated in one process on global tensors.
* ``ring_attention_local``: one rank of a real ring over ``torch.distributed`` (gloo or NCCL).
* ``shard`` / ``unshard`` / ``positions``: the contiguous, zigzag and stripe token layouts.
"""

from .distributed import ring_attention_local
from .layouts import LAYOUTS, positions, shard, unshard
from .simulate import ring_attention

__all__ = ["LAYOUTS", "positions", "ring_attention", "ring_attention_local", "shard", "unshard"]
