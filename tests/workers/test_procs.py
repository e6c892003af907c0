"""The job's process tree as the host sees it (workers/harness/procs.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from workers.harness.procs import _tree_pids_scan, tree_pids


def test_tree_walk_finds_what_the_full_scan_finds() -> None:
    # grandchildren, a subshell's children, and threads of the root (bash has one)
    script = "sleep 30 & sleep 30 & (sleep 30 & sleep 30 & wait) & wait"
    p = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(_tree_pids_scan(p.pid)) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        want = sorted(_tree_pids_scan(p.pid))
        assert len(want) == 6
        assert sorted(tree_pids(p.pid)) == want
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_a_gone_root_has_no_tree() -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    assert tree_pids(p.pid) == []
