"""Timing statistics of the trusted parent (grader spec §5), on made-up samples."""

from __future__ import annotations

import pytest

from workers.exercises import load_exercise
from workers.harness import timing
from workers.harness.scoring import confirm, retime
from workers.results import GradeResult, TestResult
from workers.verdicts import Verdict


def test_one_late_end_event_is_not_a_side_stream() -> None:
    # 40 honest calls of 0.73 ms, one whose end event landed 3 ms late (host descheduled)
    streams = [0.73] * 41
    syncs = [0.74] * 40 + [4.11]
    assert not timing.side_stream_escape(streams, syncs)


def test_work_kept_off_the_timed_stream_is_caught() -> None:
    # the timed stream only launches; the real work runs on a side stream every call
    streams = [0.02] * 30
    syncs = [1.5] * 30
    assert timing.side_stream_escape(streams, syncs)


def test_tiny_kernels_are_not_judged() -> None:
    assert not timing.side_stream_escape([0.001] * 20, [0.04] * 20)


def test_wall_budget_ends_a_shape() -> None:
    noisy = [1.0, 2.0] * (timing.MIN_ITERS // 2 + 1)
    assert not timing.should_stop(noisy, spent_s=0.01, wall_s=1.0)
    assert timing.should_stop(noisy, spent_s=0.01, wall_s=timing.SHAPE_WALL_BUDGET_S)
    assert not timing.should_stop(noisy[:3], spent_s=0.01, wall_s=1e9)  # MIN_ITERS first


def test_past_floor_needs_every_call_beyond_the_clamp() -> None:
    base = [1.0] * timing.MIN_ITERS
    slow = [6.0] * timing.MIN_ITERS  # 6x > 4 x 1.25
    assert timing.past_floor(slow, base, clamp=4.0)
    # not before each side has its minimum of counted calls
    assert not timing.past_floor(slow[:-1], base, clamp=4.0)
    assert not timing.past_floor(slow, base[:-1], clamp=4.0)
    # one fast call of the submission, or one slow call of ours, keeps the loop going
    assert not timing.past_floor([*slow[:-1], 4.9], base, clamp=4.0)
    assert not timing.past_floor(slow, [*base[:-1], 1.3], clamp=4.0)
    # a submission merely slower than ours (a score the clamp keeps) is measured in full
    assert not timing.past_floor([3.0] * timing.MIN_ITERS, base, clamp=4.0)


def test_far_beyond_the_floor_stops_after_a_few_calls() -> None:
    k = timing.FLOOR_FAST_ITERS
    base = [1.0] * k
    # 21x our slowest > 4 (clamp) x 1.25 x 4: past the floor after k calls a side
    assert timing.past_floor([21.0] * k, base, clamp=4.0)
    assert not timing.past_floor([21.0] * (k - 1), base, clamp=4.0)
    assert not timing.past_floor([21.0] * k, base[:-1], clamp=4.0)
    # 6x is past the floor only with MIN_ITERS calls a side; one fast call keeps it going
    assert not timing.past_floor([6.0] * k, base, clamp=4.0)
    assert not timing.past_floor([21.0] * (k - 1) + [19.0], base, clamp=4.0)
    assert not timing.past_floor([21.0] * k, [*base[:-1], 1.1], clamp=4.0)


def test_the_parent_clock_bounds_the_reported_time() -> None:
    # honest: 0.6 ms reported, 0.35 ms of harness overhead per call, some jitter
    walls = [0.95 + 0.01 * (i % 5) for i in range(20)]
    events = [0.6] * 20
    assert timing.unexplained_wall_ms(events, walls, 0.35, "cuda") is None
    # a clock slowed 4x reports 0.15 ms of the same calls: 0.45 ms unaccounted for
    gap = timing.unexplained_wall_ms([0.15] * 20, walls, 0.35, "cuda")
    assert gap is not None and gap == pytest.approx(0.47, abs=0.01)
    # medians: a few descheduled calls are noise, a clock that lies on most calls is not
    assert timing.unexplained_wall_ms(events, [*walls[:15], *[9.0] * 5], 0.35, "cuda") is None
    assert timing.unexplained_wall_ms([0.15] * 11 + [0.6] * 9, walls, 0.35, "cuda") is not None
    # too few calls to judge; the CPU rehearsal's looser tolerance (two busy cores)
    assert timing.unexplained_wall_ms([0.15] * 4, walls[:4], 0.35, "cuda") is None
    assert timing.unexplained_wall_ms([5.0] * 20, [6.5] * 20, 0.35, "cpu") is None
    assert timing.unexplained_wall_ms([1.5] * 20, [6.5] * 20, 0.35, "cpu") is not None
    # CI's honest outlier (3.6 ms reported, 8.4 ms of wall, 0.9 ms of overhead) passes; the
    # 4x clock of the same call (0.9 ms reported) does not
    assert timing.unexplained_wall_ms([3.58] * 15, [8.38] * 15, 0.91, "cpu") is None
    assert timing.unexplained_wall_ms([0.9] * 15, [8.38] * 15, 0.91, "cpu") is not None


def test_slow_reply_is_work_on_most_calls_not_a_few_stalls() -> None:
    # a first batch of ten calls on a busy host: half of them stalled (a collector pass, a
    # thread pool's straggler) lift the median, not the lower quartile
    stalled = [4.8, 5.1, 4.9, 38.0, 16.5, 17.2, 5.0, 16.1, 21.0, 16.4]
    assert timing.slow_reply_ms(stalled, 4.68, "cpu") is None
    # work moved past the window is there on every call
    extra = timing.slow_reply_ms([x + 12.0 for x in stalled], 4.68, "cpu")
    assert extra is not None and extra > 11.0
    assert timing.slow_reply_ms([0.9] * 10, 0.2, "cuda") is not None  # 0.7 ms > 0.25 + 0.15
    assert timing.slow_reply_ms([0.3] * 10, 0.2, "cuda") is None
    assert timing.slow_reply_ms([50.0] * 4, 0.2, "cuda") is None  # too few calls to judge


def test_output_digest_sees_every_word() -> None:
    import torch

    from workers.harness.sandboxed.digests import digest_weights, output_digest

    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 129, 7, generator=g).to(torch.bfloat16)  # odd sizes
    n = x.numel()
    w = digest_weights(n, 12345, "cpu")
    assert w.dtype == torch.int32 and int(w.min()) >= 0 and int(w.max()) < 1 << 15
    d = output_digest(x, w)
    assert d == output_digest(x.clone(), digest_weights(n, 12345, "cpu"))  # deterministic
    assert d != output_digest(x, digest_weights(n, 54321, "cpu"))  # keyed
    for i in (0, n // 2, n - 1):  # one element changed anywhere
        y = x.clone().reshape(-1)
        y[i] = y[i] + 1
        assert output_digest(y.reshape(x.shape), w) != d
    # 32-bit words are digested as two 16-bit ones, with as many weights
    f = torch.randn(1000, generator=g)
    wf = digest_weights(2 * f.numel(), 7, "cpu")
    assert output_digest(f, wf) != output_digest(f.neg(), wf)


def test_keyed_input_digest() -> None:
    import torch

    from workers.harness.sandboxed.digests import input_digest

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 257, 5, generator=g).to(torch.bfloat16)  # odd sizes, 16-bit words
    key = 0x5DEECE66D1234567
    d = input_digest(x, key)
    assert d == input_digest(x.clone(), key)  # a fresh copy of the same bytes
    assert d != input_digest(x, key ^ 1 << 40)  # the key matters
    for flat in (0, 1000, x.numel() - 1):  # any one changed element shows
        y = x.clone().reshape(-1)
        y[flat] = y[flat] + 1
        assert input_digest(y.reshape(x.shape), key) != d
    swapped = x.clone().reshape(-1)
    swapped[[0, 1]] = swapped[[1, 0]]  # a permutation keeps every sum of values, not this one
    if not torch.equal(swapped, x.reshape(-1)):
        assert input_digest(swapped.reshape(x.shape), key) != d
    f32 = torch.randn(7, 3, generator=g)
    assert input_digest(f32, key) != input_digest(f32.to(torch.bfloat16).float(), key)


