"""Reference attention kernels that kgrade grades student submissions against.

Subpackages (import what you need; nothing heavy happens here):

* ``kernels.attention``: ``block_attention`` (blockwise attention with global causal offsets)
  and ``merge_attention`` (log-sum-exp merge), with plain PyTorch references in ``naive``.
* ``kernels.ring``: Ring Attention, single-process simulation (``ring_attention``) and the real
  per-rank ring over ``torch.distributed`` (``ring_attention_local``), plus ``shard``/``unshard``.
* ``kernels.nsa``: Native Sparse Attention.
"""
