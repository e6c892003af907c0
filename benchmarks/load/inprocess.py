"""Quiz traffic in-process: the app's own CPU per request, without gunicorn, client or network.

    .venv/bin/python benchmarks/load/inprocess.py                      # SQLite, then PostgreSQL
    .venv/bin/python benchmarks/load/inprocess.py --before HEAD~3 --rounds 3
    .venv/bin/python benchmarks/load/inprocess.py --db sqlite --profile /tmp/prof

The same flow as ``locustfile.py`` (start, 8 answers, submit) sent straight to the WSGI app in
one thread, each call timed with ``time.thread_time``: the CPU the app spends on a request,
database driver included (not the database server's own work). Under load that figure moves
far less than requests/s when other jobs share the machine, so it is the one to decide a
change by. Each measurement is a fresh process on a fresh database (``run_load.prepare``);
``--before REF`` alternates it with the code at REF (a git worktree), ``--rounds`` times.
The table gives the cheapest batch of ``--batch`` attempts of each process (the batch least
disturbed by other jobs) and each request kind's CPU in that process's median batch; the bare
Flask app of ``run_load.py`` runs through the same harness for scale.

``--profile DIR`` runs the current code once more per database under cProfile on the thread's
CPU clock (the waits for the database server left out; the profile slows the code down: its
times are shares, not costs) and writes ``DIR/<db>.prof``, printing the functions with the most
own time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
QUIZ = "ring-attention-quiz"
#: The database this harness makes on the PostgreSQL server (not run_load's: both may run).
INPROCESS_DB = "kgrade_inprocess"
KINDS = ("start", "answer", "submit")

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Any]


def _environ(method: str, path: str, token: str, body: dict[str, Any] | None) -> dict[str, Any]:
    """What gunicorn hands the app for a JSON request from the Locust client."""
    raw = json.dumps(body).encode() if body is not None else b""
    return {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": "application/json" if body is not None else "",
        "CONTENT_LENGTH": str(len(raw)),
        "HTTP_HOST": "127.0.0.1:8000",
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        "HTTP_USER_AGENT": "kgrade-inprocess",
        "HTTP_ACCEPT": "*/*",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(raw),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }


def _call(app: Wsgi, environ: dict[str, Any], expect: int) -> tuple[float, bytes]:
    """(thread CPU seconds of the call, the body); a status other than ``expect`` is an error."""
    status: list[str] = []

    def start_response(s: str, _headers: Any, _exc: Any = None) -> None:
        status.append(s)

    t0 = time.thread_time()
    result = app(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        if hasattr(result, "close"):
            result.close()
    cpu = time.thread_time() - t0
    if int(status[0].split()[0]) != expect:
        raise SystemExit(f"{environ['PATH_INFO']}: {status[0]} {body[:300]!r}")
    return cpu, body


def attempt(app: Wsgi, token: str, cpu: dict[str, list[float]]) -> None:
    """One attempt as the Locust user makes it, each request's CPU appended to ``cpu``."""
    t, body = _call(
        app, _environ("POST", f"/api/v1/quizzes/{QUIZ}/attempts", token, {"lang": "en"}), 201
    )
    cpu["start"].append(t)
    att = json.loads(body)
    for item in att["items"]:
        answer = {"item_id": item["id"], "answer": [random.choice(item["options"])["id"]]}
        path = f"/api/v1/attempts/{att['id']}/responses"
        cpu["answer"].append(_call(app, _environ("POST", path, token, answer), 201)[0])
    path = f"/api/v1/attempts/{att['id']}/submit"
    cpu["submit"].append(_call(app, _environ("POST", path, token, None), 200)[0])


