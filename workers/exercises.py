"""Exercise folders: ``item_bank/exercises/<id>/`` with spec.yaml, README.md, starter.py, solutions/.

spec.yaml holds everything the grader needs except the hidden cases themselves: those are drawn
by the checker from generator parameters (``hidden:``) and a server secret at grading time.

A variant is a folder with only a spec.yaml that says ``variant_of: <id>``: the same exercise
(statement, starter, reference, known solutions: the base's folder) graded with the top-level
keys it lists replacing the base's, e.g. ``ring-attention-x4``, the ring with ``world_size: 4``
(queue ``gpu-x4``). It is an exercise of its own to instructors, the leaderboard and the cached
baselines, since its timings are not comparable with the base's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workers.verdicts import Verdict

EXERCISES_DIR = Path(__file__).resolve().parents[1] / "item_bank" / "exercises"
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_EXPECT = re.compile(r"^#\s*expect:\s*([A-Z_]+)\s*$")
_NEEDS = re.compile(r"^#\s*needs:\s*(benchmark|gpu)\s*$")
_INCLUDE = re.compile(r"^#\s*include:\s*(\S+)\s*$")

DEFAULT_LIMITS = {"import_s": 120.0, "tests_s": 180.0, "benchmark_s": 300.0}
# Modules a submission must not import (spec §4 "import denylist"): the reference, the grader
# and vendor attention kernels that would make the exercise trivial.
DEFAULT_FORBIDDEN = (
    "kernels",
    "workers",
    "service",
    "item_bank",
    "flash_attn",
    "xformers",
    "torch.nn.attention",
    "fla",
    "native_sparse_attention",
)


class ExerciseError(ValueError):
    pass


@dataclass
class Solution:
    path: Path
    expected: Verdict
    #: What shows the expected verdict, from an optional second header line ``# needs: ...``:
    #: ``benchmark`` (the timed loop: CI grades it with the CPU rehearsal of that loop) or
    #: ``gpu`` (only a GPU can show it: graded in the GPU pipeline, skipped on CPU). None: the
    #: tests phase alone decides.
    needs: str | None = None

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.stem}"

    def includes(self) -> list[Path]:
        """The files its ``# include: PATH`` lines name (relative to the solution's folder)."""
        out = []
        for line in self.path.read_text().splitlines():
            m = _INCLUDE.match(line)
            if m:
                out.append((self.path.parent / m.group(1)).resolve())
        return out

    @property
    def base(self) -> str | None:
        """The correct solution it builds on (``correct/NAME``), if it includes one."""
        for p in self.includes():
            if p.parent.name == "correct" and p.parent.parent == self.path.parent.parent:
                return f"correct/{p.stem}"
        return None

    def source(self) -> str:
        """The solution as graded: one file, each ``# include:`` line replaced by that file's
        text (the timing cheats share one copy of the honest solution and of their helpers;
        the sandbox sees only the submission's file)."""
        out = []
        for line in self.path.read_text().splitlines(keepends=True):
            m = _INCLUDE.match(line.rstrip("\n"))
            if m:
                inc = (self.path.parent / m.group(1)).resolve()
                if not inc.is_relative_to(EXERCISES_DIR.resolve()):
                    raise ExerciseError(f"{self.path}: include outside the exercises: {inc}")
                text = inc.read_text()
                out.append(f"# --- {m.group(1)}\n{text}" + ("" if text.endswith("\n") else "\n"))
            else:
                out.append(line)
        return "".join(out)


@dataclass
class Exercise:
    id: str
    title: str
    problem: str  # checker module: workers.problems.<problem>
    entry: str
    signature: str
    path: Path
    public_cases: list[dict[str, Any]]
    hidden: dict[str, Any]
    benchmark: list[dict[str, Any]]
    tolerance: dict[str, Any]
    limits: dict[str, float]
    scoring: dict[str, Any]
    world_size: int = 1
    #: The exercise this one grades differently (``path`` is then the base's folder).
    variant_of: str | None = None
    forbidden_imports: tuple[str, ...] = DEFAULT_FORBIDDEN
    forbidden_calls: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)
    # CPU rehearsal shapes: tiny, wall-clock timed, only to exercise the benchmark loop in CI
    rehearsal: list[dict[str, Any]] = field(default_factory=list)
    #: Submissions run a backward (``autograd: true``): the benchmark's runners start the
    #: autograd engine's threads in their warm-up, before the thread count they are held to.
    autograd: bool = False

    @property
    def readme(self) -> str:
        p = self.path / "README.md"
        return p.read_text() if p.exists() else ""

    @property
    def starter(self) -> Path:
        return self.path / "starter.py"

    @property
    def reference(self) -> Path:
        """Trusted solution wrapping ``kernels``: timed as the speed baseline (never sandboxed
        with the denylist: it is ours)."""
        return self.path / "reference.py"

    def cheat_bases(self) -> set[str]:
        """The correct solutions (``correct/NAME``) its timing cheats build on."""
        return {s.base for s in self.solutions() if s.needs and s.base}

    def solutions(self) -> list[Solution]:
        out = []
        for sub, default in (("correct", Verdict.PASS), ("wrong", None)):
            for f in sorted((self.path / "solutions" / sub).glob("*.py")):
                out.append(Solution(f, expected_verdict(f, default), solution_needs(f)))
        return out


