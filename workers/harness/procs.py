"""The job's processes as the host sees them (``/proc``): counted, stopped, pinned, and the
host-wide turn for timed loops. Read from outside the sandbox, so nothing the submission does
inside its PID namespace changes what is seen here."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.harness.job import Job

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


def tree_pids(root: int) -> list[int]:
    """The processes under ``root`` (itself included), read from the host's /proc.

    Trusted: counted from outside the sandbox (its PID namespace hides nothing from the host),
    unlike the thread counts the runner reports about itself. Walks each process's threads'
    ``children`` lists (a few files for a job's tree: the paired loop stops a side before every
    call, and reading every process's stat on a busy host took milliseconds a call); a kernel
    without them (CONFIG_PROC_CHILDREN) gets the full scan.
    """
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:  # gone meanwhile
            if pid == root:
                return []
            continue
        out.append(pid)
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    todo += [int(c) for c in f.read().split()]
            except FileNotFoundError:
                if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                    continue  # the thread ended meanwhile
                return _tree_pids_scan(root)  # no children lists in this kernel
            except OSError:
                continue
    return out


def _tree_pids_scan(root: int) -> list[int]:
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


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds so far of ``pids`` (gone ones count 0), from /proc."""
    ticks = 0
    for pid in pids:
        st = _proc_stat(pid)
        if st is not None:
            ticks += int(st[11]) + int(st[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def thread_count(pids: list[int]) -> int:
    """Threads of ``pids`` (gone ones count 0), from the host's /proc/PID/task: unlike a count
    the runner reports, nothing inside the sandbox can change it."""
    n = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            n += len(os.listdir(f"/proc/{pid}/task"))
    return n


def job_pids(job: Job) -> list[int] | None:
    """The job's sandbox process tree as the host sees it; None without a runner or /proc."""
    if job.box is None or not os.path.isdir("/proc"):
        return None
    return tree_pids(job.box.proc.pid)


def job_processes(job: Job) -> int | None:
    pids = job_pids(job)
    return None if pids is None else len(pids)


#: The CPUs both sides' runners are pinned to for a paired loop: "auto" (default) picks one of
#: the worker's CPUs per GPU (the last, then the one before for the next GPU, ...), a list
#: ("7" or "6,7") names them, "off" leaves placement to the scheduler. A microVM's vCPUs run at
#: unequal, changing speeds; host-bound calls follow the speed of the vCPU their process sits
#: on, and the scheduler keeps a process where it ran, so two unpinned runners can meet two
#: speeds for a whole loop. On one CPU the two take turns and meet the same one.
TIMING_CPUS_ENV = "KGRADE_TIMING_CPUS"


def timing_cpus(gpu_index: int | None) -> set[int] | None:
    """The CPU set for a paired loop on ``gpu_index``'s job, or None to leave placement be.
    ``gpu_index`` None: a CPU job (a rehearsal), which "auto" leaves unpinned: its calls are
    the CPU's work, and every such job would otherwise meet the others on one CPU."""
    spec = os.environ.get(TIMING_CPUS_ENV, "auto").strip()
    allowed = sorted(os.sched_getaffinity(0))
    if spec == "off" or not allowed:
        return None
    if spec == "auto":
        if gpu_index is None:
            return None
        return {allowed[-1 - gpu_index % len(allowed)]}
    try:
        cpus = {int(c) for c in spec.split(",") if c.strip()}
    except ValueError:
        raise ValueError(
            f"{TIMING_CPUS_ENV} must be 'auto', 'off' or CPU numbers, got {spec!r}"
        ) from None
    return (cpus & set(allowed)) or None  # named CPUs pin CPU jobs too


def pin(job: Job, cpus: set[int]) -> int:
    """Every thread of the job's process tree onto ``cpus`` (from the host); threads and
    processes started later inherit it. Returns how many threads were pinned."""
    n = 0
    for pid in job_pids(job) or []:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:  # gone meanwhile
            continue
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(tid), cpus)
                n += 1
    return n


@contextlib.contextmanager
def stopped(job: Job) -> Iterator[None]:
    """A job's whole process tree stopped (SIGSTOP, from the host) while the other side of a
    paired loop takes its timed call. For the submission: nothing it left running can load the
    host or the GPU queue against the baseline (its last call ended device-synchronised, so no
    work of its own is in flight either). For ours: both sides resume from a stop alike."""
    pids = job_pids(job) or []
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
