"""Whether a Gluon kernel serves, or its Triton counterpart does: one switch per process.

Gluon came after Triton 3.2 (the oldest pyproject allows) and its API still moves between
releases. A Triton without it, or one a Gluon kernel does not compile against, turns that
kernel off for the rest of the process with one RuntimeWarning, and its Triton counterpart
serves every call after. ``KGRADE_GLUON=0`` turns every Gluon kernel off. No Gluon import
here, and none anywhere unless the inputs are on a Hopper GPU: the CPU paths (and a Triton
without Gluon on them) never see a warning about a kernel they could not have run.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

import torch
import triton
from triton.compiler.errors import CompilationError

R = TypeVar("R")

# kernel name -> why it is off in this process
OFF: dict[str, str] = {}


def on_hopper(x: torch.Tensor) -> bool:
    """Whether x lives on a Hopper GPU (sm_90), the only one the Gluon kernels are written for."""
    return x.is_cuda and torch.cuda.get_device_capability(x.device)[0] == 9


def gluon_or_none(
    name: str,
    module: str,
    call: Callable[[ModuleType], R | None],
    *,
    where: torch.Tensor,
    stacklevel: int = 3,
) -> R | None:
    """``call(the imported module)``'s result; None where ``where`` (an input) is not on a
    Hopper GPU, where ``call`` declines the inputs (it returns None), where Gluon is off, or
    once the module proves unusable with this Triton (then with the one warning, naming
    ``name``)."""
    if not on_hopper(where) or name in OFF or os.environ.get("KGRADE_GLUON", "1") == "0":
        return None
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        OFF[name] = f"Triton {triton.__version__} has no usable Gluon ({exc})"
    else:
        try:
            return call(mod)
        except CompilationError as exc:
            # The message ends with the failing line's error, after the source excerpt.
            last = (str(exc).strip().splitlines() or ["?"])[-1]
            OFF[name] = (
                f"the Gluon kernel does not compile with Triton {triton.__version__}: {last}"
            )
    warnings.warn(
        f"{OFF[name]}; {name} uses its Triton kernel", RuntimeWarning, stacklevel=stacklevel
    )
    return None