def expected_verdict(path: Path, default: Verdict | None = None) -> Verdict:
    first = path.read_text().splitlines()[:1]
    m = _EXPECT.match(first[0]) if first else None
    if m:
        return Verdict(m.group(1))
    if default is None:
        raise ExerciseError(f"{path}: first line must be '# expect: VERDICT'")
    return default


def solution_needs(path: Path) -> str | None:
    for line in path.read_text().splitlines()[1:3]:
        m = _NEEDS.match(line)
        if m:
            return m.group(1)
    return None


def list_exercises(root: Path = EXERCISES_DIR) -> list[str]:
    return (
        sorted(p.name for p in root.iterdir() if (p / "spec.yaml").is_file())
        if root.is_dir()
        else []
    )


def base_exercises(root: Path = EXERCISES_DIR) -> list[str]:
    """The exercises that are not variants (``variant_of``): each known solution once, not
    again at a variant's other world size."""
    return [e for e in list_exercises(root) if load_exercise(e, root).variant_of is None]


def load_exercise(exercise_id: str, root: Path = EXERCISES_DIR) -> Exercise:
    return _load(exercise_id, root, variant_ok=True)


def _load(exercise_id: str, root: Path, *, variant_ok: bool) -> Exercise:
    if not _ID.match(exercise_id):
        raise ExerciseError(f"bad exercise id {exercise_id!r}")
    folder = root / exercise_id
    spec_file = folder / "spec.yaml"
    if not spec_file.is_file():
        raise ExerciseError(
            f"unknown exercise {exercise_id!r} (known: {', '.join(list_exercises(root))})"
        )
    spec = yaml.safe_load(spec_file.read_text())
    if not isinstance(spec, dict):
        raise ExerciseError(f"{spec_file}: not a mapping")
    variant_of = spec.get("variant_of")
    if variant_of is not None:
        if not variant_ok:
            raise ExerciseError(f"{spec_file}: a variant's base cannot be a variant itself")
        if variant_of == exercise_id:
            raise ExerciseError(f"{spec_file}: variant_of names the exercise itself")
        try:
            base = _load(str(variant_of), root, variant_ok=False)
        except ExerciseError as e:
            raise ExerciseError(f"{spec_file}: variant_of {variant_of!r}: {e}") from e
        # The base's spec with this one's top-level keys on top; the files stay the base's.
        spec = {**base.raw, **{k: v for k, v in spec.items() if k != "variant_of"}}
        folder = base.path
    try:
        limits = {
            **DEFAULT_LIMITS,
            **{k: float(v) for k, v in (spec.get("time_limits") or {}).items()},
        }
        return Exercise(
            id=exercise_id,
            title=str(spec["title"]),
            problem=str(spec["problem"]),
            entry=str(spec["entry"]),
            signature=str(spec["signature"]),
            path=folder,
            public_cases=list(spec.get("public_cases") or []),
            hidden=dict(spec["hidden"]),
            benchmark=list(spec.get("benchmark") or []),
            rehearsal=list(spec.get("rehearsal_benchmark") or []),
            tolerance=dict(spec["tolerance"]),
            limits=limits,
            scoring={
                "correctness_weight": 0.5,
                "speed_weight": 0.5,
                "clamp": 4.0,
                "target": 1.0,
                **(spec.get("scoring") or {}),
            },
            world_size=int(spec.get("world_size", 1)),
            variant_of=str(variant_of) if variant_of is not None else None,
            forbidden_imports=tuple(spec.get("forbidden_imports") or DEFAULT_FORBIDDEN),
            raw=spec,
            autograd=bool(spec.get("autograd", False)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ExerciseError(f"{spec_file}: {e!r}") from e
