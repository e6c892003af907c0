"""The few Nsight Compute numbers that say what bounds a kernel, from ``ncu --page raw --csv``.

    python benchmarks/ncu_summary.py ncu_raw.csv [--top 8]
    python benchmarks/ncu_summary.py --source ncu_source.csv [--top 8]

Per profiled kernel: its duration, the SM and memory throughput (% of peak), occupancy and
registers, then its busiest pipes (tensor, MUFU = ``xu``, FMA, ALU, ...) and its main stall
reasons (cycles a warp waits per issued instruction). Metric names differ between ncu
versions and chips, so columns are picked by pattern and any that are missing are skipped,
never guessed. Used by ``ncu_nsa.sh``.

``--source`` reads one kernel's SASS source page (``ncu --page source --print-source sass
--csv``) instead: the warp-stall samples per region of the SASS, a region starting at each
``USETMAXREG`` (where a warp-specialized partition's warps take or give back registers), then
the hottest instructions, and what the regions that hold MMAs execute. Run 92 needed it: run 91's "CTA barrier" stall in the compressed
kernel was three idle warps padding the program to 12, parked at the partitions' join for the
whole kernel, not a barrier the working warps wait at.
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


SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
SOURCE_STALL = re.compile(r"^stall_(\w+)$")  # "stall_x (Not Issued)" columns do not match


def _shares(by: dict[str, float], total: float, top: int, floor: float) -> str:
    """The ``top`` largest of ``by`` (at least ``floor``; ties by name) as % of ``total``."""
    found = sorted((-v, k) for k, v in by.items() if v >= floor and v > 0)[:top]
    return ", ".join(f"{k} {-v / total * 100:.0f}%" for v, k in found)


def _reasons(rows: list[dict[str, str]], total: float, top: int) -> str:
    """The main stall reasons of some instructions, as % of their samples (≥ 0.5 %)."""
    by: dict[str, float] = {}
    for row in rows:
        for col, text in row.items():
            m = SOURCE_STALL.match(col or "")
            if m:
                by[m.group(1)] = by.get(m.group(1), 0.0) + (number(text) or 0.0)
    return _shares(by, total, top, total / 200)


def _opcode_mix(rows: list[dict[str, str]], sass: list[str], top: int) -> str:
    """The most executed opcodes of some instructions (predicate and modifiers dropped), as %
    of the warp-level instructions they executed."""
    by: dict[str, float] = {}
    for row, line in zip(rows, sass, strict=True):
        words = line.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words:
            op = words[0].split(".")[0]
            by[op] = by.get(op, 0.0) + (number(row.get(EXECUTED, "")) or 0.0)
    total = sum(by.values())
    return _shares(by, total, top, 0.0) if total else "-"


def summarise_source(name: str, rows: list[dict[str, str]], top: int) -> str:
    """Where a kernel's warp-stall samples fall: per SASS region, then per instruction."""
    sass = [" ".join(r.get("Source", "").split()) for r in rows]
    samples = [number(r.get(SAMPLES, "")) or 0.0 for r in rows]
    total = sum(samples)
    if not total:
        raise SystemExit(
            f"{name}: no warp-stall samples (was the kernel profiled with --set full?)"
        )
    mmas = ("HGMMA", "QGMMA", "IGMMA", "HMMA")
    out = [f"== {name[:100]}: {int(total):,} samples over {len(rows):,} SASS instructions"]
    cuts = [i for i, line in enumerate(sass) if "USETMAXREG" in line]
    bounds = sorted({0, *cuts, len(rows)})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        share = sum(samples[lo:hi])
        if share / total < 0.005:
            continue
        hot = max(range(lo, hi), key=lambda i: samples[i])
        n_mma = sum(any(m in line for m in mmas) for line in sass[lo:hi])
        after = f" (after {sass[hot - 1][:40]})" if hot > 0 else ""
        out.append(
            f"   SASS [{lo}, {hi}): {share / total * 100:.1f} % of samples, {n_mma} MMA; "
            f"{_reasons(rows[lo:hi], share, top)}; hottest {sass[hot][:40]}{after}"
        )
        if n_mma:  # a working partition: what its warps spend their issue slots on
            out.append(f"      executed: {_opcode_mix(rows[lo:hi], sass[lo:hi], top)}")
    out.append("   hottest instructions:")
    for i in sorted(range(len(rows)), key=lambda i: -samples[i])[:top]:
        out.append(
            f"   {i:6d} {samples[i] / total * 100:5.2f} % {sass[i][:56]:56s} "
            f"{_reasons([rows[i]], samples[i], 2)}"
        )
    return "\n".join(out)


def read_source(path: Path) -> tuple[str, list[dict[str, str]]]:
    """ncu's source page CSV: a ("Kernel Name", name) row, a header, one row per instruction."""
    with path.open(newline="") as f:
        table = list(csv.reader(f))
    if len(table) < 3 or not table[0] or table[0][0] != "Kernel Name":
        raise SystemExit(f"{path}: not a source page (ncu --page source --csv) of one kernel")
    head = table[1]
    return table[0][1], [dict(zip(head, r, strict=False)) for r in table[2:] if r]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--top", type=int, default=8, help="pipes and stalls shown per kernel")
    ap.add_argument("--source", action="store_true", help="the CSV is one kernel's source page")
    args = ap.parse_args(argv)
    if args.source:
        print(summarise_source(*read_source(args.csv), args.top))
        return 0
    rows, units = read(args.csv)
    print(summarise(rows, units, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
