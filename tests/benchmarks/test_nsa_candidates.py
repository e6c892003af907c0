"""benchmarks/nsa_candidates.py's picks from a ``bench_nsa.py --variants`` log (CPU)."""

from __future__ import annotations

from benchmarks.nsa_candidates import DEFAULTS, Picks, parse_picks, passed, variant_env


def _total(t: int, cmp: str, win: str, ms: float, slc: str = "v2") -> str:
    # bench_nsa.run_variants' per-row line: f"  T={t:6d} {row:40s} {ms:9.3f} ms"
    row = f"total fwd slc {slc} / cmp {cmp} / win {win}"
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
    "selection": {"v2"},
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
    allowed = {
        "selection": {"v2"},
        "compressed": {"g2p"},
        "window": {"v1", "v2"},
        "topn": {"float16k", "float8k"},
    }
    p = parse_picks(LOG, 65536, allowed)
    assert (p.compressed, p.window, p.topn) == ("g2p", "v2", "float8k")


def test_the_other_length_and_an_empty_log() -> None:
    p = parse_picks(LOG, 16384, ALL)
    assert (p.compressed, p.window, p.total_ms) == ("g2p8", "v1", 5.01)
    assert (p.topn, p.topn_ms) == ("packed8k", 0.30)
    empty = parse_picks("", 65536, ALL)
    want = (DEFAULTS["selection"], DEFAULTS["compressed"], DEFAULTS["window"], DEFAULTS["topn"])
    assert empty == (*want, None, None)


def test_the_selection_label_is_picked_with_its_set_and_becomes_the_environment() -> None:
    """A selection candidate (v3 at R 4) wins only with an allowed compressed and window
    variant beside it, and its label becomes the variant and its R."""
    log = "\n".join(
        [
            _total(65536, "g2p8", "v1", 38.0),
            _total(65536, "g3h8s", "v1", 36.5, slc="v3r4"),
            _total(65536, "g3h8sq", "v1", 35.9, slc="v3r2"),  # its compressed one failed
            _total(65536, "g3h8s", "v1", 37.1, slc="v2"),
        ]
    )
    allowed = {
        "selection": {"v2", "v3r4", "v3r2"},
        "compressed": {"g2p8", "g3h8s"},
        "window": {"v1"},
        "topn": {"float4k"},
    }
    p = parse_picks(log, 65536, allowed)
    assert (p.selection, p.compressed, p.total_ms) == ("v3r4", "g3h8s", 36.5)
    assert variant_env(p) == {
        "KGRADE_NSA_SELECTION": "v3",
        "KGRADE_NSA_SELECTION_R": "4",
        "KGRADE_NSA_COMPRESSED": "g3h8s",
        "KGRADE_NSA_WINDOW": "v1",
        "KGRADE_NSA_TOPN": DEFAULTS["topn"],
    }
    plain = variant_env(Picks("v2", "g2p8", "v1", "float4k", None, None))
    assert plain["KGRADE_NSA_SELECTION"] == "v2" and "KGRADE_NSA_SELECTION_R" not in plain


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
