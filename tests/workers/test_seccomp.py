"""The seccomp program, run through a small classic-BPF interpreter (no kernel needed), and
once for real: a job under bubblewrap with the filter installed, as the grader runs it."""

from __future__ import annotations

import errno
import json
import os
import struct
import sys
from pathlib import Path

import pytest

from workers import seccomp
from workers.sandbox import Sandboxed, SandboxSpec, detect_isolation

ALLOW, KILL, EPERM = 0x7FFF0000, 0x80000000, 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

# clone flags (linux/sched.h)
SIGCHLD = 17
CLONE_NEWUSER = 0x10000000
CLONE_NS = [0x00020000, 0x02000000, 0x04000000, 0x08000000, CLONE_NEWUSER, 0x20000000, 0x40000000]
THREAD = 0x003D0F00  # glibc's pthread_create: VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|...
FORK = 0x01200000 | SIGCHLD  # glibc's fork: CHILD_SETTID|CHILD_CLEARTID
VFORK = 0x00004100 | SIGCHLD  # VM|VFORK


def run_bpf(prog: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    insns = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)  # struct seccomp_data
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x15:  # jeq #k
            pc += jt if acc == k else jf
        elif code == 0x35:  # jge #k
            pc += jt if acc >= k else jf
        elif code == 0x45:  # jset #k
            pc += jt if acc & k else jf
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
        pc += 1


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_deny_list(machine: str) -> None:
    prog = seccomp.program(machine)
    assert prog is not None and len(prog) % 8 == 0
    table = seccomp._NR[machine]
    assert set(table) == {*seccomp.DENIED, "clone", "clone3"}
    for name in seccomp.DENIED:
        assert run_bpf(prog, table[name], ARCH[machine]) == EPERM, name
    # everyday calls pass: read, write, openat, mmap, ioctl (CUDA), clone, execve, futex
    everyday = {
        "x86_64": [0, 1, 257, 9, 16, 56, 59, 202],
        "aarch64": [63, 64, 56, 222, 29, 220, 221, 98],
    }[machine]
    for nr in everyday:
        assert run_bpf(prog, nr, ARCH[machine]) == ALLOW, nr
    other = ARCH["aarch64" if machine == "x86_64" else "x86_64"]
    assert run_bpf(prog, 0, other) == KILL  # another ABI could dodge the numbers
    assert run_bpf(prog, 0, 0x40000003) == KILL  # i386 on x86-64


def test_x32_calls_are_killed() -> None:
    prog = seccomp.program("x86_64")
    assert prog is not None
    assert run_bpf(prog, 0x40000000 | 101, ARCH["x86_64"]) == KILL


def test_unknown_machine_has_no_program() -> None:
    assert seccomp.program("riscv64") is None


def test_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KGRADE_SECCOMP", "0")
    assert seccomp.program_fd() is None


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_clone_into_a_namespace_is_denied(machine: str) -> None:
    prog = seccomp.program(machine)
    assert prog is not None
    clone, clone3, a = seccomp._NR[machine]["clone"], seccomp._NR[machine]["clone3"], ARCH[machine]
    for flag in CLONE_NS:
        assert run_bpf(prog, clone, a, flag | SIGCHLD) == EPERM, hex(flag)
        assert run_bpf(prog, clone, a, 0xFFFFFFFF << 32 | flag | THREAD) == EPERM, hex(flag)
    # threads, fork, vfork; the low byte is the exit signal (0x80 is not CLONE_NEWTIME here);
    # the kernel ignores the high half of clone's flags
    for flags in (THREAD, FORK, VFORK, SIGCHLD, 0x80 | SIGCHLD, 0xFFFFFFFF << 32 | SIGCHLD):
        assert run_bpf(prog, clone, a, flags) == ALLOW, hex(flags)
    # clone3's flags are out of reach: ENOSYS sends the C library back to clone
    assert run_bpf(prog, clone3, a, 0) == ENOSYS
    # the flags are looked at on clone only
    assert run_bpf(prog, seccomp._NR[machine]["clone"] + 1, a, CLONE_NEWUSER) == ALLOW


PROBE = """
import ctypes, json, os, platform, subprocess, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CLONE, CLONE3 = {"x86_64": (56, 435), "aarch64": (220, 435)}[platform.machine()]
out = {}

def sys_(name, nr, *args):
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *map(ctypes.c_long, args))
    if nr == CLONE and rc == 0:  # the filter let a child through: it leaves at once
        os._exit(0)
    if nr == CLONE and rc > 0:
        os.waitpid(rc, 0)
    out[name] = [rc, ctypes.get_errno()]

sys_("clone_newuser", CLONE, 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER|SIGCHLD
sys_("clone3", CLONE3, 0, 0)  # without the filter: EINVAL (no struct)

t = threading.Thread(target=lambda: out.setdefault("thread", 1))
t.start()
t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
out["subprocess"] = subprocess.run([sys.executable, "-c", "print(6 * 7)"],
                                   capture_output=True, text=True).stdout.strip()
pid = os.posix_spawn(sys.executable, [sys.executable, "-c", "raise SystemExit(3)"], {})
out["posix_spawn"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
ctypes.set_errno(0)  # last: without the filter it moves us into a new user namespace
out["unshare"] = [libc.unshare(0x10000000), ctypes.get_errno()]  # CLONE_NEWUSER
print(json.dumps(out))
"""


def test_under_the_real_filter(tmp_path: Path) -> None:
    """Namespaces stay shut, while threads (clone3, then clone), fork and spawn still work."""
    if detect_isolation() != "bwrap" or not seccomp.enabled():
        pytest.skip("needs bubblewrap and the filter")
    os.chmod(tmp_path, 0o755)  # the job may run as an unprivileged uid
    spec = SandboxSpec(cwd=tmp_path, rw_paths=[tmp_path], isolation="bwrap")
    box = Sandboxed(spec, [sys.executable, "-c", PROBE])
    assert box.seccomp
    rc = box.wait(120)
    logs = box.logs()
    if rc is None:
        box.kill()
    assert rc == 0, logs
    out = json.loads(box.out.text())
    assert out["unshare"] == [-1, errno.EPERM], out
    assert out["clone_newuser"] == [-1, errno.EPERM], out
    assert out["clone3"] == [-1, errno.ENOSYS], out
    assert out["thread"] == 1 and out["fork"] == 7 and out["posix_spawn"] == 3, out
    assert out["subprocess"] == "42", out
