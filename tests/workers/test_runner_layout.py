"""The sandboxed runner split into modules: every module travels into the job and is hashed,
the copy runs on its own (``python -I -P``, nothing but stdlib and torch), and the identity
records cover every function and method the split moved out of the entry script."""

from __future__ import annotations

import argparse
import ast
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.exercises import load_exercise
from workers.harness import grade
from workers.harness import runner as runner_mod
from workers.harness.job import RUNNER, RUNNER_FILES, harness_hash, install_runner
from workers.harness.sandboxed import captures, describe, digests
from workers.verdicts import Verdict

HARNESS = RUNNER.parent
STDLIB = set(sys.stdlib_module_names)


def test_every_runner_module_is_installed_read_only(tmp_path: Path) -> None:
    on_disk = {"runner.py"} | {f"sandboxed/{p.name}" for p in (HARNESS / "sandboxed").glob("*.py")}
    assert set(RUNNER_FILES) == on_disk
    install_runner(tmp_path)
    for rel in RUNNER_FILES:
        copy = tmp_path / rel
        assert copy.read_bytes() == (HARNESS / rel).read_bytes(), rel
        assert copy.stat().st_mode & 0o777 == 0o444, rel


def test_harness_hash_covers_the_runner_package() -> None:
    # harness_hash hashes every .py under workers/: the package is in it by construction
    root = HARNESS.parent
    hashed = {p.relative_to(root).as_posix() for p in root.rglob("*.py")}
    assert {f"harness/{rel}" for rel in RUNNER_FILES} <= hashed
    assert len(harness_hash()) == 16


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, 0
        elif isinstance(node, ast.ImportFrom):
            yield node.module or "", node.level


@pytest.mark.parametrize("rel", RUNNER_FILES)
def test_runner_modules_need_only_stdlib_and_torch(rel: str) -> None:
    # the sandbox sees neither the grader package nor the reference kernels
    for name, level in _imports(HARNESS / rel):
        top = name.split(".")[0]
        ok = level > 0 or top in STDLIB or top in ("torch", "sandboxed")
        assert ok, f"{rel} imports {name!r}"


def test_the_installed_runner_runs_on_its_own(tmp_path: Path) -> None:
    """The copy, started as the sandbox starts it (``-I -P``: its directory not on sys.path),
    loads its package and answers on its channel."""
    install_runner(tmp_path / "harness")
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-P",
            str(tmp_path / "harness" / "runner.py"),
            "--fd",
            str(theirs.fileno()),
            "--job",
            str(tmp_path),
        ],
        pass_fds=(theirs.fileno(),),
        cwd=tmp_path,
    )
    theirs.close()
    try:
        ours.settimeout(120)
        lines = ours.makefile("rb")
        hello = json.loads(lines.readline())
        assert hello["t"] == "hello" and hello["rank"] == 0
        ours.sendall(b'{"t": "bye"}\n')
        assert json.loads(lines.readline()) == {"t": "bye"}
        assert proc.wait(60) == 0
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()


# -- identity records


@pytest.fixture
def rank() -> Iterator[Any]:
    """A CPU runner in this process (no submission): its records, as taken at start."""
    ours, theirs = socket.socketpair()
    a = argparse.Namespace(
        fd=theirs.detach(), rank=0, world=1, port=0, device="cpu", local_device=0, job="/nowhere"
    )
    r = runner_mod.Rank(a)
    try:
        yield r
    finally:
        r.sock.close()
        ours.close()


def test_nothing_replaced_nothing_reported(rank: Any) -> None:
    assert rank.tamper_check() == []
    # the records name what the split moved out of the entry script
    for key in (
        "runner._perf",
        "captures.output_digest",
        "digests.output_digest",
        "describe.input_digest",
        "Rank.write_captures",
        "Rank.capture",
        "Rank.describe",
        "Rank.window",
    ):
        assert key in rank.ids, key