def run(app: Wsgi, tokens: Iterator[str], attempts: int, batch: int) -> dict[str, Any]:
    """``attempts`` attempts in batches; per batch the CPU per request and per kind."""
    batches = []
    for _ in range(attempts // batch):
        cpu: dict[str, list[float]] = {k: [] for k in KINDS}
        for _ in range(batch):
            attempt(app, next(tokens), cpu)
        requests = sum(len(v) for v in cpu.values())
        batches.append(
            {
                "ms_per_request": 1000 * sum(sum(v) for v in cpu.values()) / requests,
                **{k: 1000 * statistics.fmean(v) for k, v in cpu.items()},
            }
        )
    return {"batches": batches}


@contextlib.contextmanager
def database(db: str, folder: Path, students: int) -> Iterator[tuple[str, list[str]]]:
    """A fresh database with the item bank and ``students`` tokens: (its URL, the tokens)."""
    import run_load

    if db == "sqlite":
        url = f"sqlite:///{folder / 'inprocess.sqlite3'}"
    else:
        server = os.environ.get("KGRADE_TEST_DATABASE_URL")
        if not server:
            raise SystemExit("--db postgres needs $KGRADE_TEST_DATABASE_URL")
        url = run_load.fresh_postgres(server, INPROCESS_DB)
    tokens_file = folder / "tokens.txt"
    try:
        run_load.prepare(url, students, tokens_file)
        yield url, tokens_file.read_text().split()
    finally:
        if db == "postgres":
            run_load.drop_postgres(server, INPROCESS_DB)


def child(db: str, attempts: int, batch: int, profile: Path | None) -> None:
    """Measure the code on ``sys.path`` (``KGRADE_LOAD_ROOT``) and print the result as JSON."""
    warmup = min(attempts, 2 * batch)
    with contextlib.ExitStack() as stack:
        if db == "bare":
            app, names = _bare(), ["kgr_bare"]
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            # a student has three attempts of a quiz: enough students for every attempt made
            url, names = stack.enter_context(database(db, tmp, (warmup + attempts) // 3 + 1))
            os.environ.update(DATABASE_URL=url, KGRADE_IMPORT_BANK="0")
            from service import create_app

            app = create_app()
        tokens = itertools.cycle(names)
        run(app, tokens, warmup, batch)  # warm-up: caches, pools, lazy imports
        if profile is None:
            print(json.dumps(run(app, tokens, attempts, batch)))
            return
        import cProfile
        import pstats

        prof = cProfile.Profile(time.thread_time)  # CPU, not the waits for the database
        prof.enable()
        run(app, tokens, attempts, batch)
        prof.disable()
        prof.dump_stats(profile)
        pstats.Stats(str(profile), stream=sys.stderr).sort_stats("tottime").print_stats(40)
        print(json.dumps({"batches": []}))


def _bare() -> Wsgi:
    sys.path.insert(0, str(HERE))
    import bare_app

    return bare_app.create_app()


def measure(root: Path, db: str, args: argparse.Namespace, profile: Path | None = None) -> Any:
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{HERE}", KGRADE_LOAD_ROOT=str(root))
    argv = [sys.executable, __file__, "--child", db, str(args.attempts), str(args.batch)]
    argv += [str(profile)] if profile else []
    out = subprocess.run(argv, env=env, cwd=root, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(result: dict[str, Any]) -> str:
    batches = result["batches"]
    cheapest = min(b["ms_per_request"] for b in batches)
    median = sorted(batches, key=lambda b: b["ms_per_request"])[len(batches) // 2]
    kinds = " / ".join(f"{median[k]:.3f}" for k in KINDS)
    return f"{cheapest:.3f} | {median['ms_per_request']:.3f} | {kinds}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db", action="append", choices=["sqlite", "postgres"])
    p.add_argument("--attempts", type=int, default=500, help="measured attempts per process")
    p.add_argument("--batch", type=int, default=25, help="attempts per timed batch")
    p.add_argument("--rounds", type=int, default=1, help="processes per code and database")
    p.add_argument("--before", metavar="REF", help="alternate with the code at git REF")
    p.add_argument("--no-bare", action="store_true", help="leave out the bare Flask app")
    p.add_argument("--profile", type=Path, metavar="DIR", help="cProfile the current code too")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:  # the process that measures: db, attempts, batch[, profile file]
        db, attempts, batch, *prof = args.child
        child(db, int(attempts), int(batch), Path(prof[0]) if prof else None)
        return
    dbs = args.db or (["sqlite", "postgres"] if os.environ.get("KGRADE_TEST_DATABASE_URL") else [])
    dbs = dbs or ["sqlite"]
    import run_load

    with contextlib.ExitStack() as stack:
        trees = [("now", ROOT)]
        if args.before:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kgrade-inproc-")))
            tree = stack.enter_context(run_load.worktree(args.before, tmp / "before"))
            trees.insert(0, (f"@{args.before}", tree))
        print(
            "| code | database | cheapest batch, ms CPU/request | median batch | "
            "start / answer / submit, ms (median batch) |"
        )
        print("|---|---|---|---|---|")
        for _ in range(args.rounds):
            for db in dbs:
                for label, root in trees:
                    print(f"| {label} | {db} | {summary(measure(root, db, args))} |", flush=True)
        if not args.no_bare:
            print(f"| bare Flask | - | {summary(measure(ROOT, 'bare', args))} |", flush=True)
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            for db in dbs:
                measure(ROOT, db, args, args.profile / f"{db}.prof")


if __name__ == "__main__":
    main()
