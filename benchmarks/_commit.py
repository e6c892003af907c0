"""The commit a benchmark ran on, for the header of its printed table."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def git(args: list[str], cwd: Path) -> str:
    """``git args`` in ``cwd``: its stdout stripped, "" when git fails or is missing."""
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def commit(repo: Path = REPO) -> str:
    """Short hash of ``repo``'s HEAD (+ "-dirty" with uncommitted changes to tracked files).

    KGRADE_COMMIT wins: a ``git archive`` export run on the GPU machine has no .git of its
    own, and git then finds a parent folder's, which may be stale.
    """
    if os.environ.get("KGRADE_COMMIT"):
        return os.environ["KGRADE_COMMIT"]
    sha = git(["rev-parse", "--short", "HEAD"], repo)
    if not sha:
        return "unknown"
    dirty = git(["status", "--porcelain", "--untracked-files=no"], repo)
    return sha + ("-dirty" if dirty else "")
