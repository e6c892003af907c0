"""How steady each known solution's verdict is across grader secrets (CPU, tests phase only).

CI grades every known solution once, under a fresh random secret, so a wrong solution that the
hidden cases catch only on some draws fails CI now and then instead of every time (CI at
``91c727b``: nsa-backward's ``wrong/own_selection`` graded PASS; 7 secrets in 300 let it
through before the fix). This script grades each solution whose verdict the tests phase decides
(no ``# needs:`` line) under N fixed secrets and prints how often each verdict came:

    python3 benchmarks/verdict_stability.py --secrets 12 [--exercises nsa-backward ...]

It exits 1 when any grading disagrees with the solution's ``# expect:`` line. Solutions
expecting TIMEOUT are graded once (their verdict does not depend on the cases and each waits
out its limit). The secrets are fixed (``sha256(b"verdict-stability/<i>")``), so a flake it
finds can be replayed with ``grade(..., secret=...)``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.exercises import base_exercises, load_exercise  # noqa: E402
from workers.harness import grade  # noqa: E402
from workers.verdicts import Verdict  # noqa: E402


def secret(i: int) -> bytes:
    return hashlib.sha256(f"verdict-stability/{i}".encode()).digest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--secrets", type=int, default=12, help="secrets per solution (default 12)")
    ap.add_argument("--exercises", nargs="+", help="exercise ids (default: all but variants)")
    ap.add_argument("--jobs", type=int, default=2, help="gradings at once (default 2)")
    args = ap.parse_args(argv)

    ids = args.exercises or base_exercises()
    todo = []  # (exercise, solution, secret index)
    for ex_id in ids:
        for sol in load_exercise(ex_id).solutions():
            if sol.needs is None:
                n = 1 if sol.expected is Verdict.TIMEOUT else args.secrets
                todo += [(ex_id, sol, i) for i in range(n)]

    def run(item):  # type: ignore[no-untyped-def]
        ex_id, sol, i = item
        r = grade(ex_id, sol.source(), device="cpu", secret=secret(i), timed=False)
        return f"{ex_id}:{sol.name}", sol.expected, i, r.verdict

    t0 = time.monotonic()
    seen: dict[str, Counter[str]] = {}
    expected: dict[str, Verdict] = {}
    off: list[str] = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for key, want, i, got in pool.map(run, todo):
            seen.setdefault(key, Counter())[got.value] += 1
            expected[key] = want
            if got is not want:
                off.append(f"{key}: secret {i} gave {got.value}, expected {want.value}")

    print(f"# verdict_stability.py: {len(todo)} gradings in {time.monotonic() - t0:.0f} s")
    print("| solution | expected | verdicts (count) | steady |")
    print("|---|---|---|---|")
    for key, counts in seen.items():
        got = ", ".join(f"{v} {c}" for v, c in counts.most_common())
        steady = "yes" if set(counts) == {expected[key].value} else "**no**"
        print(f"| {key} | {expected[key].value} | {got} | {steady} |")
    for line in off:
        print(line)
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
