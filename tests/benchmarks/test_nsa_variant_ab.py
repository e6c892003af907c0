"""benchmarks/nsa_variant_ab.py: its options fail early and clearly, and a tiny CPU run (the
PyTorch path, where no variant applies) prints one row per variant, each its forward's."""

from __future__ import annotations

import pytest

from benchmarks import nsa_variant_ab as ab
from kernels.nsa import attention


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["chunk4k", "nope"], "unknown NSA topn variant 'nope'"),
        (["chunk4k", "chunk4k"], "at least two different variant names"),
        (["chunk4k"], "at least two different variant names"),
    ],
)
def test_bad_values_stop_before_any_timing(
    values: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        ab.parse(["--branch", "topn", "--values", *values])
    assert message in capsys.readouterr().err
    assert attention.VARIANTS["topn"] is None  # the check leaves no variant set


def test_a_tiny_cpu_run_prints_a_row_per_variant(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the PyTorch path: seconds
    args = ab.parse(
        ["--branch", "window", "--values", "v1", "v2", "--device", "cpu", "--rounds", "2"]
        + ["--seqs", "130", "--hq", "4", "--hkv", "1", "--dim", "16"]
    )
    ab.run(args)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 130 |")]
    assert [r.split(" | ")[1] for r in rows] == ["v1", "v2"]
    # the first variant against itself: ratio 1, and the same path gives the same output
    assert rows[0].split(" | ")[5] == "1.0000"
    assert all(r.endswith("| bitwise equal |") for r in rows)
    assert attention.VARIANTS["window"] is None
