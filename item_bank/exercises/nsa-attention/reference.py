# The course reference, timed as the speed baseline (trusted: runs with kernels visible).
from kernels.nsa import NSAConfig
from kernels.nsa import nsa_attention as _nsa


def nsa_attention(q, k, v, gates, config, *, block_indices=None, return_aux=False):
    cfg = NSAConfig(**{f: getattr(config, f) for f in NSAConfig.__dataclass_fields__})
    return _nsa(q, k, v, gates, cfg, block_indices=block_indices, return_aux=return_aux)
