"""Quiz traffic under load: kgrade's API under gunicorn against a bare Flask app, side by side.

    .venv/bin/pip install -e ".[bench]"   # locust, the load generator (an extra, not a dependency)
    .venv/bin/python benchmarks/load/run_load.py                 # SQLite, then PostgreSQL
    .venv/bin/python benchmarks/load/run_load.py --db sqlite --seconds 20

For each database it builds a fresh one (migrated, item bank imported, students with tokens),
starts the API with ``kgrade serve``'s own gunicorn command line (same config, worker class,
workers and threads), drives it with headless Locust (``locustfile.py``: start, 8 answers,
submit), then does the same against ``bare_app.py`` under the same gunicorn command, and prints
one table: requests/s, attempts/s, p50/p95/p99 and failures, kgrade's share of the bare
app's rate, and the machine's idle and stolen CPU during each measured run (a run with much
idle was not saturated; steal is a busy neighbour on a VM), and the CPU a request cost each
part during it: the gunicorn processes (server), PostgreSQL's server processes (database) and
Locust (client, its start of about a second of CPU included: 0.05 ms a request in a 20 s run),
read from ``/proc`` (Linux). Those move far less than the rate when the machine's speed does,
so they are what a before/after comparison reads first. Client and server share this machine,
as they did when the issue was measured. ``--rounds N`` measures every target N times in turn
and ends with each one's median round: single runs minutes apart moved by 15 % here.

PostgreSQL: ``--postgres-url`` (default: ``$KGRADE_TEST_DATABASE_URL``, what ``make services``
starts); the run creates and drops its own database ``kgrade_load`` on that server.

``--server granian`` (repeatable with ``--server gunicorn``) serves the same apps under Granian's
WSGI interface instead (a server whose HTTP handling is compiled Rust; ``pip install granian``,
not a dependency), with the same workers, threads and access log, to weigh what the server
itself costs a request: each kgrade row is compared with the bare app under its own server.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# the code under test: this checkout, or the --before worktree in the --prepare child
sys.path.insert(0, os.environ.get("KGRADE_LOAD_ROOT", str(ROOT)))

LOAD_DB = "kgrade_load"


@dataclass
class Row:
    target: str
    rps: float
    attempts_s: float
    p50: float
    p95: float
    p99: float
    requests: int
    failures: int
    idle: float = float("nan")  # share of the machine's CPU idle during the measured run
    steal: float = float("nan")  # share taken by the host (a busy neighbour on a VM)
    #: CPU ms a request cost the gunicorn processes, PostgreSQL's server and Locust
    server_ms: float = float("nan")
    db_ms: float = float("nan")
    client_ms: float = float("nan")


def cpu_times() -> list[int]:
    """The machine's CPU counters from ``/proc/stat`` (user ... steal), or [] elsewhere."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return []


def shares(before: list[int], after: list[int]) -> tuple[float, float]:
    """Idle (idle + iowait) and steal shares of the CPU time between two ``cpu_times``."""
    if len(before) < 8 or len(after) < 8:
        return float("nan"), float("nan")
    d = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(d) or 1
    return (d[3] + d[4]) / total, d[7] / total


def group_cpu(root_pid: int | None) -> tuple[float, float]:
    """CPU seconds so far of the process tree under ``root_pid`` (gunicorn and its workers)
    and of every ``postgres`` process on this machine (the database server's); (nan, nan)
    without ``/proc``."""
    from workers.harness.procs import cpu_seconds, tree_pids

    if not os.path.isdir("/proc"):
        return float("nan"), float("nan")
    server = cpu_seconds(tree_pids(root_pid)) if root_pid is not None else 0.0
    return server, cpu_seconds(p for p in _pids() if _comm(p) == "postgres")


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # gone meanwhile
        return None


