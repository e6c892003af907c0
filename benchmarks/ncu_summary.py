"""The few Nsight Compute numbers that say what bounds a kernel, from ``ncu --page raw --csv``.

    python benchmarks/ncu_summary.py ncu_raw.csv [--top 8]

Per profiled kernel: its duration, the SM and memory throughput (% of peak), occupancy and
registers, then its busiest pipes (tensor, MUFU = ``xu``, FMA, ALU, ...) and its main stall
reasons (cycles a warp waits per issued instruction). Metric names differ between ncu
versions and chips, so columns are picked by pattern and any that are missing are skipped,
never guessed. Used by ``ncu_nsa.sh``.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

FIXED = [
    ("time", "gpu__time_duration.sum"),
    ("SM %", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("mem %", "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
    ("DRAM %", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("L2 %", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active"),
    ("regs", "launch__registers_per_thread"),
    ("grid", "launch__grid_size"),
    ("issue %", "sm__inst_issued.avg.pct_of_peak_sustained_active"),
]
PIPE = re.compile(
    r"^sm__(?:inst_executed_)?pipe_(\w+?)(?:_cycles_active)?\.avg\.pct_of_peak_sustained_active$"
)
STALL = re.compile(r"^smsp__average_warps?_issue_stalled_(\w+)_per_issue_active\.ratio$")


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def summarise(rows: list[dict[str, str]], units: dict[str, str], top: int) -> str:
    out: list[str] = []
    for row in rows:
        name = row.get("Kernel Name", "?")
        out.append(f"== {name[:100]}")
        fixed = []
        for label, col in FIXED:
            if col in row and row[col] != "":
                fixed.append(f"{label} {row[col]}{(' ' + units.get(col, '')).rstrip()}")
        out.append("   " + " | ".join(fixed))
        for pattern, label in ((PIPE, "pipes %"), (STALL, "stalls")):
            found = []
            for col, text in row.items():
                m = pattern.match(col or "")
                value = number(text) if m else None
                if m and value is not None and value > 0:
                    found.append((value, m.group(1)))
            found.sort(reverse=True)
            items = ", ".join(f"{n} {v:.2f}" for v, n in found[:top])
            out.append(f"   {label}: {items or '(none reported)'}")
    return "\n".join(out)


def read(path: Path) -> tuple[list[dict[str, str]], dict[str, str]]:
    """ncu's raw CSV: a header row, a units row, then one row per kernel launch."""
    with path.open(newline="") as f:
        table = list(csv.reader(f))
    if len(table) < 2:
        raise SystemExit(f"{path}: no metric rows (did ncu profile any kernel?)")
    head, units = table[0], table[1]
    rows = [dict(zip(head, r, strict=False)) for r in table[2:] if r]
    return rows, dict(zip(head, units, strict=False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--top", type=int, default=8, help="pipes and stalls shown per kernel")
    args = ap.parse_args(argv)
    rows, units = read(args.csv)
    print(summarise(rows, units, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