def test_input_digest_is_the_same_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from workers.harness.sandboxed import digests

    x = torch.randn(1001, generator=torch.Generator().manual_seed(1))
    whole = digests.input_digest(x, 12345)
    monkeypatch.setattr(digests, "DIGEST_CHUNK", 64)  # many chunks, a short last one
    assert digests.input_digest(x, 12345) == whole


def _result(verdict: str, speedup: float | None) -> GradeResult:
    v = Verdict(verdict)
    tests = [TestResult("hidden/0", 0.5, v is Verdict.PASS)]
    if speedup is not None:
        tests.append(TestResult("benchmark", 0.5, True, f"speedup {speedup:.3f}x", points=0.5))
    return GradeResult(
        exercise="attention-merge",
        verdict=v,
        score=1.0 if v is Verdict.PASS else 0.0,
        tests=tests,
        output="all tests passed",
        speedup=speedup,
        run_id=f"run-{verdict}-{speedup}",
    )


def test_failing_confirmation_is_the_verdict() -> None:
    ex = load_exercise("attention-merge")
    r = confirm(ex, _result("PASS", 1.2), _result("WRONG_ANSWER", None))
    assert r.verdict.value == "WRONG_ANSWER" and r.score == 0.0
    assert r.output.startswith("confirmation run")


