"""Check and time the NSA forward's opt-in kernels on one GPU, pick the fastest correct set,
and re-measure it (issue 19): one script for a whole device run, so a short session's
device time goes to the measurements, not to hand-made run scripts (run 84's was lost).

    python3 benchmarks/nsa_candidates.py                 # phase 1 then phase 2
    python3 benchmarks/nsa_candidates.py --phase check   # checks and the variants table only

Phase 1 ("check"): the Gluon smoke test of g2p8, the GPU tests of window v2 and of the top-n
forms, then ``bench_nsa.py --variants`` with every candidate that passed. From its 64k rows
it picks the compressed and window variants with the fastest whole forward and the top-n
form with the fastest kernel among those whose picks equal the plain kernel's.
Phase 2 ("measure", with the picks in KGRADE_NSA_COMPRESSED, KGRADE_NSA_WINDOW and
KGRADE_NSA_TOPN): g2p8's GPU tests if it was picked, ``bench_nsa.py --backward``, the side by
side ``bench_nsa_others.py --backward`` (where ``third_party/`` was carried), the probe
``nsa_overlap.py`` (do the compressed and selection kernels share the GPU?) and the NSA GPU
suite. Each step runs with a timeout; a failed or cut step is reported and the rest go on.
The chosen set is printed as the environment to make it the default with, not made so here.
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

DEFAULTS = {branch: DEFAULT_VARIANTS[branch] for branch in ("compressed", "window", "topn")}
_TOTAL = re.compile(r"^\s*T=\s*(\d+) total fwd slc \S+ / cmp (\S+) / win (\S+)\s+([\d.]+) ms")
_TOPN_ROW = re.compile(r"^\| top-n alone, banded, (\S+) \| (.*) \| ([^|]*) \|\s*$")


class Picks(NamedTuple):
    compressed: str
    window: str
    topn: str
    total_ms: float | None  # the picked pair's forward at the longest T timed
    topn_ms: float | None


def parse_picks(log: str, t: int, allowed: dict[str, set[str]]) -> Picks:
    """The fastest allowed (compressed, window) pair by the ``total fwd`` rows at length t,
    and the fastest allowed top-n form at t whose check says ``picks equal: True``; the
    defaults where nothing allowed was timed."""
    best: tuple[float, str, str] | None = None
    for line in log.splitlines():
        m = _TOTAL.match(line)
        if not m or int(m.group(1)) != t:
            continue
        cmp, win, ms = m.group(2), m.group(3), float(m.group(4))
        ok = cmp in allowed["compressed"] and win in allowed["window"]
        if ok and (best is None or ms < best[0]):
            best = (ms, cmp, win)
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
        best[1] if best else DEFAULTS["compressed"],
        best[2] if best else DEFAULTS["window"],
        topn[1] if topn else DEFAULTS["topn"],
        best[0] if best else None,
        topn[0] if topn else None,
    )


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
    ap.add_argument("--seqs", type=int, nargs="+", default=[65536, 16384], help="first: picks")
    args = ap.parse_args()
    py = sys.executable
    env = {"NSA_AUTOTUNE": "0"}
    smoke = step(
        "smoke g2p8",
        [py, "benchmarks/gluon_smoke.py", "--timeout", "100", "--only", "nsa compressed g2p8"],
        160,
    )
    g2p8_ok = bool(re.search(r"^  nsa compressed g2p8: ok", smoke, re.M))
    gpu = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"]
    nsa_tests = "tests/kernels/test_gpu_nsa.py"
    win_ok = passed(step("window v2 tests", [*gpu, nsa_tests, "-k", "window_v2"], 150))
    topn_ok = passed(step("top-n form tests", [*gpu, nsa_tests, "-k", "packed"], 150))
    allowed = {
        "compressed": {"g2p", *(["g2p8"] if g2p8_ok else [])},
        "window": {"v1", *(["v2"] if win_ok else [])},
        "topn": {"float16k", "float8k", "float4k", *(["packed8k", "packed4k"] if topn_ok else [])},
    }
    seqs = [str(t) for t in args.seqs]
    variants = step(
        "variants",
        [py, "benchmarks/bench_nsa.py", "--variants", "--seqs", *seqs, "--sel", "v2"]
        + ["--cmp", *sorted(allowed["compressed"]), "--win", *sorted(allowed["window"])],
        420,
        env,
    )
    picks = parse_picks(variants, args.seqs[0], allowed)
    print(f"\npassed: g2p8 {g2p8_ok}, window v2 {win_ok}, packed top-n {topn_ok}")
    print(
        f"picked at T={args.seqs[0]}: compressed {picks.compressed}, window {picks.window} "
        f"(forward {picks.total_ms} ms), top-n {picks.topn} ({picks.topn_ms} ms alone)"
    )
    chosen = {
        "KGRADE_NSA_COMPRESSED": picks.compressed,
        "KGRADE_NSA_WINDOW": picks.window,
        "KGRADE_NSA_TOPN": picks.topn,
    }
    print("chosen environment: " + " ".join(f"{k}={v}" for k, v in chosen.items()), flush=True)
    if args.phase == "check":
        return
    env = {**env, **chosen}
    if picks.compressed == "g2p8":
        gluon = "tests/kernels/test_gpu_nsa_gluon.py"
        step("g2p8 tests", [*gpu, "-x", gluon, "-k", "g2p8"], 240, env)
    step("fwd+bwd", [py, "benchmarks/bench_nsa.py", "--backward", "--no-flex"], 240, env)
    if (REPO / "third_party").is_dir():
        others = [py, "benchmarks/bench_nsa_others.py", "--backward", "--seqs", "16384", "65536"]
        step("side by side", others, 360, env)
    overlap = [py, "benchmarks/nsa_overlap.py", "--seqs", "65536", "--rounds", "10"]
    step("branch overlap probe", overlap, 150, env)
    step("NSA GPU suite", [*gpu, nsa_tests, "-k", "not variants"], 420, env)


if __name__ == "__main__":
    main()
