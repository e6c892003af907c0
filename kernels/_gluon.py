"""What the Gluon kernels share across Triton releases (Gluon's API still moves between them).

Importing this module raises ImportError on a Triton without Gluon; callers turn that into
their Triton kernel's fallback.
"""

from __future__ import annotations

from triton.experimental.gluon.language.nvidia.hopper import tma

from kernels._gluon_switch import on_hopper

# Triton 3.6 names the TMA load async_copy_global_to_shared; later releases renamed it
# async_load and made the old name raise. Same arguments in both.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

__all__ = ["on_hopper", "tma_load"]