def children_cpu() -> float:
    """CPU seconds of this process's reaped children (a finished Locust run among them)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def median_rows(rounds: list[list[Row]]) -> list[Row]:
    """Per target, the round with the median rate (a real run's row, its latencies with it)."""
    out = []
    for runs in zip(*rounds, strict=True):
        ranked = sorted(runs, key=lambda r: r.rps)
        out.append(ranked[(len(ranked) - 1) // 2])
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _admin(url: str, *statements: str) -> None:
    """Run ``statements`` on the server of ``url``, connected to its ``postgres`` database."""
    import psycopg
    from sqlalchemy.engine import make_url

    admin = make_url(url).set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)


def fresh_postgres(url: str, name: str = LOAD_DB) -> str:
    """A new empty database ``name`` on the server of ``url``; its URL."""
    from sqlalchemy.engine import make_url

    _admin(url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}")
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def drop_postgres(url: str, name: str = LOAD_DB) -> None:
    _admin(url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def worktree(ref: str, tree: Path) -> Iterator[Path]:
    """The code at git ``ref`` checked out at ``tree`` (a detached worktree) for the block."""
    git = ["git", "-C", str(ROOT), "worktree"]
    subprocess.run([*git, "add", "--detach", str(tree), ref], check=True, capture_output=True)
    try:
        yield tree
    finally:
        subprocess.run([*git, "remove", "--force", str(tree)], check=False)


def prepare(url: str, students: int, tokens_file: Path) -> None:
    """Migrate, import the item bank, and give ``students`` students a token each."""
    from sqlalchemy.orm import Session

    from service.auth import create_token
    from service.cli.db import upgrade_and_import
    from service.db import load_models, make_engine, write_intent

    upgrade_and_import(url)
    load_models()
    engine = make_engine(url)
    tokens = []
    try:
        with write_intent(), Session(engine) as session:
            for i in range(students):
                _, plaintext = create_token(session, role="student", name=f"load-student-{i}")
                tokens.append(plaintext)
            session.commit()
    finally:
        engine.dispose()
    tokens_file.write_text("\n".join(tokens) + "\n")


SERVERS = ("gunicorn", "granian")


def server_argv(server: str, app: str, port: int, args: argparse.Namespace) -> list[str]:
    """``app`` (a ``module:factory()`` target) under ``server``: ``kgrade serve``'s gunicorn
    command line, or Granian's WSGI interface with the same workers, threads and access log
    (an access log is part of a request's cost in production)."""
    if server == "gunicorn":
        from service.cli.serve import gunicorn_argv

        argv = gunicorn_argv("127.0.0.1", port, args.workers, args.threads, 60)
        argv[-1] = app
        return argv
    return [
        str(Path(sys.executable).with_name("granian")),
        *("--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port)),
        *("--workers", str(args.workers), "--blocking-threads", str(args.threads)),
        *("--factory", "--access-log", app.removesuffix("()")),
    ]


@contextlib.contextmanager
def serving(
    server: str,
    app: str,
    port: int,
    env: dict[str, str],
    args: argparse.Namespace,
    cwd: Path = ROOT,
) -> Iterator[int]:
    """``app`` served on ``port`` until the block ends; yields the server's pid."""
    argv = server_argv(server, app, port, args)
    if server != "gunicorn" and env.get("PROMETHEUS_MULTIPROC_DIR"):
        from service.cli.gunicorn_conf import empty_multiproc_dir

        empty_multiproc_dir(env["PROMETHEUS_MULTIPROC_DIR"])  # gunicorn's on_starting does it
    log = open(args.out / f"{server}-{port}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{server} for {app} exited; see {log.name}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except urllib.error.HTTPError:
                break  # any HTTP answer: it is listening
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{server} for {app} did not start; see {log.name}") from None
                time.sleep(0.2)
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def locust(
    port: int, name: str, env: dict[str, str], args: argparse.Namespace, server_pid: int | None
) -> Row:
    prefix = args.out / name

    def cmd(seconds: int, csv_prefix: str) -> list[str]:
        return [
            str(Path(sys.executable).with_name("locust")),
            *("-f", str(HERE / "locustfile.py"), "--headless", "--only-summary"),
            *("-u", str(args.users), "-r", str(args.users), "-t", f"{seconds}s"),
            *("--host", f"http://127.0.0.1:{port}", "--csv", csv_prefix, "--loglevel", "WARNING"),
        ]

    # a warm-up first (caches, connection pools, lazy imports), not counted
    subprocess.run(cmd(args.warmup, f"{prefix}-warmup"), env=env, cwd=ROOT, capture_output=True)
    t0, (server0, db0), client0 = cpu_times(), group_cpu(server_pid), children_cpu()
    out = subprocess.run(cmd(args.seconds, str(prefix)), env=env, cwd=ROOT, capture_output=True)
    idle, steal = shares(t0, cpu_times())
    (server1, db1), client1 = group_cpu(server_pid), children_cpu()
    (args.out / f"{name}-locust.log").write_bytes(out.stdout + out.stderr)
    with open(f"{prefix}_stats.csv") as f:
        rows = {r["Name"]: r for r in csv.DictReader(f)}
    agg, submit = rows["Aggregated"], rows.get("submit") or {}
    per_request = 1000.0 / max(1, int(agg["Request Count"]))
    return Row(
        target=name,
        rps=float(agg["Requests/s"]),
        attempts_s=float(submit.get("Requests/s") or 0.0),
        p50=float(agg["50%"]),
        p95=float(agg["95%"]),
        p99=float(agg["99%"]),
        requests=int(agg["Request Count"]),
        failures=int(agg["Failure Count"]),
        idle=idle,
        steal=steal,
        server_ms=(server1 - server0) * per_request,
        db_ms=(db1 - db0) * per_request,
        client_ms=(client1 - client0) * per_request,
    )


def run_kgrade(
    db: str, args: argparse.Namespace, root: Path = ROOT, label: str = "", server: str = "gunicorn"
) -> Row:
    """kgrade on ``db``, its code from ``root`` (this checkout, or a worktree of ``--before``)."""
    name = f"kgrade-{db}{label}{_on(server, args)}"
    if db == "sqlite":
        url = f"sqlite:///{args.out / f'{name}.sqlite3'}"
        Path(args.out / f"{name}.sqlite3").unlink(missing_ok=True)
    else:
        if not args.postgres_url:
            raise SystemExit("--db postgres needs --postgres-url or $KGRADE_TEST_DATABASE_URL")
        url = fresh_postgres(args.postgres_url)
    tokens = args.out / f"tokens-{name}.txt"
    code = dict(os.environ, PYTHONPATH=str(root), KGRADE_LOAD_ROOT=str(root))
    subprocess.run(
        [sys.executable, __file__, "--prepare", url, str(args.students), str(tokens)],
        env=code,
        cwd=root,
        check=True,
    )
    env = dict(code, DATABASE_URL=url, KGRADE_IMPORT_BANK="0")
    env.pop("REDIS_URL", None)
    if args.redis_url:
        env["REDIS_URL"] = args.redis_url  # the limiter's storage, as deployed
    env["PROMETHEUS_MULTIPROC_DIR"] = str(args.out / f"prom-{db}")
    env["KGRADE_LOAD_TOKENS"] = str(tokens)
    port = free_port()
    try:
        with serving(server, "service:create_app()", port, env, args, cwd=root) as pid:
            return locust(port, name, env, args, pid)
    finally:
        if db == "postgres":
            drop_postgres(args.postgres_url)


def run_bare(args: argparse.Namespace, server: str = "gunicorn") -> Row:
    tokens = args.out / "tokens-bare.txt"
    tokens.write_text("kgr_bare\n")
    env = dict(os.environ, KGRADE_LOAD_TOKENS=str(tokens), PYTHONPATH=str(HERE))
    port = free_port()
    with serving(server, "bare_app:create_app()", port, env, args) as pid:
        return locust(port, f"bare-flask{_on(server, args)}", env, args, pid)


def _on(server: str, args: argparse.Namespace) -> str:
    """The rows' server label, when a run compares servers (none for gunicorn alone)."""
    return f" on {server}" if args.server != ["gunicorn"] else ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db", action="append", choices=["sqlite", "postgres"])
    p.add_argument("--postgres-url", default=os.environ.get("KGRADE_TEST_DATABASE_URL"))
    p.add_argument("--redis-url", default=os.environ.get("KGRADE_TEST_REDIS_URL"))
    p.add_argument("--users", type=int, default=32, help="concurrent Locust users")
    p.add_argument("--seconds", type=int, default=30, help="measured run per target")
    p.add_argument("--warmup", type=int, default=5, help="unmeasured run before each")
    p.add_argument("--students", type=int, default=2000)
    from service.cli.serve import DEFAULT_THREADS, default_workers

    p.add_argument("--workers", type=int, default=default_workers(), help="as kgrade serve")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="as kgrade serve")
    p.add_argument("--out", type=Path, default=None, help="folder for CSVs and logs")
    p.add_argument(
        "--server",
        action="append",
        choices=SERVERS,
        help="WSGI server, repeatable (default gunicorn, as kgrade serve)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every target this many times, in turn, and end with each one's median round",
    )
    p.add_argument(
        "--before",
        metavar="REF",
        help="also measure kgrade at git REF (a worktree), in the same run, for before/after",
    )
    p.add_argument(
        "--prepare", nargs=3, metavar=("URL", "STUDENTS", "FILE"), help=argparse.SUPPRESS
    )
    args = p.parse_args()
    if args.prepare:  # the child that sets a database up with the code under test
        url, students, file = args.prepare
        prepare(url, int(students), Path(file))
        return
    args.db = args.db or (["sqlite", "postgres"] if args.postgres_url else ["sqlite"])
    args.server = args.server or ["gunicorn"]
    args.out = args.out or Path(tempfile.mkdtemp(prefix="kgrade-load-"))
    args.out.mkdir(parents=True, exist_ok=True)

    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    rounds = []
    for n in range(args.rounds):
        rows = []
        if args.before:
            with worktree(args.before, args.out / "before") as tree:
                rows += [run_kgrade(db, args, tree, f" @{args.before}") for db in args.db]
        for server in args.server:
            rows += [run_kgrade(db, args, server=server) for db in args.db]
            rows.append(run_bare(args, server))
        rounds.append(rows)
        if args.rounds > 1:
            print_table(rows, args, f"round {n + 1} of {args.rounds}")
    if args.rounds > 1:
        print_table(median_rows(rounds), args, f"median of {args.rounds} rounds, per target")
    else:
        print_table(rounds[0], args, "")


def print_table(rows: list[Row], args: argparse.Namespace, title: str) -> None:
    # each row against the bare app under the same server (rows run kgrade first, bare last)
    bares = [r for r in rows if r.target.startswith("bare-flask")]
    print(
        f"\n{title + ': ' if title else ''}{args.users} users, {args.seconds} s each, "
        f"{' and '.join(args.server)}, {args.workers} workers x {args.threads} threads, "
        f"{os.cpu_count()} CPUs (client "
        f"included); logs in {args.out}\n"
    )
    print(
        "| target | requests/s | attempts/s | p50 ms | p95 ms | p99 ms | requests | failures "
        "| of bare Flask | CPU idle / steal | CPU ms a request: server / database / client |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        bare = next(b for b in bares if b.target.removeprefix("bare-flask") in r.target)
        print(
            f"| {r.target} | {r.rps:.0f} | {r.attempts_s:.1f} | {r.p50:.0f} | {r.p95:.0f} | "
            f"{r.p99:.0f} | {r.requests} | {r.failures} | {r.rps / bare.rps:.2f} | "
            f"{100 * r.idle:.0f} / {100 * r.steal:.1f} % | "
            f"{r.server_ms:.2f} / {r.db_ms:.2f} / {r.client_ms:.2f} |"
        )


if __name__ == "__main__":
    main()
