"""benchmarks/detach.sh: a detached command, its log and status; --copy runs it from a copy of
the tree that outlives the original (a device call replaces the working tree under it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "detach.sh"


def _fake_repo(tmp_path: Path) -> Path:
    """A tree laid out as ours: benchmarks/detach.sh, a file, and .whl as a symlink to a folder
    outside it (as out/runNN/.whl -> ../../.whl), plus .venv and out/ that are not copied."""
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "benchmarks" / "detach.sh")
    (repo / "step.txt").write_text("step one\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "a.whl").write_text("wheel")
    (repo / ".whl").symlink_to(wheels)
    for skipped in (".venv", "out"):
        (repo / skipped).mkdir()
        (repo / skipped / "big").write_text("x")
    return repo


def _run(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(repo / "benchmarks" / "detach.sh"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_copy_runs_the_command_in_a_copy_that_outlives_the_tree(tmp_path: Path) -> None:
    repo = _fake_repo(tmp_path)
    out = tmp_path / "d"
    cmd = "sleep 1; cat step.txt; ls .whl; ls -A | grep -qxE '.venv|out' && echo heavy || echo lean; exit 3"
    r = _run(repo, "start", str(out), "0", "--copy", "--", "bash", "-c", cmd)
    assert r.returncode == 124  # still running after 0 s
    shutil.rmtree(repo / "benchmarks")
    (repo / "step.txt").unlink()  # what the next device call's fresh copy does to the tree
    r = _run(tmp_path / "d" / "tree", "wait", str(out), "30")
    assert r.returncode == 3, r.stdout + r.stderr
    log = (out / "run.log").read_text()
    assert "step one" in log and "a.whl" in log
    assert log.strip().endswith("lean")  # neither .venv nor out/ was copied
    assert not (out / "tree" / ".whl").is_symlink()


def test_without_copy_the_command_runs_where_it_was_started(tmp_path: Path) -> None:
    repo = _fake_repo(tmp_path)
    out = tmp_path / "d"
    r = _run(repo, "start", str(out), "30", "--", "bash", "-c", "pwd")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "rc").read_text().strip() == "0"
    assert not (out / "tree").exists()
