# The course reference, timed as the speed baseline (trusted: runs with kernels visible).
from kernels.attention import block_attention  # noqa: F401
