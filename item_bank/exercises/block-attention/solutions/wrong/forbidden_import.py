# expect: POLICY_VIOLATION
import torch

try:
    import flash_attn  # noqa: F401  (vendor kernel: not allowed)
except ImportError:
    flash_attn = None
from kernels.attention import block_attention  # noqa: F401
