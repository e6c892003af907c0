"""benchmarks/_common.commit: the commit a benchmark prints, in a checkout and in the
``git archive`` export that runs on the GPU machine (where git would find a parent folder's
repository, or none)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from benchmarks._common import commit

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout.strip()


def _export(tmp_path: Path) -> Path:
    """This checkout's ``git archive HEAD`` (its benchmarks/ only), unpacked in ``tmp_path``."""
    data = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True)
    dest = tmp_path / "export"
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        tar.extractall(
            dest, members=[m for m in tar if m.name.startswith("benchmarks/")], filter="data"
        )
    return dest


@pytest.fixture
def in_git(monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    monkeypatch.delenv("KGRADE_COMMIT", raising=False)


@pytest.mark.usefixtures("in_git")
def test_an_export_names_the_exported_commit(tmp_path: Path) -> None:
    stamp = (_export(tmp_path) / "benchmarks" / "COMMIT").read_text().strip()
    head = _git("rev-parse", "HEAD")
    assert not stamp.startswith("$Format"), "export-subst did not fill benchmarks/COMMIT in"
    assert len(stamp) >= 7 and head.startswith(stamp)
    assert commit(tmp_path / "export") == stamp


@pytest.mark.usefixtures("in_git")
def test_an_export_inside_another_repository_still_names_its_own(tmp_path: Path) -> None:
    # out/runNN of an older commit, unpacked below a checkout whose HEAD has moved on: git
    # there would answer with the outer checkout's HEAD
    outer = tmp_path / "outer"
    outer.mkdir()
    _git("init", "-q", cwd=outer)
    _git(
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "x",
        cwd=outer,
    )
    export = outer / "out" / "run37"
    (export / "benchmarks").mkdir(parents=True)
    (export / "benchmarks" / "COMMIT").write_text("1234abc\n")
    assert commit(export) == "1234abc"


@pytest.mark.usefixtures("in_git")
def test_a_checkout_names_its_head_not_the_placeholder() -> None:
    assert (ROOT / "benchmarks" / "COMMIT").read_text().startswith("$Format")
    got = commit(ROOT)
    assert got.removesuffix("-dirty") == _git("rev-parse", "--short", "HEAD")


def test_kgrade_commit_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "COMMIT").write_text("1234abc\n")
    monkeypatch.setenv("KGRADE_COMMIT", "feedbee")
    assert commit(tmp_path) == "feedbee"


def test_no_git_and_no_stamp_is_unknown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KGRADE_COMMIT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert commit(tmp_path) == "unknown"
