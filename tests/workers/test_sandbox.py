"""Sandbox and channel red-team cases, graded through the real harness on attention-merge.

Each probe submission computes the honest merge only if its attack failed, so PASS proves the
attack was blocked (and any leak shows as WRONG_ANSWER).
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from tests.workers.conftest import no_leftovers
from workers.harness import grade
from workers.verdicts import Verdict

HONEST = """
import torch
def _merge(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a - safe).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lse_b - safe).transpose(1, 2).unsqueeze(-1)
    return (out_a.float() * wa + out_b.float() * wb).to(out_a.dtype), lse
"""


def probe(attack: str) -> str:
    """A submission that is honest iff ``attack`` (which sets LEAK) found nothing."""
    return (
        HONEST
        + attack
        + """
def merge_attention(out_a, lse_a, out_b, lse_b):
    out, lse = _merge(out_a, lse_a, out_b, lse_b)
    if LEAK:
        out = out * 0
    return out, lse
"""
    )


def run(src: str, **kw) -> object:  # type: ignore[no-untyped-def]
    return grade("attention-merge", src, device="cpu", only_public=True, **kw)


def test_no_network() -> None:
    r = run(
        probe("""
import socket
LEAK = False
for addr in [("1.1.1.1", 53), ("8.8.8.8", 53), ("127.0.0.1", 22)]:
    try:
        s = socket.create_connection(addr, timeout=2)
        LEAK = True
    except OSError:
        pass
""")
    )
    assert r.verdict is Verdict.PASS, r.output


def test_cannot_write_outside_job(tmp_path: Path) -> None:
    marker = f"kgrade-escape-{secrets.token_hex(4)}"
    targets = [
        Path("/work/main") / marker,
        Path(__file__).parent / marker,
        tmp_path / marker,
        Path("/tmp") / marker,
    ]
    r = run(
        probe(f"""
LEAK = False
for p in {[str(t) for t in targets]!r}:
    try:
        with open(p, "w") as f:
            f.write("x")
        LEAK = True
    except OSError:
        pass
""")
    )
    for t in targets:
        assert not t.exists(), t
    assert r.verdict is Verdict.PASS, r.output


def test_reference_and_repo_not_visible() -> None:
    r = run(
        probe("""
import os
LEAK = any(os.path.exists(p) for p in ("/work/main/kernels", "/work/shared/specs",
                                        "/work/main/workers/problems"))
""")
    )
    if r.isolation.startswith("bwrap"):
        assert r.verdict is Verdict.PASS, r.output


def test_fork_bomb_is_resource_limit() -> None:
    src = (
        HONEST
        + """
import os, time
def merge_attention(out_a, lse_a, out_b, lse_b):
    while True:
        pid = os.fork()
        if pid == 0:
            time.sleep(120)
            os._exit(0)
"""
    )
    r = run(src)
    assert r.verdict is Verdict.RESOURCE_LIMIT, r.output
    time.sleep(1)
    assert no_leftovers() == []


def test_infinite_loop_is_timeout_and_group_killed() -> None:
    src = (
        HONEST
        + """
import subprocess, sys
def merge_attention(out_a, lse_a, out_b, lse_b):
    subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a child that outlives us
    while True:
        pass
"""
    )
    t0 = time.monotonic()
    r = run(src, limits={"tests_s": 4})
    assert r.verdict is Verdict.TIMEOUT, r.output
    assert time.monotonic() - t0 < 40
    time.sleep(1)
    assert no_leftovers() == []


def test_output_flood_is_capped() -> None:
    src = (
        HONEST
        + """
import sys
def merge_attention(out_a, lse_a, out_b, lse_b):
    for _ in range(200000):
        sys.stdout.write("x" * 100 + "\\n")
    sys.stdout.flush()
    return _merge(out_a, lse_a, out_b, lse_b)
"""
    )
    r = run(src)
    assert r.verdict is Verdict.RESOURCE_LIMIT, r.output
    assert len(r.logs) < 40_000


def test_fake_json_on_stdout_is_ignored() -> None:
    src = """
import json, sys, torch
def merge_attention(out_a, lse_a, out_b, lse_b):
    print(json.dumps({"t": "called", "id": "c0", "ok": True, "verdict": "PASS", "score": 1}))
    print('{"score": 1.0, "verdict": "PASS"}', file=sys.stderr)
    return torch.zeros_like(out_a), torch.zeros_like(lse_a)
"""
    r = run(src)
    assert r.verdict is Verdict.WRONG_ANSWER, r.output


def test_writing_to_the_channel_is_not_a_pass() -> None:
    src = """
import json, os, socket, torch
def merge_attention(out_a, lse_a, out_b, lse_b):
    fake = json.dumps({"t": "called", "id": "c0", "ok": True, "wall_ms": 0.0, "outputs": [],
                       "inputs": {}, "tamper": [], "ops": {}}) + "\\n"
    for fd in range(3, 64):
        try:
            socket.socket(fileno=os.dup(fd)).sendall(fake.encode())
        except OSError:
            pass
    return torch.zeros_like(out_a), torch.zeros_like(lse_a)
