"""``kgrade grade-exercise`` and ``kgrade exercises list``: the grading harness without Celery."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from workers.exercises import ExerciseError, list_exercises, load_exercise


@click.command("grade-exercise")
@click.argument("exercise_id")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda"]),
    default="cpu",
    show_default=True,
    help="Where the submission runs; speed is measured only on cuda.",
)
@click.option("--json", "as_json", is_flag=True, help="Print results.json instead of a summary.")
@click.option("--public-only", is_flag=True, help="Only the public test cases (quick feedback).")
def grade_exercise(
    exercise_id: str, file: Path, device: str, as_json: bool, public_only: bool
) -> None:
    """Grade FILE against EXERCISE_ID. Exit 0 on PASS, 1 on any other verdict, 2 on bad usage."""
    from workers.harness import grade

    try:
        load_exercise(exercise_id)
    except ExerciseError as e:
        raise click.UsageError(str(e)) from e
    if not file.is_file():
        raise click.UsageError(f"no such file: {file}")
    result = grade(exercise_id, file.read_bytes(), device=device, only_public=public_only)
    doc = result.to_results_json()
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(
            f"{exercise_id}: {result.verdict.value}  score {doc['score']:.3f}  "
            f"({result.isolation}, {result.elapsed_s:.1f} s)"
        )
        for t in doc["tests"]:
            mark = "ok  " if t["status"] == "passed" else "FAIL"
            line = f"  {mark} {t['name']}"
            if t["output"] and t["status"] == "failed":
                line += f": {t['output'].splitlines()[0][:160]}"
            click.echo(line)
        for tm in result.timings:
            sp = f"{tm.speedup:.3f}x" if tm.speedup is not None else "-"
            click.echo(f"  time {tm.name}: median {tm.median_ms:.4f} ms (n={tm.n}), speedup {sp}")
        if result.verdict.value != "PASS":
            click.echo(result.output, err=True)
    sys.exit(0 if result.passed else 1)


@click.group("exercises")
def exercises() -> None:
    """Kernel exercises in the item bank."""


@exercises.command("list")
def exercises_list() -> None:
    """List exercise ids with their entry point and known solutions."""
    for ex_id in list_exercises():
        ex = load_exercise(ex_id)
        click.echo(f"{ex_id}\t{ex.signature}\t{len(ex.solutions())} solutions")
