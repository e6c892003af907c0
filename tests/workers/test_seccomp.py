"""The seccomp program, run through a small classic-BPF interpreter (no kernel needed)."""

from __future__ import annotations

import errno
import struct

import pytest

from workers import seccomp

ALLOW, KILL, EPERM = 0x7FFF0000, 0x80000000, 0x00050000 | errno.EPERM
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def run_bpf(prog: bytes, nr: int, arch: int) -> int:
    insns = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    data = struct.pack("=iI", nr, arch) + bytes(56)  # struct seccomp_data
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x15:  # jeq #k
            pc += jt if acc == k else jf
        elif code == 0x35:  # jge #k
            pc += jt if acc >= k else jf
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
    assert set(table) == set(seccomp.DENIED)
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
