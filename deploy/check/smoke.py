"""Smoke test of a running kgrade stack, as a new course would use it (stdlib only).

Run by deploy/check/run.sh against the compose stack: tokens made with the CLI inside the API
container, a quiz attempt with immediate feedback, a kernel exercise graded on the CPU worker
through Redis inside bubblewrap, the quiz's grades CSV, Celery beat sending the stuck-job
reaper, a grading whose worker is SIGKILLed midway and that the reaper requeues, and /metrics
scrapes of the API (summed over its gunicorn workers) and of the CPU worker. Each step prints
one line; the first failure stops the run with exit status 1 and says what was expected.

    python3 deploy/check/smoke.py --api http://127.0.0.1:8000 \
        --compose "docker compose -p kgrade-check -f deploy/docker-compose.yml"
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
QUIZ = "ring-attention-quiz"
EXERCISE = "attention-merge"
SOLUTIONS = ROOT / "item_bank" / "exercises" / EXERCISE / "solutions"
# One known-correct and one known-wrong solution: a PASS alone could come from a grader that
# passes everything.
GRADED = {"correct/stable_fp32.py": "PASS", "wrong/zeros.py": "WRONG_ANSWER"}
#: The beat task (workers.celery_app.REAP_TASK) and its schedule entry's name.
REAP_TASK = "workers.tasks.reap_stuck_jobs"
REAP_ENTRY = "reap-stuck-jobs"
#: Where the grading workers serve their metrics inside the compose network (KGRADE_METRICS_PORT).
WORKER_METRICS = "http://127.0.0.1:9100/metrics"


class SmokeError(Exception):
    """A step of the smoke test did not do what a user expects."""


def http(
    method: str, url: str, token: str | None = None, body: Any = None
) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:  # a 4xx/5xx is an answer to check, not a crash
        return err.code, dict(err.headers), err.read()


def expect_json(method: str, url: str, token: str | None, status: int, body: Any = None) -> Any:
    got, _, raw = http(method, url, token, body)
    if got != status:
        raise SmokeError(f"{method} {url}: expected {status}, got {got}: {raw[:300]!r}")
    return json.loads(raw)


def wait_until_ready(base: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            status, _, raw = http("GET", f"{base}/readyz")
            if status == 200:
                return
            last = f"{status} {raw[:200]!r}"
        except OSError as err:
            last = repr(err)
        time.sleep(2)
    raise SmokeError(f"/readyz not ready after {timeout_s:.0f} s: {last}")


class Compose:
    """The stack's compose command line (``docker compose -p ... -f ...``)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = shlex.split(prefix)

    def run(self, *args: str, timeout: float = 120) -> str:
        out = subprocess.run([*self.prefix, *args], capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise SmokeError(f"compose {' '.join(args[:3])} failed: {out.stderr[-500:]}")
        return out.stdout

    def exec(self, service: str, *argv: str) -> str:
        return self.run("exec", "-T", service, *argv)

    def logs(self, service: str) -> str:
        return self.run("logs", "--no-color", service)


def make_token(compose: Compose, role: str, name: str) -> str:
    out = compose.exec("api", "kgrade", "token", "create", "--role", role, "--name", name)
    return out.strip().splitlines()[-1]


def take_quiz(api: str, student: str, instructor: str) -> tuple[str, float]:
    """Answer the first half of the items right and the rest wrong; check feedback and score."""
    key = expect_json("GET", f"{api}/quizzes/{QUIZ}", instructor, 200)
    right = {it["id"]: it["correct_options"] for it in key["items"]}
    attempt = expect_json("POST", f"{api}/quizzes/{QUIZ}/attempts", student, 201, {"lang": "en"})
    items = attempt["items"]
    if any("correct_options" in it for it in items):
        raise SmokeError("a student's new attempt shows the answer key")
    expected = 0.0
    for n, item in enumerate(items):
        correct = n < len(items) // 2
        wrong = [o["id"] for o in item["options"] if o["id"] not in right[item["id"]]]
        answer = right[item["id"]] if correct else wrong[:1]
        fb = expect_json(
            "POST",
            f"{api}/attempts/{attempt['id']}/responses",
            student,
            201,  # the first answer to an item creates its response
            {"item_id": item["id"], "answer": answer},
        )
        if fb["correct"] is not correct or fb["correct_options"] != right[item["id"]]:
            raise SmokeError(f"feedback for {item['id']} (answered {answer}): {fb}")
        if not fb.get("explanation"):
            raise SmokeError(f"no explanation in the feedback for {item['id']}")
        expected += item["points"] if correct else 0
    result = expect_json("POST", f"{api}/attempts/{attempt['id']}/submit", student, 200)
    if result["score"] != expected:
        raise SmokeError(f"score {result['score']}, expected {expected}")
    print(
        f"ok  quiz attempt: {len(items)} answers with feedback, "
        f"score {result['score']}/{result['max_score']}"
    )
    return attempt["id"], expected


def isolation_of(got: dict[str, Any]) -> str:
    return str(((got.get("result") or {}).get("kgrade") or {}).get("isolation"))


def grade_exercise(
    api: str, base: str, student: str, timeout_s: float, allow_rlimits: bool
) -> None:
    """Submit known solutions; each must be graded by the CPU worker with its known verdict,
    inside bubblewrap (unless ``allow_rlimits``)."""
    pending: dict[str, tuple[str, str]] = {}
    for rel, verdict in GRADED.items():
        source = (SOLUTIONS / rel).read_text()
        sub = expect_json(
            "POST", f"{api}/exercises/{EXERCISE}/submissions", student, 202, {"source": source}
        )
        if sub.get("queue") != "cpu":
            raise SmokeError(f"{rel} went to queue {sub.get('queue')!r}, expected cpu")
        pending[rel] = (sub["url"], verdict)
    start = time.monotonic()
    while pending:
        if time.monotonic() - start > timeout_s:
            raise SmokeError(f"not graded within {timeout_s:.0f} s: {sorted(pending)}")
        time.sleep(2)
        for rel, (url, verdict) in list(pending.items()):
            got = expect_json("GET", f"{base}{url}", student, 200)
            if got["status"] != "done":
                continue
            if got["verdict"] != verdict:
                raise SmokeError(f"{rel}: verdict {got['verdict']}, expected {verdict}: {got}")
            # The isolation that ran. Without the compose file's sandbox options (a seccomp
            # profile that allows user namespaces, Docker's /proc masks off) bubblewrap cannot
            # start in the container and the grader falls back to rlimits: a failure here,
            # since student code would then run without namespaces or a filesystem view.
            isolation = isolation_of(got)
            if not isolation.startswith("bwrap"):
                if not allow_rlimits:
                    raise SmokeError(
                        f"{rel} was graded without bubblewrap (isolation {isolation}); "
                        "see deploy/README.md, 'The sandbox in a container'"
                    )
                print(f"WARNING {rel}: graded without bubblewrap (isolation {isolation})")
            print(
                f"ok  exercise {EXERCISE} {rel}: {got['verdict']} on the CPU worker "
                f"after {time.monotonic() - start:.0f} s (isolation {isolation})"
            )
            del pending[rel]


def grades_csv(api: str, instructor: str, student_name: str, attempt_id: str, score: float) -> None:
    status, headers, raw = http("GET", f"{api}/quizzes/{QUIZ}/grades.csv", instructor)
    if status != 200 or not headers.get("Content-Type", "").startswith("text/csv"):
        raise SmokeError(f"grades.csv: {status} {headers.get('Content-Type')}")
    rows = list(csv.DictReader(io.StringIO(raw.decode())))
    mine = [r for r in rows if r["student"] == student_name]
    if len(mine) != 1 or mine[0]["best_attempt_id"] != attempt_id:
        raise SmokeError(f"grades.csv has no row for {student_name}'s attempt: {rows}")
    if float(mine[0]["best_score"]) != score:
        raise SmokeError(f"grades.csv best_score {mine[0]['best_score']}, expected {score}")
    print(f"ok  grades.csv: {len(rows)} row(s), {student_name} best_score {mine[0]['best_score']}")


def beat_runs_the_reaper(compose: Compose, timeout_s: float) -> None:
    """Celery beat (in the maint worker) sends the reaper, and the maint worker runs it."""
    deadline = time.monotonic() + timeout_s
    sent = done = None
    while time.monotonic() < deadline:
        logs = compose.logs("maint")
        sent = re.search(rf"Sending due task {REAP_ENTRY} \({re.escape(REAP_TASK)}\)", logs)
        done = re.findall(rf"Task {re.escape(REAP_TASK)}\[[^]]+\] succeeded in [^:]+: (.*)", logs)
        if sent and done:
            print(f"ok  beat: maint sent {REAP_ENTRY} and ran it {len(done)} time(s): {done[-1]}")
            return
        time.sleep(2)
    raise SmokeError(f"maint: beat sent the reaper: {bool(sent)}, ran it: {bool(done)}")


def reaper_requeues_a_killed_grading(
    compose: Compose, api: str, base: str, student: str, timeout_s: float, allow_rlimits: bool
) -> int:
    """SIGKILL the CPU worker container while it grades: the row stays `running` with no
    heartbeat, the reaper requeues it, and the restarted worker grades it once."""
    rel = "correct/stable_fp32.py"
    source = (SOLUTIONS / rel).read_text()
    sub = expect_json(
        "POST", f"{api}/exercises/{EXERCISE}/submissions", student, 202, {"source": source}
    )
    url = f"{base}{sub['url']}"
    deadline = time.monotonic() + timeout_s
    while expect_json("GET", url, student, 200)["status"] != "running":
        if time.monotonic() > deadline:
            raise SmokeError("the submission to be killed never started grading")
        time.sleep(0.3)
    started = time.monotonic()
    compose.run("kill", "-s", "SIGKILL", "worker-cpu")
    compose.run("start", "worker-cpu")
    phases = set()
    while True:
        got = expect_json("GET", url, student, 200)
        phases.add((got.get("progress") or {}).get("phase"))
        if got["status"] == "done":
            break
        if time.monotonic() > deadline:
            raise SmokeError(f"the killed grading was not redone in {timeout_s:.0f} s: {got}")
        time.sleep(1)
    if got["verdict"] != "PASS" or got["attempts"] != 2:
        raise SmokeError(f"after the kill: verdict {got['verdict']}, attempts {got['attempts']}")
    if not (allow_rlimits or isolation_of(got).startswith("bwrap")):
        raise SmokeError(f"the regrading ran without bubblewrap: {isolation_of(got)}")
    row = compose.exec(
        "postgres", "psql", "-U", "kgrade", "-d", "kgrade", "-tAc",
        f"SELECT status, attempts, stuck_requeues FROM submissions WHERE id = {sub['id']}",
    ).strip()  # fmt: skip
    if row != "done|2|1":
        raise SmokeError(f"submission {sub['id']} in the database: {row!r}, expected done|2|1")
    # The requeue came from the reaper that beat sent to maint (its result names the row).
    runs = re.findall(
        rf"Task {re.escape(REAP_TASK)}\[[^]]+\] succeeded in [^:]+: (.*)", compose.logs("maint")
    )
    mine = [r for r in runs if re.search(rf"'requeued': \[[^]]*\b{sub['id']}\b", r)]
    if not mine:
        raise SmokeError(f"no reaper run in maint's log requeued {sub['id']}: {runs[-3:]}")
    print(
        f"ok  reaper: worker-cpu SIGKILLed mid-grading; the job was requeued (phases seen: "
        f"{', '.join(sorted(p for p in phases if p))}) and graded once more, PASS after "
        f"{time.monotonic() - started:.0f} s (status|attempts|stuck_requeues = {row}); "
        f"maint's reaper run: {mine[0]}"
    )
    return int(sub["id"])


def _samples(text: str) -> dict[str, float]:
    """'name{labels}' -> value, from Prometheus's text format."""
    out = {}
    for line in text.splitlines():
        if line[:1].isalpha():
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def _total(samples: dict[str, float], name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        v for key, v in samples.items() if key.split("{")[0] == name and all(w in key for w in want)
    )


def scrape_metrics(base: str, compose: Compose, probes: int = 12) -> None:
    # gunicorn runs four workers: the count of our probes is whole only if every worker's
    # counts are summed (PROMETHEUS_MULTIPROC_DIR); one worker alone saw about a quarter.
    for _ in range(probes):
        if http("GET", f"{base}/healthz")[0] != 200:
            raise SmokeError("/healthz did not answer 200")
    status, _, raw = http("GET", f"{base}/metrics")
    if status != 200:
        raise SmokeError(f"/metrics: {status} {raw[:200]!r}")
    samples = _samples(raw.decode())
    names = sorted({k.split("{")[0] for k in samples})
    healthz = _total(samples, "kgrade_http_requests_total", endpoint="/healthz", status="200")
    if healthz < probes:
        raise SmokeError(f"/metrics counts {healthz:.0f} of our {probes} /healthz requests")
    for name in ("kgrade_queue_depth", "kgrade_stuck_job_requeues_total"):
        if name not in names:
            raise SmokeError(f"/metrics has no {name}: {names}")
    requeues = _total(samples, "kgrade_stuck_job_requeues_total")
    if requeues < 1:
        raise SmokeError(f"kgrade_stuck_job_requeues_total is {requeues}, expected >= 1")
    print(
        f"ok  API /metrics: {len(names)} series names; /healthz counted {healthz:.0f} "
        f"of {probes} (summed over gunicorn workers), kgrade_queue_depth, "
        f"kgrade_stuck_job_requeues_total {requeues:.0f}"
    )
    script = (
        f"import urllib.request; print(urllib.request.urlopen('{WORKER_METRICS}').read().decode())"
    )
    worker = _samples(compose.exec("worker-cpu", "python", "-c", script))
    verdicts = {
        k.split('verdict="')[1].split('"')[0]: v
        for k, v in worker.items()
        if k.startswith("kgrade_verdicts_total{")
    }
    graded = _total(worker, "kgrade_grading_duration_seconds_count")
    if not verdicts or graded < 1:
        raise SmokeError(f"worker-cpu :9100/metrics: verdicts {verdicts}, gradings {graded}")
    print(
        f"ok  worker-cpu /metrics (:9100, inside the network): {graded:.0f} grading(s), "
        f"verdicts {verdicts}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--api", default="http://127.0.0.1:8000", help="the API's base URL")
    ap.add_argument(
        "--compose", required=True, help="the stack's compose command (docker compose -p .. -f ..)"
    )
    ap.add_argument("--ready-timeout", type=float, default=180)
    ap.add_argument("--grade-timeout", type=float, default=300)
    ap.add_argument(
        "--allow-rlimits",
        action="store_true",
        help="accept gradings without bubblewrap (a warning instead of a failure)",
    )
    args = ap.parse_args(argv)
    base = args.api.rstrip("/")
    api = f"{base}/api/v1"
    suffix = str(int(time.time()))  # a rerun against the same volumes makes new users
    try:
        wait_until_ready(base, args.ready_timeout)
        print("ok  /readyz: database and broker reachable")
        compose = Compose(args.compose)
        prof = make_token(compose, "instructor", f"prof-{suffix}")
        name = f"ada-{suffix}"
        ada = make_token(compose, "student", name)
        who = expect_json("GET", f"{api}/whoami", ada, 200)
        if who.get("name") != name or who.get("role") != "student":
            raise SmokeError(f"whoami: {who}")
        quizzes = {q["id"] for q in expect_json("GET", f"{api}/quizzes", ada, 200)}
        if QUIZ not in quizzes:
            raise SmokeError(f"{QUIZ} not imported by the migrate job: {sorted(quizzes)}")
        print(f"ok  tokens (kgrade token create in the API container), {len(quizzes)} quizzes")
        attempt_id, score = take_quiz(api, ada, prof)
        grade_exercise(api, base, ada, args.grade_timeout, args.allow_rlimits)
        grades_csv(api, prof, name, attempt_id, score)
        beat_runs_the_reaper(compose, args.grade_timeout)
        reaper_requeues_a_killed_grading(
            compose, api, base, ada, args.grade_timeout, args.allow_rlimits
        )
        scrape_metrics(base, compose)
    except (SmokeError, OSError, KeyError, ValueError, subprocess.TimeoutExpired) as err:
        print(f"FAIL {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print("smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
