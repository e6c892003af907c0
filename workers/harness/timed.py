"""Timed calls as the trusted parent sees them (grader spec §5), one side of a loop at a time.

A timed call is two round trips. ``prep`` has the runner make the call's inputs, poison the
allocator, flush L2 and sync; ``go`` runs the window: the call, a harness-owned copy of every
output on the timed stream (its time taken out), a device-wide sync, the end event, and then the
digests of those copies. The parent's own clock runs from sending ``go`` to reading ``done``,
so what the runner reports is bounded by a clock it cannot touch: its samples plus the harness's
fixed per-call cost ``O`` (measured by null calls through the identical path before the
submission is imported) must account for that wall time, and any gap is an INTEGRITY_VIOLATION.

Calls are checked in batches: the parent decides which of a batch's calls the checker sees only
after the batch, and the checker compares the outputs captured inside each window with the
digests committed before the parent's clock stopped. Outputs finished later (lazily, by a
thread, on a stream nobody waited for) fail either way.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from workers.harness import timing
from workers.harness.channel import validate_called
from workers.harness.failure import Failure, error_verdict, fmt_err
from workers.harness.job import Job
from workers.harness.procs import job_pids, job_processes, thread_count
from workers.verdicts import Verdict

#: Calls per batch, and how many of a batch's calls are checked once it is over: a submission
#: wrong on more than half of a 10-call batch escapes 4 random checks with probability
#: C(4,4)/C(10,4) < 0.5 %, and a loop has at least one such batch per shape. A later batch gets
#: one check with probability LATER_CHECK_P, drawn after the batch: the score is the median,
#: which only moves if at least half of the calls are faster, so a shortcut that pays must be
#: wrong on at least half of them, and then gets through a later batch with probability at most
#: (1 - p) + p / 2 = 3/4 (0.75^19 < 0.5 % over a 200-call loop's later batches, on top of the
#: first batch's 0.5 %). Each check costs a capture written and read on both sides (ours writes
#: as many, never read) and its fp64 gold: about 280 ms at merge's benchmark shapes on the H200
#: in run 14, when one check in every later batch was half the loop's time.
BATCH = 10
FIRST_BATCH_CHECKS = 4
LATER_CHECK_P = 0.5
NULL_CALLS = 5
_rand = secrets.SystemRandom()


def batch_checks(first: bool) -> int:
    """How many of a finished batch's calls to check: FIRST_BATCH_CHECKS in a loop's first
    batch, then one with probability LATER_CHECK_P (the draw made after the batch)."""
    if first:
        return FIRST_BATCH_CHECKS
    return 1 if _rand.random() < LATER_CHECK_P else 0


@dataclass
class Baseline:
    """A runner's state before the submission's import: threads and processes (host counts),
    and the null call's per-call overhead per shape (parent wall minus reported time)."""

    pids: list[int]
    threads: int
    processes: int
    null_ms: dict[int, float]
    reply_ms: dict[int, float]  # a null call's digest phase, per shape


def _msgs(job: Job, shape: dict[str, Any], tag: str, **extra: Any) -> list[dict[str, Any]]:
    base = {
        "t": "prep",
        "id": tag,
        "gens": shape["gens"],
        "args": shape["args"],
        "kwargs": shape["kwargs"],
        "ret": shape["ret"],
        "flush": True,
        "timed": True,
        **extra,
    }
    return [
        {
            **base,
            "outputs": [
                {**o, "path": f"out/{tag}_r{r}_{o['name']}.bin", "nbytes": 0}
                for o in shape["outputs"]
            ],
        }
        for r in range(job.world)
    ]


def _need(c: bool, what: str) -> None:
    if not c:
        raise Failure(Verdict.INTEGRITY_VIOLATION, f"runner message: {what}")


@dataclass
class Walls:
    """The parent's clock for one call: ``call`` from sending ``go`` to the last rank's
    ``ended`` (the window), ``reply`` from there to the last ``done`` (the digests)."""

    call: float
    reply: float