def test_a_replaced_module_function_is_reported(rank: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(captures, "output_digest", lambda *a, **k: "0" * 16)
    assert rank.tamper_check() == ["captures.output_digest"]
    monkeypatch.undo()
    monkeypatch.setattr(digests, "digest_weights", lambda *a, **k: None)
    assert rank.tamper_check() == ["digests.digest_weights"]


def test_a_replaced_part_method_is_reported(rank: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # a method of one of Rank's parts, replaced where it is defined
    monkeypatch.setattr(describe.DescribePart, "describe", lambda self, ret, msg: [])
    assert rank.tamper_check() == ["Rank.describe"]
    monkeypatch.undo()
    # ... or shadowed on the class, or on the instance
    monkeypatch.setattr(runner_mod.Rank, "capture", lambda self, ret, p: [])
    assert rank.tamper_check() == ["Rank.capture"]
    monkeypatch.undo()
    monkeypatch.setattr(rank, "emit", lambda msg: {}, raising=False)
    assert rank.tamper_check() == ["Rank.emit (instance)"]


def test_a_new_global_in_a_runner_module_is_reported(
    rank: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a global that shadows a builtin the harness calls
    monkeypatch.setattr(captures, "len", lambda x: 0, raising=False)
    assert rank.tamper_check() == ["captures.len"]
    monkeypatch.undo()
    # ... but a warning attributed to a runner module is no tampering
    monkeypatch.setattr(captures, "__warningregistry__", {}, raising=False)
    assert rank.tamper_check() == []


def test_the_runner_clock_and_bound_helpers_are_covered(
    rank: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_mod, "_perf", lambda: 0.0)
    assert rank.tamper_check() == ["runner._perf"]
    monkeypatch.undo()
    monkeypatch.setattr(rank, "_copy", lambda dst, src: dst)
    assert rank.tamper_check() == ["self._copy"]


# A submission replacing a method of a runner part (not the entry script's Rank) without
# updating the records: caught in the tests phase, before any timing.
STABLE = next(
    s for s in load_exercise("attention-merge").solutions() if s.name.endswith("stable_fp32")
)
PATCHES_A_PART = (
    STABLE.source()
    + """
import sys
_C = sys.modules["sandboxed.captures"].CapturesPart
_orig = _C.capture
_C.capture = lambda self, ret, p: _orig(self, ret, p)
"""
)


def test_a_submission_replacing_a_part_method_is_tampering() -> None:
    r = grade("attention-merge", PATCHES_A_PART.encode(), device="cpu")
    assert r.verdict is Verdict.INTEGRITY_VIOLATION, r.output
    assert "Rank.capture" in r.output


def test_cuda_records_cover_the_events(rank: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # no GPU here: the records of a CUDA runner, built on this CPU runner's class and modules
    import torch

    from workers.harness.sandboxed import identity

    rec = identity.Records(
        torch, "cuda", runner_mod.Rank, runner_mod.WATCHED_METHODS, runner_mod.MODULES
    )
    ids = rec.current()
    for key in (
        "Event.record",
        "Event.elapsed_time",
        "Event.synchronize",
        "torch.cuda.synchronize",
    ):
        assert ids[key] is not None, key
    assert rec.check(ids, rank, {}) == []
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, end: 0.0)
    assert rec.check(ids, rank, {}) == ["Event.elapsed_time"]


def test_the_runners_nsa_config_carries_the_references_fields() -> None:
    # The sandbox cannot import kernels/, so the runner keeps its own copy of NSAConfig's
    # fields for the config argument; a field added or a default changed on one side only would
    # hand students a config that differs from the one our reference is timed with.
    import dataclasses

    from kernels.nsa import NSAConfig
    from workers.harness.sandboxed.calls import NSAConfig as RunnerNSAConfig

    def fields(cls: type) -> dict[str, object]:
        return {f.name: f.default for f in dataclasses.fields(cls)}

    assert fields(RunnerNSAConfig) == fields(NSAConfig)
