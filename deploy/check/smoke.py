"""Smoke test of a running kgrade stack, as a new course would use it (stdlib only).

Run by deploy/check/run.sh against the compose stack: tokens made with the CLI inside the API
container, a quiz attempt with immediate feedback, a kernel exercise graded on the CPU worker
through Redis, the quiz's grades CSV, and a /metrics scrape. Each step prints one line; the
first failure stops the run with exit status 1 and says what was expected.

    python3 deploy/check/smoke.py --api http://127.0.0.1:8000 \
        --exec "docker compose -p kgrade-check -f deploy/docker-compose.yml exec -T api"
"""

from __future__ import annotations

import argparse
import csv
import io
import json
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


def make_token(exec_prefix: str, role: str, name: str) -> str:
    cmd = [*shlex.split(exec_prefix), "kgrade", "token", "create", "--role", role, "--name", name]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SmokeError(f"kgrade token create failed ({out.returncode}): {out.stderr[-500:]}")
    return out.stdout.strip().splitlines()[-1]


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


def grade_exercise(api: str, base: str, student: str, timeout_s: float) -> None:
    """Submit known solutions; each must be graded by the CPU worker with its known verdict."""
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
            # The isolation that ran: under Docker's masked /proc bubblewrap cannot mount its
            # own, and the grader falls back (docs/deploy-check.md). Said loudly, not hidden.
            isolation = ((got.get("result") or {}).get("kgrade") or {}).get("isolation")
            if not str(isolation).startswith("bwrap"):
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


def scrape_metrics(base: str) -> None:
    status, _, raw = http("GET", f"{base}/metrics")
    if status != 200:
        raise SmokeError(f"/metrics: {status} {raw[:200]!r}")
    names = sorted(
        {ln.split("{")[0].split()[0] for ln in raw.decode().splitlines() if ln[:1].isalpha()}
    )
    if not names:
        raise SmokeError("/metrics answered 200 with no samples")
    shown = [n for n in names if n.startswith("kgrade")][:6] or names[:6]
    print(f"ok  /metrics: {len(names)} series names, e.g. {', '.join(shown)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--api", default="http://127.0.0.1:8000", help="the API's base URL")
    ap.add_argument("--exec", required=True, help="command prefix that runs a command in the API")
    ap.add_argument("--ready-timeout", type=float, default=180)
    ap.add_argument("--grade-timeout", type=float, default=300)
    args = ap.parse_args(argv)
    base = args.api.rstrip("/")
    api = f"{base}/api/v1"
    suffix = str(int(time.time()))  # a rerun against the same volumes makes new users
    try:
        wait_until_ready(base, args.ready_timeout)
        print("ok  /readyz: database and broker reachable")
        prof = make_token(args.exec, "instructor", f"prof-{suffix}")
        name = f"ada-{suffix}"
        ada = make_token(args.exec, "student", name)
        who = expect_json("GET", f"{api}/whoami", ada, 200)
        if who.get("name") != name or who.get("role") != "student":
            raise SmokeError(f"whoami: {who}")
        quizzes = {q["id"] for q in expect_json("GET", f"{api}/quizzes", ada, 200)}
        if QUIZ not in quizzes:
            raise SmokeError(f"{QUIZ} not imported by the migrate job: {sorted(quizzes)}")
        print(f"ok  tokens (kgrade token create in the API container), {len(quizzes)} quizzes")
        attempt_id, score = take_quiz(api, ada, prof)
        grade_exercise(api, base, ada, args.grade_timeout)
        grades_csv(api, prof, name, attempt_id, score)
        scrape_metrics(base)
    except (SmokeError, OSError, KeyError, ValueError) as err:
        print(f"FAIL {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print("smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
