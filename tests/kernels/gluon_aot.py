"""Compile Gluon kernels for Hopper without a GPU, and read ptxas's resource report.

Gluon has no interpreter, so a CPU machine cannot run these kernels. It can still compile them
for sm_90 (Triton ships ptxas), which catches what breaks first when Triton moves on: a renamed
or removed Gluon API, a layout the new compiler rejects, a kernel that now spills registers or
outgrows shared memory. Their arithmetic is checked on the H200 only.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.experimental.gluon._runtime import GluonASTSource

HOPPER = GPUTarget("cuda", 90, 32)
# cudaDevAttrMaxSharedMemoryPerBlockOptin on H100/H200: what one program may ask for.
HOPPER_SMEM_BYTES = 232_448


@dataclass(frozen=True)
class Resources:
    registers: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int
    # whether any spill store or load comes before the kernel's last wgmma in the SASS: the
    # main loops' (the epilogues run after it)
    spills_before_last_mma: bool


def tensordesc(dtype: str, block: list[int], layout: Any) -> str:
    """The signature string of a TensorDescriptor argument, e.g. ``tensordesc<bf16[64, 128],…>``."""
    return f"tensordesc<{dtype}{block},{layout!r}>"


def compile_hopper(
    fn: Any, signature: dict[str, str], constexprs: dict[str, Any], num_warps: int = 4
) -> Resources:
    """Compile ``fn`` for sm_90 and return ptxas's count of registers and spills."""
    compiled = triton.compile(
        GluonASTSource(fn, signature, constexprs),
        target=HOPPER,
        options={"num_warps": num_warps},
    )
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp, "kernel.ptx")
        ptx.write_text(compiled.asm["ptx"])
        report = subprocess.run(
            [get_ptxas(90).path, "--gpu-name", "sm_90a", "-v", str(ptx), "-o", str(ptx) + ".o"],
            capture_output=True,
            text=True,
            check=True,
        ).stderr

    def count(pattern: str) -> int:
        found = re.findall(pattern, report)
        if not found:
            raise AssertionError(f"ptxas -v printed no {pattern!r}:\n{report}")
        return max(int(n) for n in found)

    return Resources(
        registers=count(r"Used (\d+) registers"),
        spill_stores=count(r"(\d+) bytes spill stores"),
        spill_loads=count(r"(\d+) bytes spill loads"),
        shared_bytes=int(compiled.metadata.shared),
        spills_before_last_mma=_spills_before_last_mma(compiled.asm["cubin"]),
    )


def _spills_before_last_mma(cubin: bytes) -> bool:
    """Whether a spill comes before its partition's last wgmma, i.e. in a main loop.

    The SASS holds the partitions one after another, each entered through a USETMAXREG (its
    register reallocation); within each, the epilogue follows the last HGMMA.
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "kernel.cubin")
        path.write_bytes(cubin)
        sass = subprocess.run(
            [triton.knobs.nvidia.cuobjdump.path, "-sass", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    return spills_in_a_main_loop(sass)


def spills_in_a_main_loop(sass: list[str]) -> bool:
    """The check on SASS lines (``cuobjdump -sass``)."""
    if not any("HGMMA" in line for line in sass):
        raise AssertionError("no wgmma (HGMMA) in the SASS: is this a Hopper kernel?")
    starts = [i for i, line in enumerate(sass) if "USETMAXREG" in line]
    bounds = [0, *starts, len(sass)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        part = sass[lo:hi]
        mma = [i for i, line in enumerate(part) if "HGMMA" in line]
        if mma and any(re.search(r"\b(STL|LDL)\b", line) for line in part[: mma[-1]]):
            return True
    return False
