# The course reference, timed as the speed baseline (trusted: runs with kernels visible): our
# trainable nsa_attention (Triton backward on CUDA, autograd of the PyTorch path on CPU), its
# forward recomputed on the given indices, then autograd.
import torch

from kernels.nsa import NSAConfig
from kernels.nsa import nsa_attention as _nsa


def nsa_backward(q, k, v, gates, dout, config, block_indices):
    cfg = NSAConfig(**{f: getattr(config, f) for f in NSAConfig.__dataclass_fields__})
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v, gates)]
    with torch.enable_grad():
        out = _nsa(*leaves, cfg, block_indices=block_indices)
        return torch.autograd.grad(out, leaves, dout)
