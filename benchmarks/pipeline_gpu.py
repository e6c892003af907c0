"""Drive the whole grading pipeline through the HTTP API once: every known solution of every
exercise, then our own reference several times; print a table and exit non-zero on a miss.

Run by ``benchmarks/pipeline_gpu.sh`` (which starts Redis, the API and a Celery GPU worker);
usable against any running kgrade: ``python benchmarks/pipeline_gpu.py --api URL --token TOK``.

Pass criteria (issue 5): every correct solution is PASS, every wrong one is not PASS (the
expected verdict is shown too), and each reference run's speedup lies within ``--tolerance`` of
1.0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workers.exercises import list_exercises, load_exercise  # noqa: E402

#: Stands for "grade the exercise's own reference" (instructor-only API mode: the reference
#: imports ``kernels``, which a student source may not).
REFERENCE = "<reference>"


@dataclass
class Job:
    exercise: str
    name: str
    expected: str  # "PASS", a failing verdict, or "REFERENCE"
    source: str
    world_size: int = 1
    submission_id: int | None = None
    status: str = "new"
    verdict: str | None = None
    speedup: float | None = None
    score: float | None = None
    seconds: float | None = None
    output: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: time.monotonic() when the API accepted it (202) and when ``poll`` saw its verdict
    submitted_at: float | None = None
    done_at: float | None = None

    @property
    def ok(self) -> bool:
        if self.verdict is None:
            return False
        if self.expected == "PASS":
            return self.verdict == "PASS"
        if self.expected == "REFERENCE":
            return self.verdict == "PASS"  # the speedup check is separate
        return self.verdict != "PASS"


class Api:
    def __init__(self, base: str, token: str) -> None:
        self.base = base.rstrip("/")
        self.token = token

    def call(
        self, method: str, path: str, body: bytes | None = None, ctype: str | None = None
    ) -> tuple[int, Any]:
        req = urllib.request.Request(self.base + path, data=body, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if ctype:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def submit(self, exercise: str, source: str, filename: str, multipart: bool) -> Any:
        path = f"/api/v1/exercises/{exercise}/submissions"
        if source == REFERENCE:
            body = json.dumps({"reference": True}).encode()
            return self.call("POST", path, body, "application/json")
        if not multipart:
            body = json.dumps({"source": source, "filename": filename}).encode()
            return self.call("POST", path, body, "application/json")
        boundary = uuid.uuid4().hex
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                f'filename="{filename}"\r\nContent-Type: text/x-python\r\n\r\n'
            ).encode()
            + source.encode()
            + f"\r\n--{boundary}--\r\n".encode()
        )
        return self.call("POST", path, body, f"multipart/form-data; boundary={boundary}")


def wait_ready(api: Api, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status, _ = api.call("GET", "/api/v1/whoami")
            if status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the API did not come up")
        time.sleep(0.5)


def collect(
    exercises: list[str],
    reference_runs: int,
    gpus: int,
    subset: str,
    picks: list[str] | None = None,
    ref_exercises: list[str] | None = None,
) -> tuple[list[Job], list[Job], list[str]]:
    """Solutions and reference runs to submit, and exercises skipped for lack of GPUs.

    ``picks`` ("exercise:solution" names) replaces ``subset`` by exactly those solutions;
    ``ref_exercises`` limits the reference runs to those exercises.
    """
    jobs: list[Job] = []
    refs: list[Job] = []
    skipped: list[str] = []
    for eid in exercises:
        ex = load_exercise(eid)
        if ex.world_size > gpus:
            skipped.append(f"{eid} (needs {ex.world_size} GPUs, {gpus} here)")
            continue
        sols = ex.solutions()
        if subset == "one":  # one correct and one wrong: the quick smoke run
            good = [s for s in sols if s.expected.value == "PASS"][:1]
            bad = [s for s in sols if s.expected.value != "PASS"][:1]
            sols = good + bad
        elif subset == "none":
            sols = []
        elif subset == "timing":  # the timing cheats, and the correct solutions they build on
            bases = ex.cheat_bases()
            sols = [s for s in sols if s.needs or s.name in bases]
        if picks is not None:
            sols = [s for s in ex.solutions() if f"{eid}:{s.name}" in picks]
        for sol in sols:
            jobs.append(Job(eid, sol.name, sol.expected.value, sol.source(), ex.world_size))
        if ex.reference.is_file() and (ref_exercises is None or eid in ref_exercises):
            for i in range(reference_runs):
                refs.append(Job(eid, f"reference#{i + 1}", "REFERENCE", REFERENCE, ex.world_size))
    return jobs, refs, skipped


def submit_all(api: Api, jobs: list[Job], concurrency: int = 1) -> None:
    """Submit every job; ``concurrency`` > 1 sends that many at a time (a deadline's burst)."""

    def one(n: int, job: Job) -> None:
        # Alternate JSON and multipart bodies: both ways in are exercised.
        status, body = api.submit(
            job.exercise, job.source, job.name.replace("/", "_") + ".py", multipart=n % 2 == 0
        )
        if status != 202:
            job.status, job.output = f"http {status}", json.dumps(body)[:300]
            return
        job.submission_id = body["id"]
        job.submitted_at = time.monotonic()

    if concurrency <= 1:
        for n, job in enumerate(jobs):
            one(n, job)
        return
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        # list(): re-raise the first exception of any submission here
        list(pool.map(one, range(len(jobs)), jobs))


def poll(
    api: Api, jobs: list[Job], deadline: float, on_done: Callable[[Job], None] | None = None
) -> None:
    pending = [j for j in jobs if j.submission_id is not None]
    last_report = 0.0
    while pending and time.monotonic() < deadline:
        time.sleep(2)
        for job in list(pending):
            status, body = api.call("GET", f"/api/v1/submissions/{job.submission_id}")
            if status != 200:
                continue
            job.status = body["status"]
            if body["status"] == "done":
                pending.remove(job)
                job.done_at = time.monotonic()
                job.verdict, job.speedup, job.score = (
                    body["verdict"],
                    body["speedup"],
                    body["score"],
                )
                result = body.get("result") or {}
                job.output = (result.get("output") or "")[:300]
                kg = result.get("kgrade") or {}
                details = kg.get("details") or {}
                job.seconds = kg.get("elapsed_s")
                if job.speedup is None:
                    job.speedup = kg.get("speedup")
                job.extra = {
                    "attempts": body["attempts"],
                    "isolation": kg.get("isolation"),
                    # per shape: n, median, reference median, speedup; and the raw samples,
                    # to study run-to-run spread afterwards
                    "timings": [
                        {
                            k: t.get(k)
                            for k in ("name", "n", "median_ms", "ref_median_ms", "speedup")
                        }
                        for t in kg.get("timings") or []
                    ],
                    "raw_samples_ms": details.get("raw_samples_ms"),
                    # our reference's calls beside these (paired) or the cached baseline's mode
                    "baseline": details.get("baseline"),
                    # seconds per grading phase (import includes the job's start-up)
                    "phase_s": details.get("phase_s"),
                    # where the tests phase waited: the checker's next case, the runner, checks
                    "tests_s": details.get("tests_s"),
                    # the confirmation run: re-timed or tests only (workers.harness.scoring)
                    "confirmation": {
                        k: v
                        for k, v in (details.get("confirmation") or {}).items()
                        if k in ("timed", "speedup")
                    }
                    or None,
                    "ref_raw_samples_ms": details.get("ref_raw_samples_ms"),
                    "bench_profile": details.get("bench_profile"),
                    # the machine's state against the baseline's (workers.harness canary)
                    "canary": details.get("canary"),
                    "gpus": (kg.get("hardware") or {}).get("gpus"),
                    # the server's clock (ISO 8601, UTC): accepted, delivery started, verdict
                    "created_at": body.get("created_at"),
                    "started_at": body.get("started_at"),
                    "finished_at": body.get("finished_at"),
                    "queue": body.get("queue"),
                }
                if on_done is not None:
                    on_done(job)
        if time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            print(f"[poll] {len(jobs) - len(pending)}/{len(jobs)} done", flush=True)
    for job in pending:
        job.status = "timeout (still " + job.status + ")"


def write_json(
    path: Path, jobs: list[Job], skipped: list[str], extra: dict[str, Any] | None = None
) -> None:
    """Rows (without sources) and ``extra``'s keys, replaced atomically: a run cut short keeps
    the last complete file."""
    rows = [{k: v for k, v in vars(j).items() if k != "source"} for j in jobs]
    text = json.dumps({"rows": rows, "skipped": skipped, **(extra or {})}, indent=1)
    if path.exists() and not path.is_file():
        # /dev/null or a FIFO: write into it; a rename would replace the device node itself
        path.write_text(text)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def table(jobs: list[Job]) -> str:
    head = (
        f"{'exercise':<28} {'solution':<34} {'expected':<20} {'verdict':<20} {'speedup':>8} "
        f"{'time_s':>7}  ok"
    )
    lines = [head, "-" * len(head)]
    for j in jobs:
        sp = f"{j.speedup:.4f}" if j.speedup is not None else "-"
        ts = f"{j.seconds:.1f}" if j.seconds is not None else "-"
        lines.append(
            f"{j.exercise:<28} {j.name:<34} {j.expected:<20} {str(j.verdict or j.status):<20} "
            f"{sp:>8} {ts:>7}  {'yes' if j.ok else 'NO'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--api", default="http://127.0.0.1:8000")
    ap.add_argument("--token", required=True)
    ap.add_argument("--exercise", action="append", help="default: all")
    ap.add_argument(
        "--solutions",
        choices=("all", "one", "none", "timing"),
        default="all",
        help="every known solution, one correct and one wrong per exercise, none (only the "
        "reference runs: timing repeatability), or the timing cheats (solutions marked "
        "'# needs: ...') and the correct solutions they are built on",
    )
    ap.add_argument(
        "--solution",
        action="append",
        metavar="EXERCISE:SOLUTION",
        help="grade exactly these known solutions (e.g. ring-attention:correct/p2p_ring) "
        "instead of --solutions; repeatable",
    )
    ap.add_argument("--reference-runs", type=int, default=5)
    ap.add_argument(
        "--reference-exercise",
        action="append",
        metavar="EXERCISE",
        help="reference runs only for these exercises (default: every exercise graded)",
    )
    ap.add_argument(
        "--references-first",
        action="store_true",
        help="within each phase, the reference runs before the solutions",
    )
    ap.add_argument(
        "--narrow-first",
        action="store_true",
        help="the one-GPU phase before the multi-GPU one (default: widest first)",
    )
    ap.add_argument("--gpus", type=int, default=1, help="exercises needing more are skipped")
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument(
        "--deadline",
        type=float,
        default=480.0,
        help="seconds for everything; what is unfinished then counts as a miss",
    )
    ap.add_argument("--json", type=Path, help="write all rows here")
    args = ap.parse_args(argv)

    t0 = time.monotonic()
    api = Api(args.api, args.token)
    exercises = args.exercise or list_exercises()
    if args.solution:
        known = {f"{e}:{s.name}" for e in exercises for s in load_exercise(e).solutions()}
        unknown = sorted(set(args.solution) - known)
        if unknown:
            ap.error(f"unknown --solution {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    wait_ready(api, 120)
    jobs, refs, skipped = collect(
        exercises,
        args.reference_runs,
        args.gpus,
        args.solutions,
        args.solution,
        args.reference_exercise,
    )
    print(
        f"exercises: {', '.join(exercises)}; {len(jobs)} solutions, {len(refs)} reference "
        f"runs; skipped: {', '.join(skipped) or 'none'}",
        flush=True,
    )
    everything = refs + jobs if args.references_first else jobs + refs

    def done(job: Job) -> None:
        # A line per grading as it ends, and the JSON so far: a run cut short still reports.
        sp = f"{job.speedup:.4f}" if job.speedup is not None else "-"
        ratio = (job.extra.get("canary") or {}).get("ratio") or {}
        can = " canary " + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items()) if ratio else ""
        print(
            f"[done {time.monotonic() - t0:5.0f} s] {job.exercise} {job.name}: "
            f"{job.verdict} speedup {sp} in {job.seconds} s{can}",
            flush=True,
        )
        if args.json:
            write_json(args.json, everything, skipped)

    # Phases by GPU count, the widest first: the multi-GPU worker takes those while every GPU
    # is idle (its health gate refuses GPUs with foreign processes), then one worker per GPU
    # takes the one-GPU exercises, in order: solutions, then the reference runs back to back,
    # so their spread is the harness's own run-to-run noise.
    for world in sorted({j.world_size for j in everything}, reverse=not args.narrow_first):
        phase = [j for j in everything if j.world_size == world]
        if time.monotonic() > t0 + args.deadline:
            # Never queue work behind unfinished gradings: the multi-GPU worker's health gate
            # would find their processes on its GPUs.
            for j in phase:
                j.status = "not submitted (deadline)"
            continue
        print(f"== phase: {len(phase)} gradings needing {world} GPU(s)", flush=True)
        submit_all(api, phase)
        poll(api, phase, t0 + args.deadline, done)
    print(table(jobs), flush=True)
    print(table(refs), flush=True)

    bad = [j for j in jobs if not j.ok]
    ref_bad = [
        j for j in refs if not j.ok or j.speedup is None or abs(j.speedup - 1.0) > args.tolerance
    ]
    print(
        f"\nsolutions: {len(jobs) - len(bad)}/{len(jobs)} as expected "
        f"(exact expected verdict: {sum(j.verdict == j.expected for j in jobs)}/{len(jobs)}); "
        f"reference runs within {args.tolerance:.0%} of 1.0: {len(refs) - len(ref_bad)}/"
        f"{len(refs)}; wall {time.monotonic() - t0:.0f} s"
    )
    for eid in exercises:
        sp = [j.speedup for j in refs if j.exercise == eid and j.speedup is not None]
        if sp:
            print(
                f"  {eid}: reference speedups {', '.join(f'{s:.4f}' for s in sp)} "
                f"(min {min(sp):.4f}, max {max(sp):.4f})"
            )
    # Per reference run and shape: both medians (the submission's and the baseline's, paired in
    # one loop or cached), their relative standard errors, counted calls, the wait for the
    # host's timing turn, and the canary against a cached baseline's.
    for j in refs:
        prof = j.extra.get("bench_profile") or {}
        base = j.extra.get("baseline") or {}
        ratio = (j.extra.get("canary") or {}).get("ratio") or {}
        for t in j.extra.get("timings") or []:
            p = prof.get(t["name"]) or {}
            bp = base.get(t["name"]) or {}
            med, ref = t.get("median_ms"), t.get("ref_median_ms")
            print(
                f"  {j.exercise} {j.name} {t['name']}: median "
                f"{med if med is None else round(med, 4)} ms vs baseline "
                f"{ref if ref is None else round(ref, 4)} ms ({base.get('mode', '-')}), rel SE "
                f"{p.get('rel_se')} / {bp.get('rel_se', '-')}, calls {p.get('calls')} / "
                f"{bp.get('calls', '-')}, turn wait {p.get('turn_wait_s')} s; canary "
                + (", ".join(f"{k} {v:.3f}" for k, v in ratio.items()) or "-")
            )
    # Where a grading's time goes: per exercise and kind, the median seconds of each phase.
    groups: dict[tuple[str, str], list[dict[str, float]]] = {}
    for j in everything:
        ph = j.extra.get("phase_s")
        if ph:
            kind = "reference" if j.expected == "REFERENCE" else j.expected.lower()
            groups.setdefault((j.exercise, kind), []).append(ph)
    for (eid, kind), phs in sorted(groups.items()):
        names = [n for n in ("import", "tests", "benchmark") if any(n in p for p in phs)]
        parts = [f"{n} {statistics.median(p[n] for p in phs if n in p):.1f} s" for n in names]
        print(f"  phases {eid} {kind} (median of {len(phs)}): " + ", ".join(parts))
    for j in bad + ref_bad:
        print(f"  MISS {j.exercise} {j.name}: {j.verdict or j.status} {j.output[:200]!r}")
    for s_ in skipped:
        print(f"  SKIPPED {s_}")
    if args.json:
        write_json(args.json, everything, skipped)
    return 0 if not bad and not ref_bad else 1


if __name__ == "__main__":
    sys.exit(main())
