"""benchmarks/verdict_stability.py: a real run on one exercise agrees with every ``# expect:``
line, and a verdict that changes with the secret makes it fail and name the solution."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import verdict_stability as vs
from workers.verdicts import Verdict


def test_attention_merge_verdicts_are_steady(capsys: pytest.CaptureFixture[str]) -> None:
    assert vs.main(["--exercises", "attention-merge", "--secrets", "1"]) == 0
    out = capsys.readouterr().out
    assert "| attention-merge:correct/" in out and "**no**" not in out


def test_a_verdict_that_depends_on_the_secret_fails_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    flaky = "wrong/zeros"

    def fake_grade(ex_id: str, src: bytes, **kw: Any) -> SimpleNamespace:
        sol = {s.source(): s for s in vs.load_exercise(ex_id).solutions()}[src]
        lucky = sol.name == flaky and kw["secret"] == vs.secret(2)
        return SimpleNamespace(verdict=Verdict.PASS if lucky else sol.expected)

    monkeypatch.setattr(vs, "grade", fake_grade)
    assert vs.main(["--exercises", "attention-merge", "--secrets", "3"]) == 1
    out = capsys.readouterr().out
    assert f"| attention-merge:{flaky} | WRONG_ANSWER | WRONG_ANSWER 2, PASS 1 | **no** |" in out
    assert f"attention-merge:{flaky}: secret 2 gave PASS, expected WRONG_ANSWER" in out