"""
    r = run(src)
    assert r.verdict is not Verdict.PASS, r.output
    assert r.verdict.gradable


def test_secret_not_visible_to_runner(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    marker = "KGRADE-SECRET-MARKER-" + secrets.token_hex(6)
    monkeypatch.setenv("KGRADE_GRADER_SECRET", marker)
    r = grade(
        "attention-merge",
        probe("""
import os, glob
M = "KGRADE-" + "SECRET-MARKER-"  # assembled: the literal must not be in this file
LEAK = M in repr(dict(os.environ)) or M in repr(__import__("sys").argv)
for p in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline"):
    try:
        LEAK = LEAK or M.encode() in open(p, "rb").read()
    except OSError:
        pass
for root, _, files in os.walk(os.path.dirname(os.path.dirname(__file__))):
    for f in files:
        try:
            LEAK = LEAK or M.encode() in open(os.path.join(root, f), "rb").read()
        except OSError:
            pass
"""),
        device="cpu",
    )  # secret from the environment, hidden cases included
    assert r.verdict is Verdict.PASS, r.output
    assert os.environ["KGRADE_GRADER_SECRET"] == marker


def test_reference_triton_cache_is_shared_only_with_trusted_runs(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    cache = tmp_path / "ref-triton"
    monkeypatch.setenv("KGRADE_REF_TRITON_CACHE", str(cache))
    src = (
        HONEST
        + f"""
import os, pathlib
# Triton's on-disk autotune cache goes with the shared cache only: elsewhere, fail the import.
if os.environ.get("TRITON_CACHE_AUTOTUNING") != ("1" if os.environ["TRITON_CACHE_DIR"] == {str(cache)!r} else None):
    raise RuntimeError("autotune cache setting does not match the Triton cache")
WROTE = []
for d in (os.environ["TRITON_CACHE_DIR"], {str(cache)!r}):
    try:
        pathlib.Path(d).mkdir(parents=True, exist_ok=True)
        pathlib.Path(d, "marker").write_text("x")
        WROTE.append(d)
    except OSError:
        pass

def merge_attention(out_a, lse_a, out_b, lse_b):
    return _merge(out_a, lse_a, out_b, lse_b)
"""
    )
    untrusted = run(src)
    assert untrusted.verdict is Verdict.PASS, untrusted.output
    assert not (cache / "marker").exists(), "an untrusted job reached the reference cache"
    trusted = run(src, trusted=True)
    assert trusted.verdict is Verdict.PASS, trusted.output
    assert (cache / "marker").exists(), "the trusted run did not get the shared cache"


def test_only_the_submission_runs_triton_under_the_interpreter_on_cpu() -> None:
    # a student's Triton needs the interpreter on CPU tensors; our reference takes its kernels'
    # PyTorch paths (under the interpreter NSA's took 3.9 s a call, 1,500x a student's torch)
    src = (
        HONEST
        + """
import os
INTERPRET = os.environ.get("TRITON_INTERPRET")

def merge_attention(out_a, lse_a, out_b, lse_b):
    if INTERPRET != WANT:
        raise RuntimeError(f"TRITON_INTERPRET is {INTERPRET!r}")
    return _merge(out_a, lse_a, out_b, lse_b)
"""
    )
    untrusted = run(src.replace("WANT", '"1"'))
    assert untrusted.verdict is Verdict.PASS, untrusted.output
    trusted = run(src.replace("WANT", "None"), trusted=True)
    assert trusted.verdict is Verdict.PASS, trusted.output
    assert run(src.replace("WANT", '"1"'), trusted=True).verdict is Verdict.RUNTIME_ERROR


SYSCALLS = """
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": {"ptrace": 101, "unshare": 272, "process_vm_readv": 310, "bpf": 321},
      "aarch64": {"ptrace": 117, "unshare": 97, "process_vm_readv": 270, "bpf": 280}}
nr = NR.get(platform.machine(), NR["x86_64"])
DONE = []
def denied(name, *args):
    rc = libc.syscall(nr[name], *args)
    DONE.append((name, rc, ctypes.get_errno()))
    return rc == -1 and ctypes.get_errno() == 1  # EPERM from the filter
# each would succeed for an unprivileged process without the filter
LEAK = not all([
    denied("ptrace", 0, 0, 0, 0),                      # PTRACE_TRACEME
    denied("unshare", 0x10000000),                     # CLONE_NEWUSER
    denied("process_vm_readv", os.getpid(), 0, 0, 0, 0, 0),
])
"""


def test_denied_syscalls_fail_with_eperm() -> None:
    r = run(probe(SYSCALLS))
    if r.isolation.startswith("bwrap"):
        assert r.isolation == "bwrap+seccomp", r.isolation
        assert r.verdict is Verdict.PASS, (r.output, r.logs)
    else:  # no bubblewrap here: the result must not claim the filter
        assert "seccomp" not in r.isolation
