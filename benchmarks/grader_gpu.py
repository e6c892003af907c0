"""Grade every known solution of every exercise on the GPU, then our reference five times.

Usage (on the H200):  python benchmarks/grader_gpu.py [--exercises a,b] [--reps 5] [--out FILE]

Prints one table row per grading (exercise, solution, expected, verdict, score, per-shape
speedups, seconds) and the spread of the five reference speedups (goal: within 3 % of 1.0).
ring-attention needs one GPU per rank: with fewer GPUs than its world size it is graded on CPU
(gloo) and the row says so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.exercises import list_exercises, load_exercise  # noqa: E402
from workers.harness import grade  # noqa: E402
from workers.verdicts import Verdict  # noqa: E402


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU"))
    except (OSError, subprocess.SubprocessError):
        return 0


def row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exercises", default=",".join(list_exercises()))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument("--skip-solutions", action="store_true")
    a = ap.parse_args()
    ngpu = gpu_count()
    lines = [
        row(
            [
                "exercise",
                "solution",
                "device",
                "expected",
                "verdict",
                "score",
                "speedups per shape",
                "s",
            ]
        ),
        row(["---"] * 8),
    ]
    print("\n".join(lines), flush=True)
    bad = 0
    records = []
    for ex_id in a.exercises.split(","):
        ex = load_exercise(ex_id)
        device = "cuda" if ngpu >= ex.world_size else "cpu"
        sols = [] if a.skip_solutions else ex.solutions()
        for sol in sols:
            t0 = time.monotonic()
            r = grade(ex_id, sol.source(), device=device)
            dt = time.monotonic() - t0
            sp = ", ".join(f"{t.name}={t.speedup:.3f}" for t in r.timings if t.speedup) or "-"
            ok = r.verdict is sol.expected
            bad += not ok
            line = row(
                [
                    ex_id,
                    sol.name,
                    device,
                    sol.expected.value,
                    r.verdict.value + ("" if ok else " (MISMATCH)"),
                    f"{r.score:.3f}",
                    sp,
                    f"{dt:.1f}",
                ]
            )
            print(line, flush=True)
            lines.append(line)
            records.append(
                {
                    "exercise": ex_id,
                    "solution": sol.name,
                    "device": device,
                    "expected": sol.expected.value,
                    "verdict": r.verdict.value,
                    "score": r.score,
                    "output": r.output[:500],
                    "timings": [t.__dict__ for t in r.timings],
                    "seconds": dt,
                }
            )
        if device != "cuda" or not ex.reference.exists():
            continue
        # Our reference graded as a submission, reps times: speedups should sit at 1.0.
        reps = []
        for k in range(a.reps):
            t0 = time.monotonic()
            r = grade(ex_id, ex.reference.read_bytes(), device="cuda", trusted=True)
            dt = time.monotonic() - t0
            reps.append(r.speedup)
            sp = ", ".join(f"{t.name}={t.speedup:.3f}" for t in r.timings if t.speedup) or "-"
            line = row(
                [
                    ex_id,
                    f"reference#{k + 1}",
                    "cuda",
                    "PASS",
                    r.verdict.value,
                    f"{r.score:.3f}",
                    sp,
                    f"{dt:.1f}",
                ]
            )
            print(line, flush=True)
            lines.append(line)
            bad += r.verdict is not Verdict.PASS
        got = [x for x in reps if x is not None]
        if got:
            spread = max(abs(x - 1.0) for x in got)
            line = (
                f"{ex_id}: reference speedups {[round(x, 4) for x in got]}, max |s-1| = "
                f"{spread:.4f} ({'within' if spread <= 0.03 else 'OUTSIDE'} 3 %)"
            )
            print(line, flush=True)
            lines.append("")
            lines.append(line)
            lines.append("")
            records.append({"exercise": ex_id, "reference_speedups": got, "max_dev": spread})
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
        Path(a.out).with_suffix(".json").write_text(json.dumps(records, indent=1, default=str))
    print(
        f"mismatches: {bad}; GPUs: {ngpu}; isolation: {os.environ.get('KGRADE_ISOLATION', 'auto')}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
