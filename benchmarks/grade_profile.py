"""Where a grading's seconds go: grade a few submissions in this process and print, per grading,
its phases and, per benchmark shape, the timed loop's cost (calls, seconds per call, checked
batches, harness overhead). The whole results (raw samples of both sides included) go to
``--out`` as JSON, for offline study of the timing statistics.

Usage (on the GPU machine, after the .whl install of benchmarks/pipeline_gpu.sh):
    python benchmarks/grade_profile.py attention-merge:reference attention-merge:correct/stable_fp32 \
        --out /tmp/profile.json
A solution graded as ``ranked`` (``attention-merge:correct/stable_fp32:ranked``) includes the
confirmation run, as the queue grades students.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import commit  # noqa: E402
from workers.exercises import load_exercise  # noqa: E402
from workers.harness import grade, grade_ranked  # noqa: E402


def shape_rows(name: str, details: dict[str, Any]) -> list[str]:
    rows = []
    prof = details.get("bench_profile") or {}
    ref = details.get("baseline") or {}
    for shape, p in prof.items():
        r = ref.get(shape) or {}
        calls = p["calls"] + p["settle_calls"]
        per = 1e3 * p["loop_s"] / max(1, calls) / (2 if r else 1)
        rows.append(
            f"|   {name} {shape} | {p['warmup_calls']} in {p['warmup_s']:.2f} s | {calls} "
            f"| {p['loop_s']:.2f} | {per:.1f} | {p['batches']} x {p['batch_end_ms']:.0f} ms "
            f"| {p['overhead_ms']} / {p['reply_ms']} | {p['rel_se']} | {p['floor_stop']} |"
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="+", help="exercise:reference | exercise:<solution>[:ranked]")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    print(f"commit {commit()}", flush=True)
    records = []
    for w in a.what:
        parts = w.split(":")
        ex = load_exercise(parts[0])
        ranked = parts[-1] == "ranked"
        if parts[1] == "reference":
            src, trusted = ex.reference.read_bytes(), True
        else:
            (sol,) = [s for s in ex.solutions() if s.name == parts[1]]
            src, trusted = sol.source(), False
        t0 = time.monotonic()
        fn = grade_ranked if ranked else grade
        r = fn(parts[0], src, device=a.device, trusted=trusted)
        dt = time.monotonic() - t0
        phases = r.details.get("phase_s", {})
        print(
            f"\n## {w}: {r.verdict.value} speedup {r.speedup} in {dt:.1f} s\nphases: "
            + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
            + f"\nbaseline start {((r.details.get('baseline') or {}).get('start_s'))} s",
            flush=True,
        )
        print(
            "| shape | warm-up | calls | loop s | ms/call | batch ends | over/reply ms "
            "| rel se | floor |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        print("\n".join(shape_rows("sub", r.details)))
        for side, prof in (
            ("sub", r.details.get("bench_profile") or {}),
            ("ours", r.details.get("baseline") or {}),
        ):
            for shape, p in prof.items():
                if isinstance(p, dict) and p.get("batch_end_split"):
                    print(f"  batch ends, {side} {shape}: {p['batch_end_split']}")
        conf = r.details.get("confirmation")
        if conf:
            print(f"confirmation: {conf.get('speedup')}")
        print(r.output[:600], flush=True)
        records.append({"what": w, "seconds": dt, **dataclasses.asdict(r)})
    if a.out:
        Path(a.out).write_text(json.dumps(records, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
