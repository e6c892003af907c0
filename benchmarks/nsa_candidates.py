"""Check and time the NSA forward's opt-in kernels on one GPU, pick the fastest correct set,
and re-measure it (issue 19): one script for a whole device run, so a short session's
device time goes to the measurements, not to hand-made run scripts (run 84's was lost).

    python3 benchmarks/nsa_candidates.py                 # phase 1 then phase 2
    python3 benchmarks/nsa_candidates.py --phase check   # checks and the variants table only
    python3 benchmarks/nsa_candidates.py --cmp g3h8sq --sel v3r2   # compressed g3h8sq: the default
    python3 benchmarks/nsa_candidates.py --cmp --sel v5         # selection v5 against the default

Phase 1 ("check"): the Gluon smoke test of each compressed candidate (``--cmp``) and the GPU
tests of the compressed and selection candidates (``--sel``: labels of ``bench_nsa.py``,
``v3r2`` = variant v3 at R 2), then ``bench_nsa.py --variants`` with every candidate that
passed beside the defaults. From its rows at the first ``--seqs`` it picks the (selection,
compressed, window) set with the fastest whole forward and the top-n form with the fastest
kernel among those whose picks equal the plain kernel's.
Phase 2 ("measure", with the picks in the KGRADE_NSA_* variables): the NSA GPU suite's tests
of the default kernels and the grader's NSA tests under them (what making them the defaults
needs), the side by side ``bench_nsa_others.py --backward`` (where ``third_party/`` was
carried; ``--others-seqs``) and ``bench_nsa.py --backward``. Each step runs with a timeout; a
failed or cut step is reported and the rest go on. The chosen set is printed as the
environment to make it the default with, not made so here.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from kernels.nsa.attention import DEFAULT_VARIANTS  # noqa: E402
from kernels.nsa.topn import TOPN_FORMS  # noqa: E402

DEFAULTS = {b: DEFAULT_VARIANTS[b] for b in ("selection", "compressed", "window", "topn")}
_TOTAL = re.compile(r"^\s*T=\s*(\d+) total fwd slc (\S+) / cmp (\S+) / win (\S+)\s+([\d.]+) ms")
_TOPN_ROW = re.compile(r"^\| top-n alone, banded, (\S+) \| (.*) \| ([^|]*) \|\s*$")


class Picks(NamedTuple):
    selection: str  # a bench_nsa.py label: v2, v3r2, ...
    compressed: str
    window: str
    topn: str
    total_ms: float | None  # the picked pair's forward at the longest T timed
    topn_ms: float | None


def parse_picks(log: str, t: int, allowed: dict[str, set[str]]) -> Picks:
    """The fastest allowed (selection, compressed, window) set by the ``total fwd`` rows at
    length t, and the fastest allowed top-n form at t whose check says ``picks equal: True``;
    the defaults where nothing allowed was timed."""
    best: tuple[float, str, str, str] | None = None
    for line in log.splitlines():
        m = _TOTAL.match(line)
        if not m or int(m.group(1)) != t:
            continue
        slc, cmp, win, ms = m.group(2), m.group(3), m.group(4), float(m.group(5))
        ok = (
            slc in allowed["selection"]
            and cmp in allowed["compressed"]
            and win in allowed["window"]
        )
        if ok and (best is None or ms < best[0]):
            best = (ms, slc, cmp, win)
    header = next((ln for ln in log.splitlines() if ln.startswith("| row | T=")), "")
    cols = [c.strip() for c in header.strip("|").split("|")][1:-1]  # T=64k, T=16k, ...
    col = cols.index(f"T={t // 1024}k") if f"T={t // 1024}k" in cols else None
    topn: tuple[float, str] | None = None
    for line in log.splitlines():
        m = _TOPN_ROW.match(line)
        if not m or col is None or m.group(1) not in allowed["topn"]:
            continue
        cells = [c.strip() for c in m.group(2).split("|")]
        if "picks equal: True" not in m.group(3) or col >= len(cells):
            continue
        try:
            ms = float(cells[col].split()[0])
        except ValueError:  # FAILED or —
            continue
        if topn is None or ms < topn[0]:
            topn = (ms, m.group(1))
    return Picks(
        best[1] if best else DEFAULTS["selection"],
        best[2] if best else DEFAULTS["compressed"],
        best[3] if best else DEFAULTS["window"],
        topn[1] if topn else DEFAULTS["topn"],
        best[0] if best else None,
        topn[0] if topn else None,
    )


def variant_env(picks: Picks) -> dict[str, str]:
    """The KGRADE_NSA_* environment that runs ``picks`` (a selection label vNrR is variant vN
    at R positions a program)."""
    m = re.fullmatch(r"(v\d+)r(\d+)", picks.selection)
    env = {"KGRADE_NSA_SELECTION": m.group(1) if m else picks.selection}
    if m:
        env["KGRADE_NSA_SELECTION_R"] = m.group(2)
    env |= {
        "KGRADE_NSA_COMPRESSED": picks.compressed,
        "KGRADE_NSA_WINDOW": picks.window,
        "KGRADE_NSA_TOPN": picks.topn,
    }
    return env


def step(title: str, cmd: list[str], timeout: int, env: dict[str, str] | None = None) -> str:
    """Run ``cmd`` from the repository root, its output echoed line by line as it comes (a
    device call cut short still shows how far a step got), killed with its children after
    ``timeout`` s; returns the output."""
    print(f"\n== {time.strftime('%H:%M:%S')} {title}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        start_new_session=True,  # its own process group: the timeout kills its children too
    )
    cut = threading.Event()

    def kill() -> None:
        cut.set()
        os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, kill)
    timer.start()
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    proc.wait()
    timer.cancel()
    status = f"CUT after {timeout} s" if cut.is_set() else f"exit {proc.returncode}"
    print(f"== {title}: {status}, {time.time() - t0:.0f} s", flush=True)
    return "".join(lines)


def passed(out: str) -> bool:
    """A pytest run's output: something passed and nothing failed or errored."""
    tail = out.strip().splitlines()[-1:] or [""]
    return bool(re.search(r"\d+ passed", tail[0])) and not re.search(r"failed|error", tail[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=["check", "all"], default="all")
    ap.add_argument("--seqs", type=int, nargs="+", default=[65536], help="first: picks")
    ap.add_argument(
        "--others-seqs", type=int, nargs="+", default=[16384, 32768, 65536], help="side by side"
    )
    ap.add_argument("--cmp", nargs="*", default=["g3h8sq"], help="compressed candidates")
    ap.add_argument("--sel", nargs="*", default=[], help="selection ones (v3r2, ...)")
    args = ap.parse_args()
    py = sys.executable
    # gpu_tests.sh: the service's wheels on the path (the grader's tests need them), each
    # run's summary line last (``passed`` reads it); the wheels are installed once, into OUT:
    # a folder of the run's own, since the device tool's $OUT is emptied when a call ends and
    # a detached run outlives its first call (run 94 lost its wheels and a log that way)
    env = {"NSA_AUTOTUNE": "0", "OUT": str(REPO / "out" / "nsa-candidates")}
    gpu = ["bash", "benchmarks/gpu_tests.sh"]
    nsa_tests = "tests/kernels/test_gpu_nsa.py"
    smoke_names = [f"nsa compressed {c}" for c in args.cmp]
    smoke = (
        step(
            "Gluon smoke",
            [py, "benchmarks/gluon_smoke.py", "--timeout", "100", "--only", *smoke_names],
            60 + 60 * len(args.cmp),
        )
        if args.cmp
        else ""
    )
    cmp_ok = [c for c in args.cmp if re.search(rf"^  nsa compressed {c}: ok", smoke, re.M)]
    if cmp_ok:  # the Gluon file's variant fixture and fp8 check, for those that ran
        gluon = "tests/kernels/test_gpu_nsa_gluon.py"
        out = step("compressed tests", [*gpu, gluon, "-k", " or ".join(cmp_ok)], 400, env)
        cmp_ok = cmp_ok if passed(out) else []
    sel_ok = False
    if args.sel:  # the selection tests select by variant name (v3 in the parameter ids)
        sel_names = sorted({re.sub(r"r\d+$", "", s) for s in args.sel})
        sel_tests = [*gpu, nsa_tests, "-k", " or ".join(sel_names)]
        sel_ok = passed(step("selection tests", sel_tests, 400, env))
    allowed = {
        "selection": {DEFAULTS["selection"], *(args.sel if sel_ok else [])},
        "compressed": {DEFAULTS["compressed"], *cmp_ok},
        "window": {DEFAULTS["window"]},
        "topn": set(TOPN_FORMS),  # each form's picks are checked against the plain kernel's
    }
    seqs = [str(t) for t in args.seqs]
    variants = step(
        "variants",
        [py, "benchmarks/bench_nsa.py", "--variants", "--seqs", *seqs]
        + ["--sel", *sorted(allowed["selection"]), "--cmp", *sorted(allowed["compressed"])]
        + ["--win", *sorted(allowed["window"])],
        560,
        env,
    )
    picks = parse_picks(variants, args.seqs[0], allowed)
    print(f"\npassed: compressed {cmp_ok or 'none'}, selection {args.sel if sel_ok else 'none'}")
    print(
        f"picked at T={args.seqs[0]}: selection {picks.selection}, compressed "
        f"{picks.compressed}, window {picks.window} (forward {picks.total_ms} ms), top-n "
        f"{picks.topn} ({picks.topn_ms} ms alone)"
    )
    chosen = variant_env(picks)
    print("chosen environment: " + " ".join(f"{k}={v}" for k, v in chosen.items()), flush=True)
    if args.phase == "check":
        return
    env = {**env, **chosen}
    # the tests that run the default kernels: the per-variant ones name their variants, so the
    # picks change nothing there and phase 1 already ran the candidates' (the whole file takes
    # 530 s on an H100, most of a short session's device time)
    defaults_only = "not test_gpu_variants and not after_forward_variants"
    step("NSA GPU suite", [*gpu, nsa_tests, "-k", defaults_only], 600, env)
    step("grader NSA tests", [*gpu, "tests/workers/test_gpu.py", "-k", "nsa"], 400, env)
    if (REPO / "third_party").is_dir():
        others = [py, "benchmarks/bench_nsa_others.py", "--backward"]
        step("side by side", [*others, "--seqs", *map(str, args.others_seqs)], 560, env)
    step("fwd+bwd", [py, "benchmarks/bench_nsa.py", "--backward", "--no-flex"], 300, env)


if __name__ == "__main__":
    main()