def run_call(
    job: Job, shape: dict[str, Any], tag: str, deadline: float, **extra: Any
) -> tuple[list[dict[str, Any]], Walls, list[dict[str, Any]]]:
    """One call on every rank: the ready replies, the parent's clock (ms) and the validated
    ``done`` reports."""
    job.send_all(_msgs(job, shape, tag, **extra), "benchmark")
    readies = job.recv_all(deadline, "benchmark")
    for m in readies:
        _need(m.get("t") == "ready" and m.get("id") == tag, "unexpected ready message")
    w0 = time.perf_counter()
    job.send_all([{"t": "go", "id": tag}] * job.world, "benchmark")
    for m in job.recv_all(deadline, "benchmark"):
        _need(m.get("t") == "ended" and m.get("id") == tag, "unexpected end-of-window message")
    w1 = time.perf_counter()
    reps = job.recv_all(deadline, "benchmark")
    walls = Walls((w1 - w0) * 1e3, (time.perf_counter() - w1) * 1e3)
    n_out = None if extra.get("null") else len(shape["outputs"])
    for m in reps:
        validate_called(m, tag, n_out, "done")
        if m.get("tamper"):
            raise Failure(Verdict.INTEGRITY_VIOLATION, f"harness state modified: {m['tamper']}")
        if not m["ok"]:
            err = m.get("error") or {}
            raise Failure(error_verdict(err), fmt_err(err))
    return readies, walls, reps


