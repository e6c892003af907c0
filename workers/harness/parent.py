"""The grading parent: one fresh process tree per job (grader spec §2).

``grade()`` is what the Celery task (and the CLI) calls. It never imports student code and never
touches CUDA itself: it starts a trusted checker process and a sandboxed runner, passes messages
between them over channels it created, validates every runner message against what it asked
for, enforces per-phase wall-clock budgets by killing the sandbox's whole process group, and
computes timing statistics from raw samples. Default verdict: failure.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from workers.exercises import Exercise, load_exercise
from workers.harness import timing
from workers.results import GradeResult, ShapeTiming, TestResult, cap_text
from workers.sandbox import Limits, Sandboxed, SandboxSpec, sandbox_uid
from workers.verdicts import Verdict

REPO = Path(__file__).resolve().parents[2]
#: A directory where trusted reference runs keep compiled Triton kernels between jobs.
REF_TRITON_CACHE_ENV = "KGRADE_REF_TRITON_CACHE"
RUNNER = Path(__file__).with_name("runner.py")
MAX_MSG = 1 << 20
# Reference timings per (exercise, shape, gpu, versions): the baseline is timed once per process
# (and optionally persisted) in its own trusted sandboxed process through this same harness.
_REF_CACHE: dict[str, Any] = {}
#: CI only: run the benchmark loop on CPU over each spec's tiny ``rehearsal_benchmark`` shapes,
#: timed by the wall clock. Exercises every step of the GPU path (multi-rank included) where CI
#: has no GPU; such speedups mean nothing and are marked ``details["rehearsal"]``.
REHEARSAL_ENV = "KGRADE_BENCH_REHEARSAL"
#: Jobs on one host take turns for their timed loops. Short calls are host-bound (Python
#: dispatching ops while the GPU waits), and another job's host work beside them (checked
#: calls: snapshots, regenerated inputs, comparisons) moved our merge reference by ±10 % in
#: stretches on the H200 pair. A path shared by the host's workers (a hostPath volume under
#: Kubernetes); "off" turns it off. Default: a file in the system's temp directory.
TIMING_LOCK_ENV = "KGRADE_TIMING_LOCK"
TIMING_TURN_MAX_WAIT_S = 600.0


@contextlib.contextmanager
def timing_turn() -> Iterator[float]:
    """Hold the host's timing lock for one shape's timed loop; yields the seconds waited.

    flock: the kernel drops it with the holder's last descriptor, so a killed job never
    leaves it held.
    """
    path = os.environ.get(TIMING_LOCK_ENV) or os.path.join(
        tempfile.gettempdir(), "kgrade-timing.lock"
    )
    if path == "off":
        yield 0.0
        return
    t0 = time.monotonic()
    # read-only is enough for flock: a node's lock file may belong to root (hostPath)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        # Bounded: a neighbour stuck in a call (up to its phase limit) must not push this job
        # past its task's time limit; past the bound the loop runs without its turn.
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - t0 > TIMING_TURN_MAX_WAIT_S:
                    break
                time.sleep(0.02)
        yield time.monotonic() - t0
    finally:
        os.close(fd)


#: Communication settings the operator's environment imposes on every GPU program, kept in the
#: otherwise clean job environment: e.g. NVLink multicast off on hosts whose GPUs are shared
#: (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).
OPERATOR_ENV_PREFIXES = ("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_")


def operator_comm_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(OPERATOR_ENV_PREFIXES)}


def job_gpus(world: int) -> tuple[list[int], dict[str, str]]:
    """The GPUs one job may use, as nvidia-smi indices, and the CUDA environment showing only them.

    ``KGRADE_GPUS`` lists the worker's GPUs (one worker per GPU, so jobs on neighbouring GPUs
    never share one); without it, ``CUDA_VISIBLE_DEVICES`` when it is a list of indices, else
    the first ``world`` GPUs. PCI bus order makes CUDA's numbering that of nvidia-smi and of the
    /dev/nvidiaN nodes the sandbox exposes; inside the job the GPUs are then 0..world-1.
    """
    want = max(1, world)
    spec = os.environ.get("KGRADE_GPUS") or os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    try:
        listed = [int(g) for g in spec.split(",") if g.strip()]
    except ValueError:  # GPU UUIDs or MIG names: keep CUDA's own view
        listed = []
    gpus = listed[:want] if listed else list(range(want))
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
    if spec and not listed:
        env["CUDA_VISIBLE_DEVICES"] = spec
    return gpus, env


#: ``progress(phase, done, total)``: phases ``import`` (0/1, 1/1), ``tests`` (cases finished of
#: all cases), ``benchmark`` (shapes timed of all shapes) and ``done`` (1/1), in that order, with
#: ``done`` never decreasing within a phase. Only fixed phase names and counts: nothing the
#: submission controls, and no case names (hidden cases stay undescribed).
ProgressFn = Callable[[str, int, int], None]


class Failure(Exception):
    """Ends grading with a verdict (raised anywhere inside a job)."""

    def __init__(self, verdict: Verdict, message: str) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.message = message


def harness_hash() -> str:
    """Hash of the harness code, recorded with every result (re-grade when it changes)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _secret(secret: bytes | None) -> bytes:
    if secret:
        return secret
    env = os.environ.get("KGRADE_GRADER_SECRET")
    if env:
        return env.encode()
    return secrets.token_bytes(32)  # no configured secret: a random one per run


# --------------------------------------------------------------------------- channels


class Channel:
    """JSON lines over a parent-created socket; every read has a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def send(self, obj: dict[str, Any]) -> None:
        try:
            self.sock.sendall((json.dumps(obj) + "\n").encode())
        except OSError as e:
            raise EOFError(str(e)) from e

    def recv(self, deadline: float) -> dict[str, Any]:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 1]
                try:
                    msg = json.loads(line)
                except ValueError as e:
                    raise Failure(Verdict.INTEGRITY_VIOLATION, "malformed runner message") from e
                if not isinstance(msg, dict):
                    raise Failure(Verdict.INTEGRITY_VIOLATION, "malformed runner message")
                return msg
            if len(self.buf) > MAX_MSG:
                raise Failure(Verdict.INTEGRITY_VIOLATION, "oversized runner message")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise
            except OSError as e:
                raise EOFError(str(e)) from e
            if not chunk:
                raise EOFError("runner closed the channel")
            self.buf += chunk


class CheckerProc:
    """The trusted checker: JSON lines over its stdin/stdout pipes."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "workers.harness.checker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=str(REPO),
            start_new_session=True,
            text=True,
        )

    def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError as e:
            raise Failure(Verdict.INFRA_ERROR, f"checker died: {e}") from e
        if not line:
            err = self.proc.stderr.read()[-3000:] if self.proc.stderr else ""
            raise Failure(Verdict.INFRA_ERROR, f"checker died: {err}")
        rep = json.loads(line)
        if not rep.get("ok"):
            raise Failure(
                Verdict.INFRA_ERROR, f"checker error: {rep.get('error')}\n{rep.get('tb', '')}"
            )
        return rep

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.ask({"op": "exit"})
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - clean-up must not mask the verdict
            self.proc.kill()


