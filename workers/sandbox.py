"""Process sandbox for the runner (grader spec §7).

Preferred: bubblewrap (``bwrap``) with every namespace unshared (user, pid, ipc, uts, net with
only a loopback, mount, cgroup), ``--die-with-parent``, ``--new-session``, a read-only view of the
system and the venv, the repository hidden, a private tmpfs ``/tmp``, and the job directory as the
only writable path. Fallback when bwrap cannot run: ``unshare`` namespaces (net/pid/ipc/uts, no
filesystem isolation), else rlimits only. :func:`detect_isolation` says which one runs and the
result records it.

Limits always apply through ``prlimit`` (exec, no Python in the child before the runner):
NPROC, FSIZE, NOFILE, CORE=0, CPU; never RLIMIT_AS (GPU mappings count against it and CUDA
breaks). RLIMIT_NPROC is not enforced for root, so when the grader runs as root the sandbox drops
to an unprivileged uid (``KGRADE_SANDBOX_UID``, default 65534) with ``setpriv``.

Every sandbox is its own process group (and, under bwrap/unshare, its own pid namespace): a
phase timeout sends SIGTERM to the whole group, SIGKILL after a grace period, and the namespace's
init takes every remaining process with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from workers import seccomp

KILL_GRACE_S = 5.0
OUTPUT_KEEP = 16_000  # bytes of stdout/stderr kept for the log (spec: display <= 16 KB)
OUTPUT_CAP = 4 << 20  # a flood beyond this kills the job: RESOURCE_LIMIT


@dataclass
class Limits:
    nproc: int = 256  # per uid: also stops fork bombs
    fsize: int = 2 << 30  # largest file the job may write (snapshots of big outputs)
    nofile: int = 1024
    cpu_s: int = 900  # CPU seconds per process; wall clock is enforced separately


@dataclass
class SandboxSpec:
    cwd: Path  # working directory (one of rw_paths)
    rw_paths: list[Path] = field(default_factory=list)  # the only writable paths (same path)
    ro_paths: list[Path] = field(default_factory=list)  # extra read-only binds (same path)
    env: dict[str, str] = field(default_factory=dict)
    device: str = "cpu"
    gpu_indices: list[int] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)
    isolation: str | None = None  # force "bwrap" | "unshare" | "rlimits"


#: How a bubblewrap sandbox shows the job its GPUs: "local" (default) binds only the job's
#: /dev/nvidiaN nodes and numbers them from 0; "physical" binds the same nodes but keeps the
#: host's numbering in CUDA_VISIBLE_DEVICES (for drivers that enumerate nodes they cannot open);
#: "all" binds every GPU node and relies on CUDA_VISIBLE_DEVICES alone.
GPU_VIEW_ENV = "KGRADE_SANDBOX_GPU_VIEW"
GPU_VIEWS = ("local", "physical", "all")


def gpu_view() -> str:
    mode = os.environ.get(GPU_VIEW_ENV, "local")
    if mode not in GPU_VIEWS:
        raise ValueError(f"{GPU_VIEW_ENV}={mode!r}: expected one of {', '.join(GPU_VIEWS)}")
    return mode


def _which(name: str) -> str | None:
    for d in ("/usr/bin", "/bin", "/usr/local/bin", "/tmp/deb/usr/bin"):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return shutil.which(name)


def _probe(argv: list[str]) -> bool:
    try:
        return (
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=20,
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def _drop_prefix() -> list[str]:
    """Drop root to an unprivileged uid (RLIMIT_NPROC is not enforced for root)."""
    if os.geteuid() != 0:
        return []
    setpriv = _which("setpriv")
    if not setpriv:
        return []
    uid = int(os.environ.get("KGRADE_SANDBOX_UID", "65534"))
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def sandbox_uid() -> int | None:
    return int(os.environ.get("KGRADE_SANDBOX_UID", "65534")) if _drop_prefix() else None


def _bwrap_unshare() -> list[str]:
    # As root, bwrap mounts with root's access (python may live under /root) and the job drops
    # to an unprivileged uid inside, after the mounts; a user namespace would keep kuid 0 and
    # with it the exemption from RLIMIT_NPROC. As non-root, the user namespace is required.
    if os.geteuid() == 0:
        return [
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
        ]
    return ["--unshare-all"]


# The unshare fallback's namespaces (root only), the same for its probe and for the jobs.
_UNSHARE_ARGS = ("--net", "--pid", "--fork", "--ipc", "--uts", "--mount-proc", "--kill-child")


@functools.lru_cache(maxsize=1)
def detect_isolation() -> str:
    """'bwrap' where bubblewrap runs here, else 'unshare', else 'rlimits'."""
    forced = os.environ.get("KGRADE_ISOLATION")
    if forced in ("bwrap", "unshare", "rlimits"):
        return forced
    bwrap = _which("bwrap")
    if bwrap and _probe(
        [
            bwrap,
            *_bwrap_unshare(),
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            *_drop_prefix(),
            "true",
        ]
    ):
        return "bwrap"
    unshare = _which("unshare")
    if unshare and os.geteuid() == 0 and _probe([unshare, *_UNSHARE_ARGS, "true"]):
        return "unshare"
    return "rlimits"


# Trees hidden from the sandbox (replaced by empty tmpfs): home dirs, the repository and its
# siblings (specs, secrets in env files), service state. Python and the venv are bound back.
_HIDE = ("/root", "/home", "/work", "/var", "/run", "/srv", "/mnt", "/media", "/opt", "/tmp")


def _python_roots() -> list[Path]:
    roots = {
        Path(sys.prefix).resolve(),
        Path(sys.base_prefix).resolve(),
        Path(sys.executable).resolve().parent.parent,
    }
    return sorted(roots)


def build_argv(
    spec: SandboxSpec, argv: list[str], seccomp_fd: int | None = None
) -> tuple[list[str], str]:
    iso = spec.isolation or detect_isolation()
    lim = spec.limits
    prl = [
        _which("prlimit") or "prlimit",
        f"--nproc={lim.nproc}",
        f"--fsize={lim.fsize}",
        f"--nofile={lim.nofile}",
        "--core=0",
        f"--cpu={lim.cpu_s}",
    ]
    if iso == "bwrap":
        b = [
            _which("bwrap") or "bwrap",
            *_bwrap_unshare(),
            "--die-with-parent",
            "--new-session",
            "--ro-bind",
            "/",
            "/",
        ]
        for h in _HIDE:
            if os.path.isdir(h):
                b += ["--tmpfs", h]
        made: set[str] = set()

        def parents(p: Path) -> list[str]:
            # bwrap would create missing mount points 0700 (unreadable after the uid drop)
            out = []
            for a in reversed(p.parents):
                if str(a) != "/" and str(a) not in made and str(a).startswith(_HIDE):
                    made.add(str(a))
                    out += ["--perms", "0755", "--dir", str(a)]
            return out

        for p in [*_python_roots(), *spec.ro_paths]:
            if p.exists():
                b += [*parents(p), "--ro-bind", str(p), str(p)]
        for p in spec.rw_paths:
            b += [*parents(p), "--bind", str(p), str(p)]
        b += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]
        env = dict(spec.env)
        if spec.device == "cuda":
            mode = gpu_view()
            nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
            if mode == "all":
                nodes += sorted(glob.glob("/dev/nvidia[0-9]*"))
            else:
                nodes += [f"/dev/nvidia{i}" for i in spec.gpu_indices]
            if mode == "local" and spec.gpu_indices:
                # CUDA enumerates only the devices it can open, so the job's GPUs are 0..n-1 here
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(len(spec.gpu_indices))))
            if os.path.isdir("/dev/nvidia-caps"):
                nodes.append("/dev/nvidia-caps")
            for n in nodes:
                if os.path.exists(n):
                    b += ["--dev-bind", n, n]
        b += ["--chdir", str(spec.cwd), "--clearenv"]
        if seccomp_fd is not None:
            b += ["--seccomp", str(seccomp_fd)]  # installed last, right before the job's exec
        for k, v in env.items():
            b += ["--setenv", k, v]
        drop = _drop_prefix()
        if drop:
            drop = [*drop, "--no-new-privs"]
        return [*b, *drop, *prl, *argv], iso
    env_argv = ["/usr/bin/env", "-i", *[f"{k}={v}" for k, v in spec.env.items()]]
    if iso == "unshare":
        # Root-only path: namespaces first (as root), then drop privileges, then limits.
        pre = [_which("unshare") or "unshare", *_UNSHARE_ARGS]
        setpriv = _which("setpriv")
        drop = _drop_prefix()
        if setpriv and drop:
            drop = [*drop, "--no-new-privs", "--pdeathsig", "KILL"]
        # The new net namespace has a loopback that is down: bring it up for gloo/NCCL.
        up = ["/bin/sh", "-c", 'ip link set lo up 2>/dev/null || true; exec "$@"', "sh"]
        return [*pre, *up, *drop, *prl, *env_argv, *argv], iso
    return [*_drop_prefix(), *prl, *env_argv, *argv], iso


class CappedReader(threading.Thread):
    """Drains a pipe, keeping the first OUTPUT_KEEP bytes; past OUTPUT_CAP it flags a flood."""

    def __init__(self, stream, on_flood) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.stream = stream
        self.on_flood = on_flood
        self.kept = bytearray()
        self.total = 0
        self.flooded = False

    def run(self) -> None:
        while True:
            chunk = (
                self.stream.read1(65536)
                if hasattr(self.stream, "read1")
                else self.stream.read(65536)
            )
            if not chunk:
                break
            self.total += len(chunk)
            room = OUTPUT_KEEP - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]
            if self.total > OUTPUT_CAP and not self.flooded:
                self.flooded = True
                self.on_flood()

    def text(self) -> str:
        s = self.kept.decode("utf-8", "replace")
        if self.total > len(self.kept):
            s += f"\n[... {self.total - len(self.kept)} more bytes dropped]"
        return s


class Sandboxed:
    """A running sandboxed process tree (own session / process group)."""

    def __init__(self, spec: SandboxSpec, argv: list[str], pass_fds: tuple[int, ...] = ()) -> None:
        iso = spec.isolation or detect_isolation()
        # The syscall deny-list needs bubblewrap (it installs the filter after its own setup).
        fd = seccomp.program_fd() if iso == "bwrap" else None
        self.seccomp = fd is not None
        try:
            full, self.isolation = build_argv(
                dataclasses.replace(spec, isolation=iso), argv, seccomp_fd=fd
            )
            self.argv = full
            self.proc = subprocess.Popen(
                full,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(*pass_fds, *([fd] if fd is not None else [])),
                close_fds=True,
                start_new_session=True,
                cwd=str(spec.cwd),
            )
        finally:
            if fd is not None:
                os.close(fd)
        self.flooded = False
        self.out = CappedReader(self.proc.stdout, self._flood)
        self.err = CappedReader(self.proc.stderr, self._flood)
        self.out.start()
        self.err.start()

    def _flood(self) -> None:
        self.flooded = True
        self.kill()

    def kill(self, grace: float = KILL_GRACE_S) -> None:
        """SIGTERM the whole process group, SIGKILL it after ``grace`` seconds."""
        if self.proc.poll() is not None:
            self._killpg(signal.SIGKILL)  # stragglers of an exited leader (no pid namespace)
            return
        self._killpg(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        self._killpg(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def _killpg(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def logs(self) -> str:
        self.out.join(timeout=2)
        self.err.join(timeout=2)
        parts = []
        if self.out.total:
            parts.append("[stdout]\n" + self.out.text())
        if self.err.total:
            parts.append("[stderr]\n" + self.err.text())
        return "\n".join(parts)


def wait_until(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())
