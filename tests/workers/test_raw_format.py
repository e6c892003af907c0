"""The raw tensor format between runner and checker: written from a view, read in place."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.harness.sandboxed.wire import dtype_of, raw_view, read_raw


@pytest.mark.parametrize("name", ["bfloat16", "float16", "float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("shape", [[3, 5], [0, 4], [], [2, 1, 7]])
def test_round_trip(tmp_path: Path, name: str, shape: list[int]) -> None:
    t = (torch.randn(shape) * 100).to(dtype_of(name))
    p = tmp_path / "t.bin"
    p.write_bytes(raw_view(t))
    u = read_raw(p, name, shape)
    assert u.dtype == t.dtype and torch.equal(u, t)


@pytest.mark.parametrize("nbytes", [7, 9, 0])
def test_size_mismatch_is_refused(tmp_path: Path, nbytes: int) -> None:
    p = tmp_path / "t.bin"
    p.write_bytes(b"\x01" * nbytes)
    with pytest.raises(ValueError, match="expected 8$"):
        read_raw(p, "float32", [2])


def test_pinned_buffers_are_kept_per_shape_and_refused_without_pinned_memory() -> None:
    import torch

    from workers.harness.sandboxed import wire

    made: list[tuple[int, ...]] = []

    def empty(shape, dtype, pin_memory):  # type: ignore[no-untyped-def]
        assert pin_memory
        made.append(shape)
        return torch.empty(shape, dtype=dtype)

    cache: dict = {}
    a = wire.pinned_buffer(cache, (4, 2), torch.bfloat16, empty)
    assert wire.pinned_buffer(cache, (4, 2), torch.bfloat16, empty) is a  # kept, not remade
    for n in range(wire.PINNED_KEPT):
        wire.pinned_buffer(cache, (n + 1,), torch.float32, empty)
    assert len(cache) <= wire.PINNED_KEPT and ((4, 2), torch.bfloat16) not in cache
    # CPU-only torch has no pinned allocator: None, and the caller copies pageable
    assert (
        wire.pinned_buffer({}, (3,), torch.float32, torch.empty) is None
        or torch.cuda.is_available()
    )
