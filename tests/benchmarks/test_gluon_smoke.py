"""benchmarks/gluon_smoke.py's parent: a kernel that hangs or crashes becomes a row, not a stall.

The children need an sm_90 GPU (they run on the H200); here the child processes are replaced by
what a hanging, crashing, wrong and correct kernel would give.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import gluon_smoke


def test_each_outcome_becomes_a_row(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    outcomes = {
        "nsa compressed g2h": "hang",
        "nsa compressed g2p": "crash",
        "nsa compressed g2p4": "RESULT WRONG o 3.00e-01",
        "nsa window+combine g1": "RESULT ok out 1.00e-03, lse 2.00e-07",
    }

    real_run = subprocess.run

    def fake_run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
        if "--child" not in cmd:  # git, for the commit line
            return real_run(cmd, **kw)  # type: ignore[call-overload]
        name = cmd[cmd.index("--child") + 1]
        what = outcomes[name]
        if what == "hang":
            raise subprocess.TimeoutExpired(cmd, kw["timeout"])  # type: ignore[arg-type]
        if what == "crash":
            return subprocess.CompletedProcess(cmd, 1, "", "Traceback\nCompilationError: boom")
        return subprocess.CompletedProcess(cmd, 0, f"noise\n{what}\n", "")

    monkeypatch.setattr(gluon_smoke.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gluon_smoke.torch.cuda, "get_device_name", lambda: "fake")
    monkeypatch.setattr(gluon_smoke.subprocess, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["gluon_smoke.py", "--timeout", "5", "--only", *outcomes])
    gluon_smoke.main()
    table = capsys.readouterr().out.split("| kernel | result |")[1]
    assert "| nsa compressed g2h | HANG (killed after 5 s) |" in table
    assert "| nsa compressed g2p | ERROR (exit 1): CompilationError: boom |" in table
    assert "| nsa compressed g2p4 | WRONG o 3.00e-01 |" in table
    assert "| nsa window+combine g1 | ok out 1.00e-03, lse 2.00e-07 |" in table


def test_child_verdict_uses_the_kernel_tolerance(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(gluon_smoke.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setitem(gluon_smoke.KERNELS, "k", (lambda: {"o": 2e-4}, 1e-4))
    gluon_smoke.child("k")
    assert capsys.readouterr().out.strip() == "RESULT WRONG o 2.00e-04"
    monkeypatch.setitem(gluon_smoke.KERNELS, "k", (lambda: {"o": 5e-5}, 1e-4))
    gluon_smoke.child("k")
    assert capsys.readouterr().out.strip() == "RESULT ok o 5.00e-05"


def test_child_reports_a_fallback_as_an_error(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A Gluon variant that turned itself off (kernels._gluon_switch) returns its Triton
    kernel's result, which would match: the child says ERROR, not ok."""
    import kernels._gluon_switch as switch

    monkeypatch.setattr(gluon_smoke.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(switch, "OFF", {"the NSA compressed branch": "does not compile: boom"})
    monkeypatch.setitem(gluon_smoke.KERNELS, "k", (lambda: {"o": 0.0}, 1e-4))
    gluon_smoke.child("k")
    assert capsys.readouterr().out.strip() == (
        "RESULT ERROR fell back to Triton: does not compile: boom"
    )