# --------------------------------------------------------------------------- message validation


def _validate_called(msg: dict[str, Any], call_id: str, n_out: int) -> None:
    """Schema of a runner 'called' message: every field typed and bounded, ids matching."""

    def need(c: bool, what: str) -> None:
        if not c:
            raise Failure(Verdict.INTEGRITY_VIOLATION, f"runner message: {what}")

    need(msg.get("t") == "called" and msg.get("id") == call_id, "unexpected message or id")
    need(isinstance(msg.get("ok"), bool), "ok flag")
    need(isinstance(msg.get("wall_ms"), int | float), "wall_ms")
    need(isinstance(msg.get("tamper", []), list), "tamper list")
    need(isinstance(msg.get("ops", {}), dict), "ops map")
    if msg["ok"]:
        outs = msg.get("outputs")
        need(isinstance(outs, list) and len(outs) == n_out, "outputs list")
        need(all(isinstance(o, dict) for o in outs), "output entries")
        need(isinstance(msg.get("inputs"), dict), "inputs map")
        for k in ("ev_stream_ms", "ev_sync_ms"):
            if k in msg:
                need(isinstance(msg[k], int | float) and msg[k] >= 0, k)


def _error_verdict(err: dict[str, Any]) -> Verdict:
    return Verdict.RESOURCE_LIMIT if err.get("kind") == "resource" else Verdict.RUNTIME_ERROR


def _fmt_err(err: dict[str, Any]) -> str:
    return f"{err.get('type', 'Error')}: {err.get('msg', '')}\n{err.get('tb', '')}"


# --------------------------------------------------------------------------- the job


