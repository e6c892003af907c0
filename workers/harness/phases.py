"""The import and tests phases of a job (grader spec §4), in the order ``grade`` runs them; the
benchmark phase is ``bench.py``. Each phase has its own wall-clock budget from the exercise
(``import_s``, ``tests_s``) and ends the job with a ``Failure`` as soon as anything fails: a
failing test stops the grading there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from workers.harness.channel import validate_called
from workers.harness.failure import Failure, error_verdict, fmt_err
from workers.harness.job import REPO, Job
from workers.results import TestResult, cap_text
from workers.verdicts import Verdict


def import_submission(job: Job, before: Callable[[float], None] | None = None) -> None:
    """The import phase: every rank says hello (and joins the process group), ``before`` runs
    with the phase's deadline while the runner is still ours alone, then the module is imported.
    """
    deadline = time.monotonic() + job.ex.limits["import_s"]
    job.recv_all(deadline, "start-up")  # hello from every rank
    if job.world > 1:
        job.send_all([{"t": "init_dist"}] * job.world, "process group")
        for m in job.recv_all(deadline, "process group"):
            if not m.get("ok"):
                raise Failure(Verdict.INFRA_ERROR, f"process group init failed: {m.get('error')}")
    if before is not None:
        before(deadline)
    deny = [] if job.trusted else list(job.ex.forbidden_imports)
    msg = {
        "t": "import",
        "path": str(job.root / "sub" / "submission.py"),
        "entry": job.ex.entry,
        "deny": deny,
    }
    if job.trusted:
        msg["path_extra"] = str(REPO)
    job.send_all([msg] * job.world, "import")
    for m in job.recv_all(deadline, "import"):
        if m.get("t") != "imported" or not isinstance(m.get("ok"), bool):
            raise Failure(Verdict.INTEGRITY_VIOLATION, "runner message: import reply")
        hits = m.get("hits") or []
        if hits:
            raise Failure(
                Verdict.POLICY_VIOLATION, f"forbidden import: {sorted(set(map(str, hits)))}"
            )
        if not m["ok"]:
            err = m.get("error") or {}
            raise Failure(error_verdict(err), "import failed: " + fmt_err(err))
    job.report("import", 1, 1)


def run_tests(
    job: Job, plan: dict[str, Any], tests: list[TestResult], cost: dict[str, float] | None = None
) -> None:
    """The tests phase: each case of the checker's plan called on every rank and judged by the
    checker, its result appended to ``tests``; the first failure is raised (a hidden case's
    message says only which case failed and its verdict). The checker makes case i+1 (inputs,
    fp64 gold) while the runner calls case i. ``cost`` gets the seconds the phase waited on
    each: ``make_s`` (the checker's next case), ``call_s`` (the runner), ``check_s``."""
    deadline = time.monotonic() + job.ex.limits["tests_s"]
    checker = job.checker
    assert checker
    cost = {} if cost is None else cost
    for k in ("make_s", "call_s", "check_s"):
        cost.setdefault(k, 0.0)
    n_cases = len(plan["cases"])
    job.report("tests", 0, n_cases)
    t0 = time.monotonic()
    spec = checker.ask({"op": "case", "i": 0}) if n_cases else {}
    cost["make_s"] += time.monotonic() - t0
    for i, case in enumerate(plan["cases"]):
        cid = f"c{i}"
        msgs = [{"t": "call", "id": cid, "profile": True, **r} for r in spec["ranks"]]
        job.send_all(msgs, "tests")
        if i + 1 < n_cases:
            checker.send({"op": "case", "i": i + 1})
        t0 = time.monotonic()
        results = job.recv_all(deadline, "tests")
        t1 = time.monotonic()
        if i + 1 < n_cases:
            spec = checker.reply()
        t2 = time.monotonic()
        cost["call_s"] += t1 - t0
        cost["make_s"] += t2 - t1
        failure: Failure | None = None
        for r, (m, sent) in enumerate(zip(results, msgs, strict=True)):
            validate_called(m, cid, len(sent["outputs"]))
            pre = f"rank {r}: " if job.world > 1 else ""
            if m.get("tamper"):
                failure = Failure(
                    Verdict.INTEGRITY_VIOLATION, f"{pre}harness state modified: {m['tamper']}"
                )
            elif not m["ok"]:
                failure = Failure(
                    error_verdict(m.get("error") or {}), pre + fmt_err(m.get("error") or {})
                )
            if failure:
                break
        if failure is None:
            rep = checker.ask({"op": "check", "i": i, "results": results})
            cost["check_s"] += time.monotonic() - t2
            if rep.get("verdict"):
                failure = Failure(Verdict(rep["verdict"]), rep.get("message", ""))
        visible_msg = "" if failure is None else failure.message
        tests.append(
            TestResult(
                case["name"],
                0.0,
                failure is None,
                cap_text(visible_msg, 2000),
                case["visibility"],
                failure.verdict.value if failure else Verdict.PASS.value,
            )
        )
        job.report("tests", i + 1, n_cases)  # a count only: hidden case names stay here
        if failure:
            if case["visibility"] == "hidden":
                # the student-facing message must not describe the hidden case
                failure.message = f"hidden test {case['name']} failed ({failure.verdict.value})"
            raise failure