def slowest_rank(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """One report for a call across ranks: the slowest rank's times and the side-stream ratio of
    the rank that kept the least of its work on the timed stream."""
    if len(reps) == 1:
        return reps[0]
    m = dict(max(reps, key=lambda r: float(r["ev_sync_ms"])))
    ratio = min(float(r["ev_stream_ms"]) / max(float(r["ev_sync_ms"]), 1e-9) for r in reps)
    m["ev_stream_ms"] = ratio * float(m["ev_sync_ms"])
    return m


def baseline(job: Job, plan: dict[str, Any], deadline: float) -> Baseline:
    """Warm the runner, time null calls for every benchmark shape, count threads and processes:
    all before the submission's module exists in the process."""
    # an exercise whose submissions run a backward warms the autograd engine's threads too
    warm = {"t": "warm", "autograd": job.ex.autograd}
    job.send_all([warm] * job.world, "start-up")
    for m in job.recv_all(deadline, "start-up"):
        if m.get("t") != "warm" or not m.get("ok"):
            raise Failure(Verdict.INFRA_ERROR, f"runner warm-up failed: {m.get('error')}")
    null_ms: dict[int, float] = {}
    reply_ms: dict[int, float] = {}
    for b, shape in enumerate(plan["bench"]):
        over, replies = [], []
        wkey = secrets.randbits(62)
        for k in range(NULL_CALLS):
            tag = f"b{b}n{k}"
            seed = secrets.randbits(62)
            _, walls, reps = run_call(job, shape, tag, deadline, null=True, seed=seed, wkey=wkey)
            over.append(walls.call - float(slowest_rank(reps)["ev_sync_ms"]))
            replies.append(walls.reply)
        job.send_all([{"t": "emit", "ids": [], "key": 1}] * job.world, "start-up")
        job.recv_all(deadline, "start-up")
        null_ms[b] = statistics.median(over)
        reply_ms[b] = statistics.median(replies)
    pids = job_pids(job) or []
    return Baseline(pids, thread_count(pids), len(pids), null_ms, reply_ms)


class Side:
    """One process's timed calls for a shape: the submission's, or our reference's beside it."""

    def __init__(
        self,
        job: Job,
        b: int,
        shape: dict[str, Any],
        deadline: float,
        base: Baseline,
        ours: bool = False,
    ) -> None:
        self.job, self.b, self.shape, self.deadline, self.base = job, b, shape, deadline, base
        self.ours = ours  # our reference beside the submission: never checked, never charged
        self.wkey = secrets.randbits(62)  # output digest weights for this shape
        self.cost: defaultdict[str, float] = defaultdict(float)
        self.samples: list[float] = []  # counted calls' device-synced times: the statistics
        self.events: list[float] = []  # every timed call's, for the integrity checks
        self.streams: list[float] = []
        self.walls: list[float] = []  # the parent's clock per call: its window
        self.replies: list[float] = []  # ... and its digests
        self.batch: list[tuple[str, int, bool]] = []  # (tag, seed, all outputs captured)
        self.batches = 0
        self.settled = 0
        self.i = 0
        self.gpu_s = 0.0
        self.checked = 0
        self.warmup_calls = 0
        self.warmup_s = 0.0
        self.warmup_judged = 0  # warm-up calls the loop's integrity checks judge too
        self.floor_stop = False
        self.peer: Side | None = None  # the other side of a paired loop
        self.reps: dict[str, dict[str, Any]] = {}  # the batch's rank-0 reports, by tag

    def fail(self, verdict: Verdict, message: str) -> Failure:
        if self.ours:  # our reference failing beside a submission is our fault, not its
            return Failure(Verdict.INFRA_ERROR, f"reference beside the submission: {message}")
        return Failure(verdict, message)

    @property
    def name(self) -> str:
        return self.shape["name"]

    def call(self, tag: str) -> dict[str, Any]:
        seed = secrets.randbits(62)
        extra: dict[str, Any] = {"seed": seed, "wkey": self.wkey}
        # our reference's turn: the GPU must be idle (the submission is stopped by now, and
        # anything it left running would slow our baseline in its favour)
        probe = self.ours and self.job.device == "cuda"
        try:
            readies, walls, reps = run_call(
                self.job, self.shape, tag, self.deadline, idle_probe=probe, **extra
            )
            wall = walls.call
        except Failure as f:
            raise self.fail(f.verdict, f.message) from None
        busy = max(float(m.get("busy_ms") or 0.0) for m in readies)
        if busy > 0:
            raise Failure(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {self.name}: the GPU was still busy with the submission's work "
                f"{busy:.0f} ms into our reference's turn",
            )
        m = slowest_rank(reps)
        t_sync, t_stream = float(m["ev_sync_ms"]), float(m["ev_stream_ms"])
        if t_sync > wall + 0.05:
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {self.name}: reported time exceeds the wall clock",
            )
        threads = thread_count(self.base.pids)
        if threads > self.base.threads:
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {self.name}: the submission started threads ({self.base.threads} "
                f"in the job before its import, {threads} during the timed calls)",
            )
        n_out = len(self.shape["outputs"])
        captured = all(len(r["digests"]) == n_out for r in reps)
        self.batch.append((tag, seed, captured))
        self.events.append(t_sync)
        self.streams.append(t_stream)
        self.walls.append(wall)
        self.replies.append(walls.reply)
        self.gpu_s += t_sync / 1e3
        self.reps[tag] = reps[0]
        return m

    # -- the warm-up and the loop
    def warmup(self) -> None:
        """>= 3 calls and >= 50 ms, the first calls checked (a wrong kernel stops here)."""
        w0 = time.monotonic()
        spent, k = 0.0, 0
        while k < timing.WARMUP_CALLS or spent < timing.WARMUP_MIN_S * 1e3:
            m = self.call(f"b{self.b}w{k}")
            spent += float(m["ev_sync_ms"])
            k += 1
            if k > 50:
                break
        self.end_batch(checks=[t for t, _, _ in self.batch[: timing.WARMUP_CALLS]])
        # The warm-up's times are not the loop's statistics, and the loop's first batch is
        # checked as a first batch. Its last WARMUP_JUDGED calls (never the first, which may
        # compile or autotune) stay with the integrity checks (wall clock, digest phase, side
        # stream, roofline floor): a forged clock forges them too, and a loop stopped at the
        # clamp's floor after FLOOR_FAST_ITERS calls then still has MIN_PLAUSIBLE_CALLS judged.
        keep = min(k - 1, timing.WARMUP_JUDGED)
        for name in ("events", "streams", "walls", "replies"):
            setattr(self, name, getattr(self, name)[len(getattr(self, name)) - keep :])
        self.warmup_judged = keep
        self.batches = 0
        # nor is its GPU time: a first call that compiles its kernels (seconds) would spend the
        # loop's GPU budget before the loop starts
        self.gpu_s = 0.0
        self.warmup_calls, self.warmup_s = k, time.monotonic() - w0

    def timed(self, counted: bool = True) -> None:
        i = self.i
        self.i += 1
        m = self.call(f"b{self.b}i{i}")
        if counted:
            self.samples.append(float(m["ev_sync_ms"]))
        else:
            self.settled += 1

    def batch_full(self) -> bool:
        return len(self.batch) >= BATCH

    def end_batch(self, checks: list[str] | None = None, k: int | None = None) -> None:
        """The batch's integrity checks, then ``k`` calls chosen now (after the batch; drawn
        by ``batch_checks`` when not given) are checked against their committed digests and
        the fp64 gold."""
        if not self.batch:
            return
        self.integrity()
        tags = [t for t, _, _ in self.batch]
        if checks is None:
            k = batch_checks(self.batches == 0) if k is None else k
            checks = _rand.sample(tags, min(k, len(tags)))
        # a call whose outputs could not be captured (wrong type, dtype, shape) is always
        # checked: the checker names the violation
        checks = sorted(set(checks) | {t for t, _, ok in self.batch if not ok})
        # Ours writes as many captures as the submission's checks (never read): both runners
        # then do the same host work between batches. Run 13 (ours writing none) graded our
        # reference against itself at 1.0016-1.0231 on merge's short, host-bound calls (9 of
        # 10 shapes above 1.0); run 12, with the same work on both sides, at 0.9961-1.0126.
        key = secrets.randbits(63)
        t0 = time.perf_counter()
        msg = {"t": "emit", "ids": checks, "key": key, "keep": tags[-1]}
        try:
            self.job.send_all([msg] * self.job.world, "benchmark")
            emitted = self.job.recv_all(self.deadline, "benchmark")
        except Failure as f:
            raise self.fail(f.verdict, f.message) from None
        self.cost["emit_s"] += time.perf_counter() - t0
        spent = emitted[0].get("spent")
        if isinstance(spent, dict):  # the runner's own account: for the operators' profile only
            for k in ("write_ms", "digest_ms"):
                v = spent.get(k)
                if isinstance(v, (int, float)):
                    self.cost[f"runner_{k}"] += float(v)
        self.cost["captures"] += len(checks)
        seeds = {t: s for t, s, _ in self.batch}
        self.batch = []
        self.batches += 1
        try:
            for tag in checks:
                self.check(tag, seeds[tag], key, emitted[0].get("calls", {}).get(tag) or {})
        finally:
            for tag in tags:  # snapshots nobody reads (other ranks', ours) are dropped
                for r in range(self.job.world):
                    for o in self.shape["outputs"]:
                        (self.job.root / f"out/{tag}_r{r}_{o['name']}.bin").unlink(missing_ok=True)
            self.reps = {}
        self.cost["batch_end_s"] += time.perf_counter() - t0
        self.cost["batches"] += 1

    def check(self, tag: str, seed: int, key: int, emitted: dict[str, Any]) -> None:
        if self.ours:
            return
        assert self.job.checker
        res = dict(self.reps[tag])
        digests = emitted.get("inputs")
        if isinstance(digests, dict):
            res["inputs"] = {k: {**v, **(digests.get(k) or {})} for k, v in res["inputs"].items()}
        t0 = time.perf_counter()
        rep = self.job.checker.ask(
            {
                "op": "bench_check",
                "b": self.b,
                "seed": seed,
                "result": res,
                "tag": tag,
                "key": key,
                "wkey": self.wkey,
            }
        )
        self.cost["check_s"] += time.perf_counter() - t0
        for k, v in (rep.get("spent_ms") or {}).items():
            self.cost[f"checker_{k}"] += float(v)
        self.checked += 1
        if rep.get("verdict"):
            raise Failure(Verdict(rep["verdict"]), f"benchmark {self.name}: {rep['message']}")

    def _expected(self, null: dict[int, float], peer_values: list[float]) -> float:
        """A per-call harness cost: the null calls' before the import; beside our reference,
        the larger of that and what our reference's calls in this very loop show (the same
        path, the host as it is now: null calls before a loop can meet a quieter host)."""
        o = null.get(self.b, 0.0)
        peer = self.peer
        if peer is not None and peer.ours and len(peer_values) >= timing.MIN_PLAUSIBLE_CALLS:
            o = max(o, statistics.median(peer_values))
        return o

    def overhead_ms(self) -> float:
        """``O``: the parent's clock over a window beyond the reported sample."""
        peer = self.peer
        gaps = [w - e for w, e in zip(peer.walls, peer.events, strict=True)] if peer else []
        return self._expected(self.base.null_ms, gaps)

    def reply_ms(self) -> float:
        """The digest phase after a window."""
        return self._expected(self.base.reply_ms, self.peer.replies if self.peer else [])

    def integrity(self) -> None:
        """What the batch's calls say about how they were timed: processes, the wall clock,
        work outside the timed stream, the roofline floor."""
        n = job_processes(self.job)
        if n is not None and n > self.base.processes:
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {self.name}: the submission started processes "
                f"({self.base.processes} in the job before its import, {n} now)",
            )
        if not self.events:
            return
        o = self.overhead_ms()
        # our reference's times are real (nothing untrusted runs in its process): a gap there
        # would be the host's noise, not a forged clock
        gap = (
            None
            if self.ours
            else timing.unexplained_wall_ms(self.events, self.walls, o, self.job.device)
        )
        if gap is not None:
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {self.name}: reported times implausible against the grader's "
                f"clock: the median call took {statistics.median(self.walls):.3f} ms of wall "
                f"time for {statistics.median(self.events):.3f} ms reported and {o:.3f} ms of "
                f"harness overhead ({gap:.3f} ms unaccounted for, {len(self.events)} calls)",
            )
        d = self.reply_ms()
        slow = None if self.ours else timing.slow_reply_ms(self.replies, d, self.job.device)
        if slow is not None:
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {self.name}: the runner took {d + slow:.3f} ms or more on most "
                f"calls (lower quartile) between the end of a call's window and its digests, "
                f"{slow:.3f} ms more than the harness's own {d:.3f} ms: work done after the window",
            )
        if timing.side_stream_escape(self.streams, self.events):
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {self.name}: work outside the timed stream (median stream "
                f"{statistics.median(self.streams):.3f} ms vs device "
                f"{statistics.median(self.events):.3f} ms)",
            )
        if min(self.events) < self.shape["floor_ms"]:
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {self.name}: {min(self.events):.4f} ms is below the roofline floor "
                f"{self.shape['floor_ms']:.4f} ms",
            )

    def _batch_end_split(self) -> dict[str, float]:
        c = self.cost
        per_end, per_cap = max(1.0, c["batches"]), max(1.0, c["captures"])
        per_check = max(1, self.checked)
        split = {
            "emit_ms": 1e3 * c["emit_s"] / per_end,
            "captures": c["captures"],
            "write_ms_per_capture": c["runner_write_ms"] / per_cap,
            "digest_ms_per_capture": c["runner_digest_ms"] / per_cap,
            "check_ms": 1e3 * c["check_s"] / per_check,
        }
        for k in ("gen_ms", "read_ms", "gold_ms"):
            if f"checker_{k}" in c:
                split[f"check_{k}"] = c[f"checker_{k}"] / per_check
        return {k: round(v, 3) for k, v in split.items()}

    def finish(self, loop_s: float) -> dict[str, Any]:
        self.end_batch()
        self.integrity()
        st = timing.stats(self.samples)
        over = [w - e for w, e in zip(self.walls, self.events, strict=True)]
        return {
            "stats": st,
            "samples": self.samples,
            # where a shape's wall time goes (harness cost per call, checked calls), for operators
            "profile": {
                "null_ms": round(self.base.null_ms.get(self.b, 0.0), 4),
                "null_reply_ms": round(self.base.reply_ms.get(self.b, 0.0), 4),
                "reply_ms": round(statistics.median(self.replies), 4) if self.replies else None,
                "overhead_ms": round(statistics.median(over), 4) if over else None,
                "warmup_calls": self.warmup_calls,
                "warmup_s": round(self.warmup_s, 3),
                "warmup_judged": self.warmup_judged,
                "calls": len(self.samples),
                "settle_calls": self.settled,
                "checked": self.checked,
                "batches": int(self.cost["batches"]),
                "batch_end_ms": round(
                    1e3 * self.cost["batch_end_s"] / max(1, self.cost["batches"]), 2
                ),
                # a batch end's parts: the captures written (per batch end, and the runner's
                # own split per capture), then each check in the checker (its split per check)
                "batch_end_split": self._batch_end_split(),
                "loop_s": round(loop_s, 3),
                "floor_stop": self.floor_stop,
                "rel_se": round(st.rel_se, 5) if st.rel_se < float("inf") else None,
            },
            "review": st.median < timing.HUMAN_REVIEW_FACTOR * self.shape["floor_ms"],
        }