@pytest.mark.parametrize(
    ("speedup", "review", "expected"),
    [
        (1.0, False, True),
        (2.5, False, True),
        (0.99, False, False),
        (0.25, False, False),
        (0.6, True, True),
        (None, False, False),
    ],
)
def test_confirmation_is_timed_again_only_where_it_can_change_the_result(
    speedup: float | None, review: bool, expected: bool
) -> None:
    ex = load_exercise("attention-merge")  # target 1.0
    first = _result("PASS", speedup)
    if review:
        first.details["review"] = ["T16k-H16-D128-bf16"]
    assert retime(ex, first) is expected


def test_untimed_confirmation_keeps_the_first_speedup() -> None:
    ex = load_exercise("attention-merge")
    first = _result("PASS", 0.8)
    r = confirm(ex, first, _result("PASS", None))
    assert r.speedup == 0.8 and r.details["confirmation"]["timed"] is False
    assert "not timed again" in r.output


def test_confirmed_score_uses_the_lower_speedup() -> None:
    ex = load_exercise("attention-merge")  # speed_weight 0.5, target 1.0
    r = confirm(ex, _result("PASS", 0.9), _result("PASS", 0.6))
    assert r.verdict.value == "PASS" and r.speedup == 0.6
    assert r.details["confirmation"]["speedup"] == 0.6
    assert abs(r.score - (0.5 + 0.5 * 0.6)) < 1e-12


def test_later_batches_are_checked_by_a_draw_made_after_them() -> None:
    from workers.harness.timed import FIRST_BATCH_CHECKS, LATER_CHECK_P, batch_checks

    assert all(batch_checks(True) == FIRST_BATCH_CHECKS for _ in range(20))
    draws = [batch_checks(False) for _ in range(4000)]
    assert set(draws) == {0, 1}
    # a shortcut wrong on half of the calls gets through a later batch with probability
    # (1 - p) + p / 2: 3/4 at p = 1/2, the figure the grader's docs state
    assert abs(sum(draws) / len(draws) - LATER_CHECK_P) < 0.04


def test_a_paired_speedup_is_the_median_of_its_rounds_ratios() -> None:
    # the host slows down for the last rounds (both sides alike): round by round, ours and the
    # submission stay equal, while the ratio of the two medians reads the drift as a speedup
    sub = [1.0, 1.0, 1.0, 1.6, 1.6]
    ours = [1.0, 1.0, 1.6, 1.6, 1.6]  # the host slowed one round earlier for ours' turn
    ratios = [o / s for o, s in zip(ours, sub, strict=True)]
    assert timing.paired_speedup(ours, sub, clamp=4.0) == pytest.approx(1.0)
    assert timing.clamp_speedup(1.6, 1.0, 4.0) == pytest.approx(1.6)  # the medians' ratio
    assert timing.paired_speedup(ours, sub, clamp=4.0) == pytest.approx(sorted(ratios)[2])
    # clamped both ways, like every speedup
    assert timing.paired_speedup([9.0] * 3, [1.0] * 3, clamp=4.0) == 4.0
    assert timing.paired_speedup([1.0] * 3, [9.0] * 3, clamp=4.0) == 0.25
