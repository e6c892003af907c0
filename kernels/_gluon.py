"""What the Gluon kernels share across Triton releases (Gluon's API still moves between them).

Importing this module raises ImportError on a Triton without Gluon; callers turn that into
their Triton kernel's fallback.
"""

from __future__ import annotations

import torch
from triton.experimental.gluon.language.nvidia.hopper import tma

# Triton 3.6 names the TMA load async_copy_global_to_shared; later releases renamed it
# async_load and made the old name raise. Same arguments in both.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


def on_hopper(x: torch.Tensor) -> bool:
    """Whether x lives on a Hopper GPU (sm_90), the only one the Gluon kernels are written for."""
    return x.is_cuda and torch.cuda.get_device_capability(x.device)[0] == 9
