"""A seccomp deny-list for the runner (grader spec §7), as a classic-BPF program for bubblewrap.

bubblewrap installs it (``--seccomp FD``) right before it executes the job, after its own
namespace and mount work. Denied calls fail with EPERM, except on another ABI (a 32-bit or
x32 call on x86-64, which could dodge a list of 64-bit numbers), which kills the process.
As in Docker's default profile, ``clone`` with a namespace flag fails with EPERM too, and
``clone3`` with ENOSYS: its flags sit in a struct in memory, out of the filter's reach, and
ENOSYS makes the C library fall back to ``clone`` (threads, fork and spawn keep working).

No libseccomp needed: the program is a handful of ``struct sock_filter`` entries.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

# The spec's list plus what a kernel grader never needs: module and kexec loading, namespaces
# and mounts after start-up, keyrings, io_uring (a syscall multiplexer the filter cannot see
# into), handle-based opens that bypass path checks.
DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "mount",
    "umount2",
    "pivot_root",
    "unshare",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
    "name_to_handle_at",
    "swapon",
    "swapoff",
    "reboot",
    "quotactl",
    "io_uring_setup",
)

# Syscall numbers per architecture (Linux uapi unistd tables): the list, clone and clone3.
_NR: dict[str, dict[str, int]] = {
    "x86_64": {
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "unshare": 272,
        "setns": 308,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "open_by_handle_at": 304,
        "name_to_handle_at": 303,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "quotactl": 179,
        "io_uring_setup": 425,
        "clone": 56,
        "clone3": 435,
    },
    "aarch64": {
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "unshare": 97,
        "setns": 268,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "open_by_handle_at": 265,
        "name_to_handle_at": 264,
        "swapon": 224,
        "swapoff": 225,
        "reboot": 142,
        "quotactl": 60,
        "io_uring_setup": 425,
        "clone": 220,
        "clone3": 435,
    },
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_BIT = 0x40000000  # x86-64's x32 ABI: same table with this bit set

# clone()'s namespace flags (linux/sched.h): NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID,
# NEWNET, Docker's mask. CLONE_NEWTIME (0x80) is left out: on clone() the low byte is the exit
# signal, and a new time namespace needs unshare or clone3, both refused anyway.
_CLONE_NS = 0x7E020000

# classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
# struct seccomp_data: nr, arch, then instruction_pointer and args[6] as 64-bit words. Both
# arches here are little-endian (their AUDIT_ARCH says so), so args[0]'s low half is at 16.
_OFF_NR, _OFF_ARCH, _OFF_ARG0_LO = 0, 4, 16


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def arch() -> str | None:
    m = platform.machine().lower()
    m = {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)
    return m if m in _NR else None


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one), or None where no table exists."""
    machine = machine or arch()
    if machine not in _NR:
        return None
    table = _NR[machine]
    deny = _RET_ERRNO | errno.EPERM
    insns = [
        _insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
        _insn(_JEQ_K, 1, 0, _AUDIT_ARCH[machine]),
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if machine == "x86_64":
        insns += [_insn(_JGE_K, 0, 1, _X32_BIT), _insn(_RET_K, 0, 0, _RET_KILL_PROCESS)]
    for name in DENIED:
        insns += [_insn(_JEQ_K, 0, 1, table[name]), _insn(_RET_K, 0, 0, deny)]
    insns += [
        _insn(_JEQ_K, 0, 1, table["clone3"]),
        _insn(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
        # clone's flags are args[0] on both arches; the kernel reads only their low 32 bits
        _insn(_JEQ_K, 0, 3, table["clone"]),
        _insn(_LD_W_ABS, 0, 0, _OFF_ARG0_LO),
        _insn(_JSET_K, 0, 1, _CLONE_NS),
        _insn(_RET_K, 0, 0, deny),
        _insn(_RET_K, 0, 0, _RET_ALLOW),
    ]
    return b"".join(insns)


def enabled() -> bool:
    """On unless KGRADE_SECCOMP=0 (a host whose kernel refuses filters: the job then says so)."""
    return os.environ.get("KGRADE_SECCOMP", "1") != "0" and arch() is not None


def program_fd() -> int | None:
    """A read-only descriptor holding the filter, for ``bwrap --seccomp FD``; the caller closes
    it once the sandbox started."""
    if not enabled():
        return None
    prog = program()
    assert prog is not None
    r, w = os.pipe()  # the program is < 1 KiB: it fits the pipe buffer, no writer thread
    try:
        os.write(w, prog)
    finally:
        os.close(w)
    return r
