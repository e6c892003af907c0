"""benchmarks/nsa_candidates.py's picks from a ``bench_nsa.py --variants`` log (CPU)."""

from __future__ import annotations

from benchmarks.nsa_candidates import DEFAULTS, parse_picks, passed


def _total(t: int, cmp: str, win: str, ms: float) -> str:
    # bench_nsa.run_variants' per-row line: f"  T={t:6d} {row:40s} {ms:9.3f} ms"
    row = f"total fwd slc v2 / cmp {cmp} / win {win}"
    return f"  T={t:6d} {row:40s} {ms:9.3f} ms"


LOG = "\n".join(
    [
        _total(65536, "g2p", "v1", 39.33),
        _total(65536, "g2p", "v2", 38.91),
        _total(65536, "g2p8", "v1", 37.40),
        _total(65536, "g2p8", "v2", 37.02),
        _total(16384, "g2p8", "v1", 5.01),  # faster, but not the T the picks are made at
        "  T= 65536 top-n alone, banded, packed8k: FAILED RuntimeError: boom",
        "",
        "| row | T=64k | T=16k | check vs v1 |",
        "|---|---|---|---|",
        "| total fwd slc v2 / cmp g2p / win v1 | 39.33 (120) | 6.04 (115) | out 1e-3 |",
        "| top-n alone (incl. sort) | 2.10 | 0.60 |  |",
        "| top-n alone, banded, float16k | 1.78 | 0.45 | picks equal: True |",
        "| top-n alone, banded, float8k | 1.41 | 0.40 | picks equal: True |",
        "| top-n alone, banded, float4k | 1.20 | 0.38 | picks equal: False |",
        "| top-n alone, banded, packed8k | FAILED | 0.30 | picks equal: True |",
        "| top-n alone, banded, packed4k | 1.30 | 0.31 | picks equal: True |",
    ]
)
ALL = {
    "compressed": {"g2p", "g2p8"},
    "window": {"v1", "v2"},
    "topn": {"float16k", "float8k", "float4k", "packed8k", "packed4k"},
}


def test_fastest_allowed_pair_and_the_fastest_correct_topn_form() -> None:
    p = parse_picks(LOG, 65536, ALL)
    assert (p.compressed, p.window, p.total_ms) == ("g2p8", "v2", 37.02)
    # float4k is faster but its picks differ; packed8k FAILED at 64k
    assert (p.topn, p.topn_ms) == ("packed4k", 1.30)


def test_candidates_that_failed_their_checks_are_not_picked() -> None:
    allowed = {"compressed": {"g2p"}, "window": {"v1", "v2"}, "topn": {"float16k", "float8k"}}
    p = parse_picks(LOG, 65536, allowed)
    assert (p.compressed, p.window, p.topn) == ("g2p", "v2", "float8k")


def test_the_other_length_and_an_empty_log() -> None:
    p = parse_picks(LOG, 16384, ALL)
    assert (p.compressed, p.window, p.total_ms) == ("g2p8", "v1", 5.01)
    assert (p.topn, p.topn_ms) == ("packed8k", 0.30)
    empty = parse_picks("", 65536, ALL)
    assert empty == (DEFAULTS["compressed"], DEFAULTS["window"], DEFAULTS["topn"], None, None)


def test_passed_reads_pytest_summary_lines() -> None:
    assert passed("...\n3 passed, 80 deselected, 1 warning in 4.1s\n")
    assert not passed("2 passed, 1 failed in 9.0s")
    assert not passed("1 passed, 1 error in 9.0s")
    assert not passed("5 skipped, 80 deselected in 0.5s")  # no CUDA: nothing was checked
    assert not passed("")


def test_step_echoes_returns_and_cuts_a_step_with_its_children(capsys) -> None:  # noqa: ANN001
    import sys
    import time

    from benchmarks.nsa_candidates import step

    out = step("echo", [sys.executable, "-c", "print('one'); print('two')"], 30)
    assert out.splitlines() == ["one", "two"]
    assert "exit 0" in capsys.readouterr().out
    t0 = time.time()
    # a child that would outlive its parent: the whole group goes at the timeout
    code = "import subprocess, sys, time; print('started', flush=True); "
    code += (
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    out = step("slow", [sys.executable, "-c", code], 2)
    assert out.strip() == "started" and time.time() - t0 < 20
    assert "CUT after 2 s" in capsys.readouterr().out
