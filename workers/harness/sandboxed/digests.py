"""Fingerprints of tensors the runner commits and the checker recomputes.

``input_digest``: a keyed digest of an input, proving the submission left it unchanged (the key
is drawn by the parent only after the call). ``output_digest``: a digest of an output's capture,
committed right after the timed window, so outputs finished later no longer match the snapshot
the checker reads. Both are integer sums that wrap identically on every device, so the checker,
which regenerates the inputs and reads the snapshots, gets the very same values.
"""

from __future__ import annotations

from typing import Any

DIGEST_CHUNK = 1 << 24  # words per step: bounds the temporaries on huge inputs


def input_digest(t: Any, key: int) -> str:
    """Keyed fingerprint of a tensor's bytes, computed on the tensor's own device (no host copy).

    Σ_i w_i·h_i mod 2^64 over its 16-bit words w_i in row-major order (any strides: a
    non-contiguous tensor is copied first), with odd weights h_i mixed from the word index and a
    63-bit key the parent draws only after the call returned. Changing one word always changes
    the sum (an odd weight is a unit mod 2^64); changes that cancel need the key, which no
    submission code sees.
    """
    import torch

    x = t.detach().contiguous().reshape(-1)
    if x.numel() == 0:
        return "empty"
    w = x.view(torch.int16) if x.element_size() >= 2 else x.view(torch.uint8)
    k1, k2 = int(key) | 1, (int(key) >> 3) | 1
    total = torch.zeros((), dtype=torch.int64, device=w.device)
    for start in range(0, w.numel(), DIGEST_CHUNK):
        part = w[start : start + DIGEST_CHUNK].to(torch.int64)
        h = torch.arange(start, start + part.numel(), dtype=torch.int64, device=w.device)
        h = h * k1 + k2
        h = (h ^ (h >> 29)) * k2
        h = h | 1
        total += (part * h).sum()
    return f"{int(total) & ((1 << 64) - 1):016x}"


def digest_weights(n: int, key: int, device: str) -> Any:
    """Odd 15-bit weights per 16-bit word for ``output_digest``, mixed from the word index and a
    key (splitmix64's finaliser in wrapping int64 arithmetic, identical on every device). Odd, so
    a change to any one word changes the sum; below 2^15, so the int64 sum is exact."""
    import torch

    def s64(c: int) -> int:  # a 64-bit constant as the signed int64 torch multiplies by
        return c - (1 << 64) if c >= 1 << 63 else c

    h = torch.arange(n, dtype=torch.int64, device=device) * s64(0x9E3779B97F4A7C15)
    h = h + s64(int(key) & ((1 << 64) - 1))
    h = (h ^ (h >> 30)) * s64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> 27)) * s64(0x94D049BB133111EB)
    h = h ^ (h >> 31)
    return (((h >> 20) & 0x7FFF) | 1).to(torch.int32)


def output_digest(t: Any, weights: Any, tmp: Any = None) -> str:
    """Fingerprint of an output's bytes, taken right after the timed window: Σ w_i·word_i over its
    16-bit words in row-major order. The runner commits it before the parent stops its clock, so
    outputs written after the window (a lazy or background computation) no longer match what the
    checker reads. Forging it needs the right output, which is the work being timed. ``tmp``
    (int32, at least as many words): a buffer for the products, so the digest allocates nothing
    (the caching allocator's state after a submission's call would otherwise show in its time).
    The runner digests its own contiguous captures; any other strides are copied first."""
    import torch

    w = t.detach().contiguous().reshape(-1).view(torch.int16)
    n = w.numel()
    if n == 0:
        return "empty"
    if tmp is None:
        prod = w.to(torch.int32) * weights[:n]
    else:
        prod = torch.mul(w, weights[:n], out=tmp[:n])
    total = prod.sum(dtype=torch.int64)
    return f"{int(total) & ((1 << 64) - 1):016x}"
