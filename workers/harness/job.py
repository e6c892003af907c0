"""One grading job's process tree (grader spec §2): its private directory, the trusted checker
and the sandboxed runner (started by exec, never by fork), and the channels to them. ``Job``
starts and stops them; ``Failure`` (``failure.py``) ends a job with a verdict wherever it is
raised; the channels themselves are in ``channel.py``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.exercises import Exercise
from workers.harness.channel import Channel, CheckerProc
from workers.harness.failure import Failure
from workers.sandbox import Limits, Sandboxed, SandboxSpec, sandbox_uid
from workers.verdicts import Verdict

REPO = Path(__file__).resolve().parents[2]
#: A directory where trusted reference runs keep compiled Triton kernels between jobs.
REF_TRITON_CACHE_ENV = "KGRADE_REF_TRITON_CACHE"
RUNNER = Path(__file__).with_name("runner.py")
#: What the sandbox runs, relative to this directory: the runner's entry script and the package
#: beside it (copied read-only into each job's harness directory, and hashed by harness_hash).
RUNNER_FILES = (
    "runner.py",
    *sorted(f"sandboxed/{p.name}" for p in RUNNER.parent.glob("sandboxed/*.py")),
)

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


def harness_hash() -> str:
    """Hash of the harness code, recorded with every result (re-grade when it changes)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def install_runner(dest: Path) -> None:
    """Copy the runner's files into ``dest`` (a job's harness directory), read-only."""
    for rel in RUNNER_FILES:
        target = dest / rel
        if not target.parent.is_dir():
            target.parent.mkdir(parents=True)
            os.chmod(target.parent, 0o755)
        shutil.copy(RUNNER.parent / rel, target)
        os.chmod(target, 0o444)


def _secret(secret: bytes | None) -> bytes:
    if secret:
        return secret
    env = os.environ.get("KGRADE_GRADER_SECRET")
    if env:
        return env.encode()
    return secrets.token_bytes(32)  # no configured secret: a random one per run


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
    base: Any = None  # the runner's state before the import (timed.Baseline), benchmark only
    threads: int | None = None  # the runner's CPU thread pool, when its CPUs are fixed
    cpus: set[int] | None = None  # the CPUs its runner is pinned to once it says hello
    killed: bool = False  # ``kill`` was called: no process of the job may start any more
    # a fresh runner started ahead (while the tests run) for the benchmark: ``use_spare``
    spare: tuple[Sandboxed, list[Channel]] | None = None
    ahead: list[Job] = field(default_factory=list)  # jobs started ahead for it (ours beside it)

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
        install_runner(self.root / "harness")
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

    def start_checker(self) -> None:
        """The trusted checker process (``CheckerProc``), unless the job was killed."""
        if self.killed:
            raise Failure(Verdict.INFRA_ERROR, "the job was cancelled")
        self.checker = CheckerProc(self.checker_env())
        if self.killed:  # killed while it started
            self.kill()

    def start_runner(self) -> None:
        if self.killed:
            raise Failure(Verdict.INFRA_ERROR, "the job was cancelled")
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
            "OMP_NUM_THREADS": str(self.threads or os.environ.get("KGRADE_RUNNER_THREADS", "2")),
            "MASTER_ADDR": "127.0.0.1",
            "GLOO_SOCKET_IFNAME": "lo",
            "KINETO_LOG_LEVEL": "5",
        }
        if self.trusted and shared_cache:
            # ... and its autotuners' choices too (Triton's on-disk autotune cache): each reference
            # run timed every config of every shape again, about 1 s a shape, and one choice kept
            # for the worker's life also keeps the baseline the same kernel.
            env["TRITON_CACHE_AUTOTUNING"] = "1"
        if self.device == "cpu" and not self.trusted:
            # Triton solutions run on CPU tensors (kernels spec §5). Not our reference: its
            # kernels take their PyTorch paths on CPU, as a CPU-only deployment's baseline
            # should (under the interpreter NSA's forward took 3.9 s a call at a rehearsal's
            # T=112, a student's masked PyTorch 2.5 ms); the interpreter suites test the Triton.
            env["TRITON_INTERPRET"] = "1"
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
        if self.killed:  # killed while it started
            self.kill()

    def start_spare(self, threads: int | None) -> None:
        """A fresh runner with a thread pool of ``threads``, started now and kept aside (it says
        hello, nothing more, until ``use_spare`` makes it the job's runner): its start-up
        (Python, torch, the CUDA context) then overlaps the tests phase. It never meets the
        submission before it is adopted."""
        current = self.box, self.chans, self.threads
        self.box, self.chans, self.threads = None, [], threads
        try:
            self.start_runner()
            assert self.box is not None
            self.spare = (self.box, self.chans)
        finally:
            self.box, self.chans, self.threads = current

    def use_spare(self) -> bool:
        """The runner started ahead becomes the job's (its old one stopped already)."""
        if self.spare is None:
            return False
        assert self.box is None
        (self.box, self.chans), self.spare = self.spare, None
        if self.killed:
            self.kill()
        return True

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

    def kill(self) -> None:
        """End the job's processes now, from any thread (a confirmation run beside a first run
        that failed): the runner's whole process group and the checker, without the goodbyes
        ``close`` waits for. The thread grading the job then meets closed channels (its own
        ``close`` still runs)."""
        self.killed = True  # set before reading box/checker; their starters read it after
        box, checker, spare = self.box, self.checker, self.spare
        for b in (box, spare[0] if spare else None):
            if b is not None:
                b._killpg(signal.SIGKILL)
        if checker is not None:
            with contextlib.suppress(OSError):
                checker.proc.kill()

    def close(self) -> None:
        try:
            logs = self.stop_runner()
            self.logs = self.logs or logs  # a vanished runner's were read already
        finally:
            if self.spare is not None:  # started ahead, never used: it met nothing
                box, chans = self.spare
                self.spare = None
                box.kill(grace=0.0)
                for ch in chans:
                    ch.sock.close()
            while self.ahead:  # started ahead, never taken (the job ended first): no goodbyes
                other = self.ahead.pop()
                with contextlib.suppress(Exception):
                    other.kill()
                    other.close()
            if self.checker:
                self.checker.close()
            shutil.rmtree(self.root, ignore_errors=True)