@dataclass
class Job:
    ex: Exercise
    source: bytes
    device: str
    secret: bytes
    trusted: bool = False  # our reference: kernels visible, no import denylist
    isolation: str | None = None
    only_public: bool = False
    world: int = 1
    root: Path = field(default_factory=Path)
    chans: list[Channel] = field(default_factory=list)
    box: Sandboxed | None = None
    seccomp: bool = False  # the runner's syscall deny-list is installed
    checker: CheckerProc | None = None
    logs: str = ""
    prior_logs: str = ""  # a restarted runner's predecessor's
    marks: dict[str, float] = field(default_factory=dict)
    progress: ProgressFn | None = None

    def report(self, phase: str, done: int, total: int) -> None:
        """Tell the caller how far grading is; never affects the verdict."""
        self.marks.setdefault(phase, time.monotonic())  # when each phase began
        if self.progress is None:
            return
        # Progress is advisory (a closed events pipe, a database hiccup in the caller): a failing
        # reporter must neither fail the student nor turn a verdict into INFRA_ERROR, so its
        # errors are dropped here rather than reaching the verdict's try block.
        with contextlib.suppress(Exception):
            self.progress(phase, done, total)

    def setup(self) -> None:
        base = os.environ.get("KGRADE_JOB_ROOT") or None
        self.root = Path(tempfile.mkdtemp(prefix="kgrade-job-", dir=base))
        os.chmod(self.root, 0o711)
        uid = sandbox_uid()
        for sub in ("harness", "sub", "io", "out", "work"):
            (self.root / sub).mkdir()
            os.chmod(self.root / sub, 0o755)
        for sub in ("out", "work"):
            if uid is not None:
                os.chown(self.root / sub, uid, uid)
        shutil.copy(RUNNER, self.root / "harness" / "runner.py")
        os.chmod(self.root / "harness" / "runner.py", 0o444)
        (self.root / "sub" / "submission.py").write_bytes(self.source)
        os.chmod(self.root / "sub" / "submission.py", 0o444)
        (self.root / "work" / "tmp").mkdir()
        if uid is not None:
            os.chown(self.root / "work" / "tmp", uid, uid)

    def device_env(self) -> dict[str, str]:
        """What every process of the job inherits about devices: the operator's communication
        settings and, on CUDA, only this job's GPUs."""
        env = operator_comm_env()
        if self.device == "cuda":
            env.update(job_gpus(self.world)[1])
        return env

    def checker_env(self) -> dict[str, str]:
        keep = ("PATH", "LANG", "LD_LIBRARY_PATH", "CUDA_HOME", "HOME")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env.update(self.device_env())  # the gold runs on the job's own GPU, never a neighbour's
        pp = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(pp)
        env["OMP_NUM_THREADS"] = os.environ.get("KGRADE_CHECKER_THREADS", "2")
        return env

    def start_runner(self) -> None:
        pairs = [socket.socketpair() for _ in range(self.world)]
        child_fds = tuple(b.fileno() for _, b in pairs)
        for fd in child_fds:
            os.set_inheritable(fd, True)
        py = sys.executable
        argv = [
            py,
            "-I",
            "-P",
            str(self.root / "harness" / "runner.py"),
            "--device",
            self.device,
            "--job",
            str(self.root),
        ]
        if self.world > 1:
            port = 20000 + secrets.randbelow(40000)  # random rendezvous port per job
            # the collective timeout outlasts every phase: a deadlock is the phase's TIMEOUT
            dist_timeout = sum(self.ex.limits.values()) + 30
            argv += [
                "--fds",
                ",".join(map(str, child_fds)),
                "--world",
                str(self.world),
                "--port",
                str(port),
                "--dist-timeout",
                str(dist_timeout),
            ]
        else:
            argv += ["--fd", str(child_fds[0])]
        tmp = "/tmp" if (self.isolation or "") != "rlimits" else str(self.root / "work" / "tmp")
        rw = [self.root / "out", self.root / "work"]
        triton_cache = self.root / "work" / ".triton"
        shared_cache = os.environ.get(REF_TRITON_CACHE_ENV)
        if self.trusted and shared_cache:
            # Our reference may keep its compiled Triton kernels between jobs (grader spec §7: the
            # reference has its own cache); recompiling its autotune configs in every reference
            # run costs more GPU time than the timing itself. Untrusted jobs never see this dir.
            triton_cache = Path(shared_cache)
            triton_cache.mkdir(parents=True, exist_ok=True)
            triton_cache.chmod(0o1777)  # the runner drops to an unprivileged uid
            rw.append(triton_cache)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.root / "work"),
            "LANG": "C.UTF-8",
            "TMPDIR": tmp,
            "PYTHONDONTWRITEBYTECODE": "1",
            "TRITON_CACHE_DIR": str(triton_cache),
            "TORCHINDUCTOR_CACHE_DIR": f"{self.root}/work/.inductor",
            "TORCH_EXTENSIONS_DIR": f"{self.root}/work/.ext",
            "OMP_NUM_THREADS": os.environ.get("KGRADE_RUNNER_THREADS", "2"),
            "MASTER_ADDR": "127.0.0.1",
            "GLOO_SOCKET_IFNAME": "lo",
            "KINETO_LOG_LEVEL": "5",
        }
        if self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"  # Triton solutions run on CPU tensors (kernels spec §5)
        for k in ("LD_LIBRARY_PATH", "CUDA_HOME", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH"):
            if k in os.environ:
                env[k] = os.environ[k]
        env.update(self.device_env())
        ro = [self.root / "harness", self.root / "sub", self.root / "io"]
        if self.trusted:
            ro.append(REPO / "kernels")
        spec = SandboxSpec(
            cwd=self.root / "work",
            rw_paths=rw,
            ro_paths=ro,
            env=env,
            device=self.device,
            gpu_indices=job_gpus(self.world)[0],
            limits=Limits(),
            isolation=self.isolation,
        )
        try:
            self.box = Sandboxed(spec, argv, pass_fds=child_fds)
        finally:
            for _, b in pairs:
                b.close()
        self.isolation = self.box.isolation
        self.seccomp = self.box.seccomp
        self.chans = [Channel(a) for a, _ in pairs]

    def runner_gone(self, what: str) -> Failure:
        """Classify a vanished runner: output flood, signal, or crash."""
        box = self.box
        rc = box.wait(10) if box else None
        self.logs = box.logs() if box else ""
        if box and box.flooded:
            return Failure(Verdict.RESOURCE_LIMIT, "output cap exceeded (stdout/stderr flood)")
        sig = -rc if rc is not None and rc < 0 else (rc - 128 if rc and rc > 128 else 0)
        if sig in (24, 25):  # SIGXCPU, SIGXFSZ
            return Failure(Verdict.RESOURCE_LIMIT, f"{what}: resource limit (signal {sig})")
        if sig == 9:
            return Failure(Verdict.RESOURCE_LIMIT, f"{what}: killed (out of memory?)")
        return Failure(Verdict.RUNTIME_ERROR, f"{what}: the runner exited (status {rc})")

    def recv_all(self, deadline: float, phase: str) -> list[dict[str, Any]]:
        out = []
        for ch in self.chans:
            try:
                out.append(ch.recv(deadline))
            except TimeoutError:
                raise Failure(Verdict.TIMEOUT, f"{phase}: exceeded its time limit") from None
            except EOFError:
                raise self.runner_gone(phase) from None
        return out

    def send_all(self, msgs: list[dict[str, Any]], phase: str) -> None:
        for ch, m in zip(self.chans, msgs, strict=True):
            try:
                ch.send(m)
            except EOFError:
                raise self.runner_gone(phase) from None

    def stop_runner(self) -> str:
        """End the runner, its whole process group whatever happened, and return its logs;
        ``start_runner`` can then start a fresh one."""
        logs = ""
        try:
            for ch in self.chans:
                with contextlib.suppress(EOFError, OSError):
                    ch.send({"t": "bye"})
            if self.box:
                self.box.wait(3)
        finally:
            if self.box:
                self.box.kill()
                logs = self.box.logs()
            for ch in self.chans:
                ch.sock.close()
            self.chans, self.box = [], None
        return logs

    def close(self) -> None:
        try:
            logs = self.stop_runner()
            self.logs = self.logs or logs  # a vanished runner's were read already
        finally:
            if self.checker:
                self.checker.close()
            shutil.rmtree(self.root, ignore_errors=True)


def _versions() -> dict[str, Any]:
    v: dict[str, Any] = {"python": platform.python_version()}
    try:
        from importlib.metadata import version

        for p in ("torch", "triton"):
            try:
                v[p] = version(p)
            except Exception:  # noqa: BLE001
                v[p] = None
    except ImportError:
        pass
    return v


def _hardware(device: str, world: int = 1) -> dict[str, Any]:
    hw: dict[str, Any] = {
        "host_cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }
    if device == "cuda":
        # nvidia-smi, not torch: the parent must not create a CUDA context.
        try:
            out = (
                subprocess.run(
                    [
                        "nvidia-smi",
                        "-i",
                        ",".join(map(str, job_gpus(world)[0])),  # the job's GPUs only
                        "--query-gpu=name,driver_version,memory.total,"
                        "clocks.sm,clocks.mem,temperature.gpu,clocks_throttle_reasons.active",
                        "--format=csv,noheader",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
                .stdout.strip()
                .splitlines()
            )
            hw["gpus"] = out
        except (OSError, subprocess.SubprocessError):
            hw["gpus"] = []
    return hw


def grade(
    exercise_id: str,
    source: str | bytes,
    *,
    device: str = "cpu",
    secret: bytes | None = None,
    isolation: str | None = None,
    only_public: bool = False,
    trusted: bool = False,
    reference_timing: bool = True,
    limits: dict[str, float] | None = None,
    progress: ProgressFn | None = None,
) -> GradeResult:
    """Grade one submission of ``exercise_id`` in a fresh process tree; never raises for
    anything the submission does (its verdict says it), INFRA_ERROR for our own faults.

    ``progress(phase, done, total)``, if given, is called at each phase start, after each test
    case and after each benchmark shape (see ``ProgressFn``); its exceptions are ignored."""
    t0 = time.monotonic()
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    ex = load_exercise(exercise_id)
    if limits:  # per-phase wall-clock overrides (tests; staff re-runs)
        ex.limits.update({k: float(v) for k, v in limits.items()})
    src = source.encode() if isinstance(source, str) else bytes(source)
    run_id = secrets.token_hex(8)
    world = ex.world_size
    rehearsal = device == "cpu" and os.environ.get(REHEARSAL_ENV) == "1"
    if device == "cuda" and world > 1:
        world = int(os.environ.get("KGRADE_WORLD", world))
    job = Job(
        ex,
        src,
        device,
        _secret(secret),
        trusted=trusted,
        isolation=isolation,
        only_public=only_public,
        world=world,
        progress=progress,
    )
    res = GradeResult(
        exercise=exercise_id,
        verdict=Verdict.INFRA_ERROR,
        score=0.0,
        device=device,
        run_id=run_id,
        harness_hash=harness_hash(),
        versions=_versions(),
        hardware=_hardware(device, world),
    )
    tests: list[TestResult] = []
    plan: dict[str, Any] = {}
    try:
        # the import phase covers the job's start-up too (runner and checker start in parallel)
        job.report("import", 0, 1)
        job.setup()
        job.checker = CheckerProc(job.checker_env())
        job.start_runner()  # starts while the checker imports torch and draws the cases
        res.isolation = (job.isolation or "none") + ("+seccomp" if job.seccomp else "")
        plan = job.checker.ask(
            {
                "op": "init",
                "exercise": exercise_id,
                "secret": job.secret.hex(),
                "nonce": run_id,
                "device": device,
                "job": str(job.root),
                "world": world,
                "only_public": only_public,
                # our reference may use fused PyTorch attention (cuDNN blocks in the ring)
                "trusted": trusted,
                "rehearsal": rehearsal,
            }
        )
        _phase_import(job)
        _phase_tests(job, plan, tests)
        verdict = Verdict.PASS
        message = f"all {len(tests)} tests passed"
        if (device == "cuda" or rehearsal) and plan.get("bench") and not only_public:
            _phase_bench(job, plan, res, reference_timing)
            if rehearsal:
                res.details["rehearsal"] = True
            if res.speedup is not None:
                message += f"; speedup (geomean, clamped) {res.speedup:.3f}x"
        res.verdict = verdict
        res.output = message
    except Failure as f:
        res.verdict = f.verdict
        res.output = cap_text(f"{f.verdict.value}: {f.message}")
    except Exception as e:  # noqa: BLE001 - our bug: not charged to the student
        res.verdict = Verdict.INFRA_ERROR
        res.output = f"INFRA_ERROR: {type(e).__name__}: {e}"
    finally:
        try:
            job.close()
        except Exception as e:  # noqa: BLE001
            res.details["cleanup_error"] = repr(e)
    job.report("done", 1, 1)
    # seconds per phase reached (import covers the job's start-up), for operators
    seq = sorted(job.marks.items(), key=lambda kv: kv[1])
    res.details["phase_s"] = {a: round(tb - ta, 3) for (a, ta), (_, tb) in pairwise(seq)}
    res.logs = "\n".join(x for x in (job.prior_logs, job.logs) if x)
    # tests that never ran are reported as failed, so the list always covers every case
    names = {t.name for t in tests}
    for c in plan.get("cases", []):
        if c["name"] not in names:
            tests.append(
                TestResult(c["name"], 0.0, False, "not run", c["visibility"], res.verdict.value)
            )
    _score(ex, res, tests)
    res.tests = tests
    res.elapsed_s = time.monotonic() - t0
    return res


def _score(ex: Exercise, res: GradeResult, tests: list[TestResult]) -> None:
    sc = ex.scoring
    timed = res.speedup is not None
    cw = float(sc["correctness_weight"]) if timed else 1.0
    n = max(1, len(tests))
    for t in tests:
        t.max_points = cw / n
    if timed:
        tests.append(
            TestResult(
                "benchmark",
                float(sc["speed_weight"]),
                res.passed,
                f"speedup {res.speedup:.3f}x",
                "visible",
                res.verdict.value,
                points=_speed_points(ex, res.speedup) if res.passed else 0.0,
            )
        )
    res.score = _total(res, tests)


def _speed_points(ex: Exercise, speedup: float) -> float:
    sc = ex.scoring
    return float(sc["speed_weight"]) * min(1.0, speedup / float(sc["target"]))


def _total(res: GradeResult, tests: list[TestResult]) -> float:
    # gated on correctness: any failing verdict scores 0
    if not res.passed:
        return 0.0
    return sum((t.points if t.points is not None else t.max_points) for t in tests if t.passed)


def _rescore(ex: Exercise, res: GradeResult, speedup: float) -> None:
    """Score ``res`` (a PASS) at another speedup: the benchmark line and the total follow."""
    res.speedup = speedup
    for t in res.tests:
        if t.name == "benchmark":
            t.points = _speed_points(ex, speedup)
            t.output = f"speedup {speedup:.3f}x"
    res.score = _total(res, res.tests)


def confirm(ex: Exercise, first: GradeResult, second: GradeResult) -> GradeResult:
    """Combine a ranked-score candidate with its confirmation run (grader spec §6).

    A failing confirmation is the verdict (its hidden cases and seeds came from another
    secret: a submission tuned to one draw, or passing by luck, fails here). A passing one
    ranks the submission at the lower of the two speedups, so one lucky timing cannot lift it.
    """
    if not second.passed:
        second.output = f"confirmation run (new hidden cases and seeds): {second.output}"
        second.details["confirms_run"] = first.run_id
        second.elapsed_s += first.elapsed_s
        return second
    first.details["confirmation"] = {
        "run_id": second.run_id,
        "speedup": second.speedup,
        "timings": [
            {"name": t.name, "n": t.n, "median_ms": t.median_ms, "speedup": t.speedup}
            for t in second.timings
        ],
    }
    first.elapsed_s += second.elapsed_s
    if second.speedup is not None and first.speedup is not None:
        ranked = min(first.speedup, second.speedup)
        _rescore(ex, first, ranked)
        first.output += (
            f"; a second run with new hidden cases confirmed it ({second.speedup:.3f}x), "
            f"ranked at {ranked:.3f}x"
        )
    return first


def grade_ranked(
    exercise_id: str,
    source: str | bytes,
    *,
    progress: ProgressFn | None = None,
    **kwargs: Any,
) -> GradeResult:
    """``grade()``, plus a confirmation run when the result would be ranked (grader spec §6).

    A student submission that passes with a speedup is graded once more with another secret
    (new hidden cases, seeds and probes) before its score counts; see ``confirm``. Trusted
    reference runs are never ranked and run once. Progress: the first run's phases, then
    ``confirm-import``, ``confirm-tests``, ``confirm-benchmark``, and one ``done`` at the end.
    """

    def relay(prefix: str) -> ProgressFn:
        def report(phase: str, done: int, total: int) -> None:
            if progress is not None and phase != "done":
                progress(prefix + phase, done, total)

        return report

    first = grade(exercise_id, source, progress=relay(""), **kwargs)
    result = first
    if first.passed and first.speedup is not None and not kwargs.get("trusted"):
        again = {**kwargs, "secret": secrets.token_bytes(32)}
        second = grade(exercise_id, source, progress=relay("confirm-"), **again)
        result = confirm(load_exercise(exercise_id), first, second)
    if progress is not None:
        with contextlib.suppress(Exception):
            progress("done", 1, 1)
    return result


def _phase_import(job: Job) -> None:
    deadline = time.monotonic() + job.ex.limits["import_s"]
    job.recv_all(deadline, "start-up")  # hello from every rank
    if job.world > 1:
        job.send_all([{"t": "init_dist"}] * job.world, "process group")
        for m in job.recv_all(deadline, "process group"):
            if not m.get("ok"):
                raise Failure(Verdict.INFRA_ERROR, f"process group init failed: {m.get('error')}")
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
            raise Failure(_error_verdict(err), "import failed: " + _fmt_err(err))
    job.report("import", 1, 1)


def _phase_tests(job: Job, plan: dict[str, Any], tests: list[TestResult]) -> None:
    deadline = time.monotonic() + job.ex.limits["tests_s"]
    assert job.checker
    n_cases = len(plan["cases"])
    job.report("tests", 0, n_cases)
    for i, case in enumerate(plan["cases"]):
        spec = job.checker.ask({"op": "case", "i": i})
        cid = f"c{i}"
        msgs = [{"t": "call", "id": cid, "profile": True, **r} for r in spec["ranks"]]
        job.send_all(msgs, "tests")
        results = job.recv_all(deadline, "tests")
        failure: Failure | None = None
        for r, (m, sent) in enumerate(zip(results, msgs, strict=True)):
            _validate_called(m, cid, len(sent["outputs"]))
            pre = f"rank {r}: " if job.world > 1 else ""
            if m.get("tamper"):
                failure = Failure(
                    Verdict.INTEGRITY_VIOLATION, f"{pre}harness state modified: {m['tamper']}"
                )
            elif not m["ok"]:
                failure = Failure(
                    _error_verdict(m.get("error") or {}), pre + _fmt_err(m.get("error") or {})
                )
            if failure:
                break
        if failure is None:
            rep = job.checker.ask({"op": "check", "i": i, "results": results})
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


def _timed_call(
    job: Job,
    b: int,
    shape: dict[str, Any],
    tag: str,
    check: bool,
    deadline: float,
    cost: defaultdict[tuple[str, str], float] | None = None,
    write: bool | None = None,
) -> tuple[dict[str, Any], float]:
    """One timed call on fresh inputs (every rank at once); the runner's report and parent wall.

    With several ranks the report is the slowest rank's: a ring call ends when its last rank
    does. Rank 0's outputs are the ones a probe checks. ``write`` (default: ``check``) has the
    runner write its outputs and input digests as for a probe; unchecked, they are deleted.
    """
    write = check if write is None else write
    seed = secrets.randbits(62)
    msg = {
        "t": "call",
        "id": tag,
        "gens": shape["gens"],
        "seed": seed,
        "args": shape["args"],
        "kwargs": shape["kwargs"],
        "ret": shape["ret"],
        "flush": True,
        "defer_snapshot": True,
        "timed": True,
    }
    msgs = [
        {
            **msg,
            "outputs": [
                {**o, "path": f"out/{tag}_r{r}_{o['name']}.bin", "nbytes": 0}
                for o in shape["outputs"]
            ],
        }
        for r in range(job.world)
    ]
    w0 = time.perf_counter()
    job.send_all(msgs, "benchmark")
    reps = job.recv_all(deadline, "benchmark")
    wall = (time.perf_counter() - w0) * 1e3
    for m in reps:
        _validate_called(m, tag, len(shape["outputs"]))
        if m.get("tamper"):
            raise Failure(Verdict.INTEGRITY_VIOLATION, f"harness state modified: {m['tamper']}")
        if not m["ok"]:
            raise Failure(_error_verdict(m.get("error") or {}), _fmt_err(m.get("error") or {}))
    # The probe decision comes after the call returned: a probe is indistinguishable from a
    # plain timed call while it runs. Only a probe's snapshot carries the input digests.
    key = secrets.randbits(63)  # drawn now: the call has returned
    w1 = time.perf_counter()
    job.send_all(
        [{"t": "snapshot", "id": tag, "write": write, "key": key}] * job.world, "benchmark"
    )
    snaps = job.recv_all(deadline, "benchmark")
    w2 = time.perf_counter()
    m = _slowest_rank(reps)
    kind = "checked" if check else "written" if write else "plain"
    rep: dict[str, Any] = {}  # the checker's verdict on a probe
    if cost is not None:  # where a call's harness time goes, checked calls apart
        cost[kind, "n"] += 1
        cost[kind, "call"] += w1 - w0
        cost[kind, "snapshot"] += w2 - w1
    if check:
        assert job.checker
        first = dict(reps[0])
        digests = snaps[0].get("inputs")
        if isinstance(digests, dict):
            first["inputs"] = {
                k: {**v, **(digests.get(k) or {})} for k, v in first["inputs"].items()
            }
        rep = job.checker.ask(
            {"op": "bench_check", "b": b, "seed": seed, "result": first, "tag": tag, "key": key}
        )
        if cost is not None:
            cost[kind, "check"] += time.perf_counter() - w2
    if write:  # snapshots nobody reads (other ranks', or unchecked ones) are dropped
        for r in range(job.world):
            for o in shape["outputs"]:
                (job.root / f"out/{tag}_r{r}_{o['name']}.bin").unlink(missing_ok=True)
    if rep.get("verdict"):
        raise Failure(Verdict(rep["verdict"]), f"benchmark {shape['name']}: {rep['message']}")
    return m, wall


def tree_pids(root: int) -> list[int]:
    """The processes under ``root`` (itself included), read from the host's /proc.

    Trusted: counted from outside the sandbox (its PID namespace hides nothing from the host),
    unlike the thread counts the runner reports about itself.
    """
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        st = _proc_stat(int(d))
        if st is None:  # gone meanwhile
            continue
        kids.setdefault(int(st[1]), []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def _proc_stat(pid: int) -> list[bytes] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, ...); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            st = f.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: the fields follow the last ')'
    return st[st.rindex(b")") + 2 :].split()


def _job_pids(job: Job) -> list[int] | None:
    """The job's sandbox process tree as the host sees it; None without a runner or /proc."""
    if job.box is None or not os.path.isdir("/proc"):
        return None
    return tree_pids(job.box.proc.pid)


def _job_processes(job: Job) -> int | None:
    pids = _job_pids(job)
    return None if pids is None else len(pids)


def _slowest_rank(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """One report for a call across ranks: the slowest rank's times, the side-stream ratio of
    the rank that kept the least of its work on the timed stream, and all ranks' threads."""
    if len(reps) == 1:
        return reps[0]
    m = dict(max(reps, key=lambda r: float(r.get("ev_sync_ms", r["wall_ms"]))))
    m["wall_ms"] = max(float(r["wall_ms"]) for r in reps)
    if all("ev_sync_ms" in r for r in reps):
        ratio = min(float(r["ev_stream_ms"]) / max(float(r["ev_sync_ms"]), 1e-9) for r in reps)
        m["ev_stream_ms"] = ratio * float(m["ev_sync_ms"])
    th = [r.get("threads") or [0, 0] for r in reps]
    m["threads"] = [sum(t[0] for t in th), sum(t[1] for t in th)]  # all ranks' threads
    return m


#: Single-rank exercises time our reference beside the submission, call for call, in the same
#: job (``KGRADE_PAIRED_BASELINE``, default on). A baseline timed once and cached met the host
#: in another state: short calls are host-bound, and on the H200 pair the cached merge and block
#: baselines left our own reference graded at 0.87-1.04. Multi-rank exercises keep the cached
#: baseline: two ring jobs would hold the same GPUs' memory at once, and the ring's long calls
#: stayed within 1.6 % of their baseline.
PAIRED_ENV = "KGRADE_PAIRED_BASELINE"


#: Paired timing restarts the submission's runner before its timed calls (see _phase_bench).
FRESH_RUNNER = True
#: Paired timing treats both sides alike: each is stopped while the other's call runs, and our
#: reference's runner writes snapshots on its own random draw as the submission's does for its
#: probes. With only the submission probed and stopped, its side read ~0.05 ms faster on the
#: shortest calls (docs/perf.md, run 9).
SYMMETRIC = True


#: The CPUs both sides' runners are pinned to for a paired loop: "auto" (default) picks one of
#: the worker's CPUs per GPU (the last, then the one before for the next GPU, ...), a list
#: ("7" or "6,7") names them, "off" leaves placement to the scheduler. A microVM's vCPUs run at
#: unequal, changing speeds; host-bound calls follow the speed of the vCPU their process sits
#: on, and the scheduler keeps a process where it ran, so two unpinned runners can meet two
#: speeds for a whole loop. On one CPU the two take turns and meet the same one.
TIMING_CPUS_ENV = "KGRADE_TIMING_CPUS"


def timing_cpus(gpu_index: int) -> set[int] | None:
    """The CPU set for a paired loop on ``gpu_index``'s job, or None to leave placement be."""
    spec = os.environ.get(TIMING_CPUS_ENV, "auto").strip()
    allowed = sorted(os.sched_getaffinity(0))
    if spec == "off" or not allowed:
        return None
    if spec == "auto":
        return {allowed[-1 - gpu_index % len(allowed)]}
    try:
        cpus = {int(c) for c in spec.split(",") if c.strip()}
    except ValueError:
        raise ValueError(
            f"{TIMING_CPUS_ENV} must be 'auto', 'off' or CPU numbers, got {spec!r}"
        ) from None
    return (cpus & set(allowed)) or None


def pin(job: Job, cpus: set[int]) -> int:
    """Every thread of the job's process tree onto ``cpus`` (from the host); threads and
    processes started later inherit it. Returns how many threads were pinned."""
    n = 0
    for pid in _job_pids(job) or []:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:  # gone meanwhile
            continue
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(tid), cpus)
                n += 1
    return n


def paired_baseline(world: int) -> bool:
    return world == 1 and os.environ.get(PAIRED_ENV, "1") != "0"


@contextlib.contextmanager
def stopped(job: Job) -> Iterator[None]:
    """A job's whole process tree stopped (SIGSTOP, from the host) while the other side of a
    paired loop takes its timed call. For the submission: nothing it left running can load the
    host or the GPU queue against the baseline (its last call ended device-synchronised, so no
    work of its own is in flight either). For ours: both sides resume from a stop alike."""
    pids = _job_pids(job) or []
    sent = []
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                sent.append(pid)
        _wait_stopped(sent)
        yield
    finally:
        for pid in sent:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _wait_stopped(pids: list[int], bound_s: float = 0.05) -> None:
    """SIGSTOP lands asynchronously: wait (briefly) until every process shows state T.

    A process inside the GPU driver (state D) stops when it leaves it; past the bound the call
    goes ahead, as that process can no longer run Python once it does."""
    t_end = time.monotonic() + bound_s
    todo = list(pids)
    while todo and time.monotonic() < t_end:
        left = []
        for pid in todo:
            st = _proc_stat(pid)
            if st is not None and st[0] not in (b"T", b"t"):
                left.append(pid)
        todo = left
        if todo:
            time.sleep(0.0005)


class _Side:
    """One process's timed calls for a shape: the submission's, or our reference's beside it."""

    def __init__(
        self, job: Job, b: int, shape: dict[str, Any], deadline: float, baseline: bool = False
    ) -> None:
        self.job, self.b, self.shape, self.deadline = job, b, shape, deadline
        self.baseline = baseline  # our reference's calls beside the submission's: never probed
        self.cost: defaultdict[tuple[str, str], float] = defaultdict(float)
        self.samples: list[float] = []  # counted calls' device-synced times: the statistics
        self.events: list[float] = []  # every timed call's, for the integrity checks
        self.settled = 0
        self.i = 0
        self.streams: list[float] = []
        self.walls: list[float] = []
        self.call_walls: list[float] = []
        self.threads0: int | None = None
        self.gpu_s = 0.0
        self.probes = 0
        self.overhead = 0.0
        self.warmup_calls = 0
        self.warmup_s = 0.0
        self.procs0: int | None = None
        self.floor_stop = False  # the loop ended because the speedup sat at the clamp floor

    def fail(self, verdict: Verdict, message: str) -> Failure:
        if self.baseline:  # our reference failing beside a submission is our fault, not its
            return Failure(Verdict.INFRA_ERROR, f"reference beside the submission: {message}")
        return Failure(verdict, message)

    def call(
        self, tag: str, check: bool, write: bool | None = None
    ) -> tuple[dict[str, Any], float]:
        try:
            return _timed_call(
                self.job, self.b, self.shape, tag, check, self.deadline, self.cost, write
            )
        except Failure as f:
            raise self.fail(f.verdict, f.message) from None

    def calibrate(self) -> None:
        """The per-iteration overhead O (IPC, input generation, flush, sync), then the warm-up."""
        noop = []
        for _ in range(5):
            w0 = time.perf_counter()
            msg = {"t": "noop", "gens": self.shape["gens"], "seed": secrets.randbits(62)}
            self.job.send_all([{**msg, "flush": True}] * self.job.world, "benchmark")
            self.job.recv_all(self.deadline, "benchmark")
            noop.append((time.perf_counter() - w0) * 1e3)
        self.overhead = sorted(noop)[len(noop) // 2]
        # warm-up: >= 3 calls and >= 50 ms. The first calls are checked (a wrong kernel stops
        # here, not after a loop of timed calls); later ones are not timed, so checking them buys
        # nothing that the loop's secret probes do not.
        w0 = time.monotonic()
        spent, k = 0.0, 0
        while k < timing.WARMUP_CALLS or spent < timing.WARMUP_MIN_S * 1e3:
            check = k < timing.WARMUP_CALLS and not self.baseline
            m, _ = self.call(f"b{self.b}w{k}", check)
            spent += float(m.get("ev_sync_ms", m["wall_ms"]))
            k += 1
            if k > 50:
                break
        self.warmup_calls, self.warmup_s = k, time.monotonic() - w0
        # Processes in the job's tree, counted from the host after the warm-up (compilers and
        # autotuning have come and gone), then at every probe and after the loop (grader spec
        # §5): a helper process doing work during timed calls shows here.
        self.procs0 = _job_processes(self.job)

    def no_new_processes(self) -> None:
        n = _job_processes(self.job)
        if self.procs0 is not None and n is not None and n > self.procs0:
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {self.shape['name']}: the submission started processes "
                f"({self.procs0} in the job before the timed calls, {n} now)",
            )

    def timed(self, counted: bool = True) -> bool:
        """One timed call; its time joins the statistics when ``counted``. True if probed."""
        i = self.i
        self.i += 1
        # Our reference's calls are "probed" on their own draw too, without a check: its runner
        # then writes its outputs and digests as the submission's does, so neither side's
        # process does host work the other's does not (SYMMETRIC).
        probe = (not self.baseline or SYMMETRIC) and (secrets.randbelow(8) == 0 or i == 0)
        self.probes += probe
        m, wall = self.call(f"b{self.b}i{i}", probe and not self.baseline, write=probe)
        if probe:
            self.no_new_processes()
        t_sync, t_stream = float(m["ev_sync_ms"]), float(m["ev_stream_ms"])
        self.streams.append(t_stream)
        if t_sync > wall + 0.05:
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {self.shape['name']}: reported time exceeds the wall clock",
            )
        th = m.get("threads") or [0, 0]
        self.threads0 = th[0] if self.threads0 is None else self.threads0
        if th[1] > self.threads0:
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {self.shape['name']}: the submission started threads",
            )
        if counted:
            self.samples.append(t_sync)
        else:
            self.settled += 1
        self.events.append(t_sync)
        self.walls.append(wall)
        self.call_walls.append(float(m["wall_ms"]))
        self.gpu_s += t_sync / 1e3
        return probe

    def finish(self, loop_s: float) -> dict[str, Any]:
        """The loop's statistics, after the checks that need all of its calls."""
        self.no_new_processes()
        name = self.shape["name"]
        st = timing.stats(self.samples)
        # Side streams: judged on medians, not per call. One call whose end event lands late (the
        # host descheduled between the device-wide sync and the last record) is noise; work kept
        # off the timed stream shows in every call.
        if timing.side_stream_escape(self.streams, self.events):
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {name}: work outside the timed stream (median stream "
                f"{statistics.median(self.streams):.3f} ms vs device {st.median:.3f} ms)",
            )
        # Wall-clock plausibility. The parent's wall per call also covers input generation, NaN
        # poisoning, the L2 flush and the input checksums, none of which the noop calibration
        # can reproduce exactly, so the lower bound uses the runner's call window (perf_counter
        # bound before the student's import, identity-checked after each call): the
        # device-synced event time must account for that window,
        # W_call - N*O_call <= sum(reported) <= W.
        n = len(self.events)
        if not timing.plausible(self.events, self.call_walls, self.walls):
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {name}: reported times implausible against wall clock "
                f"(events {sum(self.events):.1f} ms, call window {sum(self.call_walls):.1f} ms, "
                f"parent wall {sum(self.walls):.1f} ms over {n} calls)",
            )
        if min(self.events) < self.shape["floor_ms"]:
            raise self.fail(
                Verdict.INTEGRITY_VIOLATION,
                f"benchmark {name}: {min(self.events):.4f} ms is below the roofline floor "
                f"{self.shape['floor_ms']:.4f} ms",
            )
        return {
            "stats": st,
            "overhead_ms": self.overhead,
            "samples": self.samples,
            # where a shape's wall time goes (harness cost per call, checked calls), for operators
            "profile": {
                "noop_ms": round(self.overhead, 3),
                "warmup_calls": self.warmup_calls,
                "warmup_s": round(self.warmup_s, 3),
                "calls": len(self.samples),
                "settle_calls": self.settled,
                "probes": self.probes,
                "loop_s": round(loop_s, 3),
                "floor_stop": self.floor_stop,
                "rel_se": round(st.rel_se, 5) if st.rel_se < float("inf") else None,
                # mean ms per call: the call round trip, the snapshot request, the checker
                **{
                    f"{kind}_{part}_ms": round(1e3 * v / self.cost[kind, "n"], 2)
                    for (kind, part), v in self.cost.items()
                    if part != "n"
                },
            },
            "review": st.median < timing.HUMAN_REVIEW_FACTOR * self.shape["floor_ms"],
        }


def _bench_shape(
    job: Job, b: int, shape: dict[str, Any], deadline: float, ref: Job | None = None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Time one shape: the submission's loop, and with ``ref`` our reference's calls taken in
    turn with it (one each per round, each side stopped during the other's calls), so that both
    see the machine in the same state. The loop ends once both sides' statistics have settled.
    """
    sub = _Side(job, b, shape, deadline)
    base = _Side(ref, b, shape, deadline, baseline=True) if ref is not None else None
    with stopped(ref) if ref is not None and SYMMETRIC else contextlib.nullcontext():
        sub.calibrate()
    if base is not None:
        with stopped(job):
            base.calibrate()
    # paired: two processes' calls share the loop's wall-clock budget
    wall_budget = timing.SHAPE_WALL_BUDGET_S * (2 if base is not None else 1)
    clamp = float(job.ex.scoring["clamp"])
    t_loop = time.monotonic()
    # The call right after a probe (or our reference's written snapshot) meets the host just
    # after that host work (the checker's gold and comparison, files written): it is timed and
    # checked like any other but not counted, on whichever side it falls. It cannot help a
    # submission: whether the next call is a probe is decided after that call returns.
    settle = False
    while True:
        wall = time.monotonic() - t_loop
        if base is not None and timing.past_floor(sub.samples, base.samples, clamp):
            sub.floor_stop = True  # the score is clamped at its floor: more calls cannot move it
            break
        # both sides call until both are done, so paired samples stay paired
        done = timing.should_stop(sub.samples, sub.gpu_s, wall, wall_budget) and (
            base is None or timing.should_stop(base.samples, base.gpu_s, wall, wall_budget)
        )
        if done:
            break
        if base is None:
            settle = sub.timed(counted=not settle)
            continue
        # which side goes first alternates (ABBA), so neither always follows the other
        for side in (sub, base) if sub.i % 2 else (base, sub):
            other = base if side is sub else sub
            # the other side's processes are stopped during this side's call: always the
            # submission's during ours (it cannot slow the baseline), ours during its when
            # SYMMETRIC (both sides then resume from a stop before each call)
            hold = stopped(other.job) if side is base or SYMMETRIC else contextlib.nullcontext()
            with hold:
                settle = side.timed(counted=not settle)
    loop_s = time.monotonic() - t_loop
    return sub.finish(loop_s), base.finish(loop_s) if base is not None else None


def _canary_key(ex: Exercise, res: GradeResult) -> str:
    """The canary taken beside an exercise's baseline: same identity as its shapes' keys."""
    return _ref_key(ex, {"name": "<canary>", "params": {}}, res)


def _ref_key(ex: Exercise, shape: dict[str, Any], res: GradeResult) -> str:
    return json.dumps(
        [
            ex.id,
            shape["name"],
            shape["params"],
            # the board's identity (name, driver, memory), not its clocks or temperature,
            # which change from job to job and would make every baseline a cache miss
            [",".join(g.split(",")[:3]) for g in res.hardware.get("gpus", [])[:1]],
            res.versions.get("torch"),
            res.versions.get("triton"),
            res.harness_hash,
        ],
        sort_keys=True,
        default=str,
    )


def _start_reference(job: Job, fresh: bool) -> Job:
    """Our reference in its own sandboxed runner beside ``job``, same isolation and GPU, ready
    for timed calls (grader spec §5, paired baseline). With ``fresh``, the submission's runner
    is started anew too; both processes start at once (their imports of torch overlap), then
    each imports its module. The submission's import keeps its own verdicts; ours failing is
    INFRA_ERROR."""
    ref = Job(
        job.ex,
        job.ex.reference.read_bytes(),
        job.device,
        job.secret,
        trusted=True,
        isolation=job.isolation,
        world=job.world,
    )
    try:
        if fresh:
            job.prior_logs += job.stop_runner()
            job.start_runner()
        ref.setup()
        ref.start_runner()
        if fresh:
            _phase_import(job)
        try:
            _phase_import(ref)
        except Failure as f:
            raise Failure(
                Verdict.INFRA_ERROR, f"reference beside the submission: {f.message}"
            ) from None
    except BaseException:
        ref.close()
        raise
    return ref


def _phase_bench(job: Job, plan: dict[str, Any], res: GradeResult, reference: bool) -> None:
    # also for our reference graded as a submission (an instructor's harness check)
    paired = reference and paired_baseline(job.world)
    # a paired loop takes our reference's calls too
    deadline = time.monotonic() + job.ex.limits["benchmark_s"] * (2 if paired else 1)
    subs: list[dict[str, Any]] = []
    pairs: list[dict[str, Any] | None] = []
    n_shapes = len(plan["bench"])
    job.report("benchmark", 0, n_shapes)
    assert job.checker
    with timing_turn() as canary_wait:  # the machine's state now, in the trusted checker
        deadline += canary_wait
        rep = job.checker.ask({"op": "canary"})
    canary = {k: float(rep[k]) for k in ("gpu_ms", "host_ms") if k in rep}
    ref_job = None
    cpus: set[int] | None = None
    t_setup = time.monotonic()
    if paired:
        # Both sides' timed calls come from processes in the same state: fresh, the module
        # imported, nothing run but this phase. A runner that went through the tests phase (many
        # shapes and dtypes through its allocator and caches) was slower on short calls than a
        # fresh one beside it (docs/perf.md, run 8).
        ref_job = _start_reference(job, fresh=FRESH_RUNNER)
        # both sides on the same CPU(s), after their start-up (compilers and imports spread out)
        cpus = timing_cpus(job_gpus(job.world)[0][0])
        if cpus:
            pin(job, cpus)
            pin(ref_job, cpus)
    t_started = time.monotonic()
    try:
        for b, shape in enumerate(plan["bench"]):
            with timing_turn() as waited:
                deadline += waited  # another job's turn is not this one's time
                s, r = _bench_shape(job, b, shape, deadline, ref_job)
            s["profile"]["turn_wait_s"] = round(waited, 3)
            subs.append(s)
            pairs.append(r)
            job.report("benchmark", b + 1, n_shapes)
    finally:
        if ref_job is not None:
            ref_job.close()
    refs: list[float | None] = [None] * len(subs)
    if paired:
        refs = [r["stats"].median if r else None for r in pairs]
        res.details["baseline"] = {
            "mode": "paired",
            # restarting the submission's runner and starting ours, before the timed calls
            "start_s": round(t_started - t_setup, 3),
            "cpus": sorted(cpus) if cpus else None,
            **_by_shape(plan, pairs, lambda r: r["profile"]),
        }
    elif reference:
        refs = reference_times(job.ex, plan, res)
        res.details["baseline"] = {"mode": "cached"}
    # a paired baseline is timed in this job: there is no cached machine state to compare with
    cached = None if paired else _REF_CACHE.get(_canary_key(job.ex, res))
    res.details["canary"] = _canary_report(canary, cached)
    res.details["canary"]["turn_wait_s"] = round(canary_wait, 3)
    clamp = float(job.ex.scoring["clamp"])
    speedups = []
    for shape, s, ref in zip(plan["bench"], subs, refs, strict=True):
        st = s["stats"]
        sp = timing.clamp_speedup(ref, st.median, clamp) if ref else None
        if sp is not None:
            speedups.append(sp)
        res.timings.append(
            ShapeTiming(
                shape["name"],
                shape["params"],
                st.n,
                st.median,
                st.mean,
                st.std,
                st.min,
                shape["floor_ms"],
                ref,
                sp,
            )
        )
        if s["review"]:
            res.details.setdefault("review", []).append(shape["name"])
    res.details["bench_profile"] = _by_shape(plan, subs, lambda s: s["profile"])
    res.details["raw_samples_ms"] = _by_shape(plan, subs, _raw_samples)
    if paired:
        res.details["ref_raw_samples_ms"] = _by_shape(plan, pairs, _raw_samples)
    if speedups and len(speedups) == len(subs):
        res.speedup = timing.geomean(speedups)


def _by_shape(
    plan: dict[str, Any], loops: list[dict[str, Any] | None], pick: Callable[[dict[str, Any]], Any]
) -> dict[str, Any]:
    """``pick`` of each shape's timed loop (as ``_bench_shape`` returns it), by shape name."""
    return {sh["name"]: pick(r) for sh, r in zip(plan["bench"], loops, strict=True) if r}


def _raw_samples(loop: dict[str, Any]) -> list[float]:
    return [round(x, 5) for x in loop["samples"]]


def _canary_report(now: dict[str, float], base: dict[str, float] | None) -> dict[str, Any]:
    """This job's canary beside the baseline's: ``off`` when either workload is more than
    ``timing.CANARY_TOLERANCE`` away, i.e. the machine is not in the state the baseline saw
    (recorded for staff and the pipeline report; the grading itself stands)."""
    rep: dict[str, Any] = {k: round(v, 5) for k, v in now.items()}
    if base:
        ratio = {k: now[k] / base[k] for k in now if base.get(k)}
        rep["baseline"] = {k: round(float(v), 5) for k, v in base.items()}
        rep["ratio"] = {k: round(v, 4) for k, v in ratio.items()}
        rep["off"] = any(abs(v - 1.0) > timing.CANARY_TOLERANCE for v in ratio.values())
    return rep


def reference_times(ex: Exercise, plan: dict[str, Any], res: GradeResult) -> list[float | None]:
    """Median times of our reference per shape, timed by this harness in its own process."""
    keys = [_ref_key(ex, s, res) for s in plan["bench"]]
    cache_file = os.environ.get("KGRADE_REF_CACHE")
    if cache_file and os.path.exists(cache_file):
        with contextlib.suppress(ValueError):
            _REF_CACHE.update(json.loads(Path(cache_file).read_text()))
    if not all(k in _REF_CACHE for k in keys):
        r = grade(
            ex.id,
            ex.reference.read_bytes(),
            device=res.device,
            trusted=True,
            isolation=None,
            reference_timing=False,
        )
        if r.verdict is not Verdict.PASS:
            raise Failure(Verdict.INFRA_ERROR, f"reference failed: {r.output}")
        for k, t in zip(keys, r.timings, strict=True):
            _REF_CACHE[k] = t.median_ms
        base_canary = {
            k: v for k, v in (r.details.get("canary") or {}).items() if k.endswith("_ms")
        }
        if base_canary:
            _REF_CACHE[_canary_key(ex, res)] = base_canary
        if cache_file:
            Path(cache_file).write_text(json.dumps(_REF_CACHE))
    return [_REF_CACHE[k] for k in keys]
