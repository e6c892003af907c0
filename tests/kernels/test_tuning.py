"""kernels._tuning.fastest: the timed pick both TMA launchers use (CPU, with a fake timer)."""

from __future__ import annotations

import pytest
import triton

from kernels._tuning import fastest


@pytest.fixture
def fake_timer(monkeypatch):
    """do_bench that runs the call once and returns the time the launched config claims."""
    clock: dict[str, float] = {}

    def do_bench(fn, warmup=25, rep=100):
        fn()
        return clock.pop("ms")

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    return clock


def test_picks_the_fastest_skips_failures_and_caches(fake_timer):
    times = {"a": 2.0, "b": 0.5, "c": 1.0}
    launched: list[str] = []

    def launch(c: str) -> None:
        launched.append(c)
        if c == "b":
            raise RuntimeError("out of shared memory")  # fastest on paper, cannot launch
        fake_timer["ms"] = times[c]

    cache: dict = {}
    assert fastest(cache, "shape", ["a", "b", "c"], launch) == "c"
    assert cache == {"shape": "c"}
    launched.clear()
    assert fastest(cache, "shape", ["a", "b", "c"], launch) == "c"
    assert launched == [], "a cached key is not timed again"


def test_ties_go_to_the_earlier_candidate(fake_timer):
    def launch(c: str) -> None:
        fake_timer["ms"] = 1.0

    assert fastest({}, 0, ["first", "second"], launch) == "first"


def test_nothing_launches_raises_the_first_error_with_the_key(fake_timer):
    def launch(c: str) -> None:
        raise KeyError(f"no {c}")  # a type of its own: the caller sees what went wrong

    with pytest.raises(KeyError, match="no x") as info:
        fastest({}, "B2 T8192", ["x", "y"], launch)
    assert any("'B2 T8192'" in n for n in info.value.__notes__)
    with pytest.raises(ValueError, match="no candidate configurations given"):
        fastest({}, "k", [], launch)
