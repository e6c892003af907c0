"""``kgrade export``: write one quiz as an LMS import file (the same bytes as the REST API)."""

from __future__ import annotations

from pathlib import Path

import click

from item_bank import BankError, UnknownQuiz, get_quiz
from service.exports import FORMATS, LANG_MODES, MLANG_SYNTAXES, export_quiz
from service.exports.validate import validate_export


@click.command("export")
@click.argument("quiz_id")
@click.option(
    "--format", "fmt", type=click.Choice(list(FORMATS)), required=True, help="Target format."
)
@click.option(
    "--lang",
    type=click.Choice(list(LANG_MODES)),
    default="en",
    show_default=True,
    help="en: English; source: each string's source form; all: every language.",
)
@click.option(
    "--mlang",
    type=click.Choice(list(MLANG_SYNTAXES)),
    default="spans",
    show_default=True,
    help="Moodle targets with --lang all: core multilang spans or {mlang} (filter_multilang2).",
)
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="File to write.",
)
@click.option(
    "--check", is_flag=True, help="Validate against the official schemas; fail on problems."
)
def export(quiz_id: str, fmt: str, lang: str, mlang: str, output: Path, check: bool) -> None:
    """Export QUIZ_ID for Canvas (qti12, qti21) or Moodle (moodle-mbz, moodle-xml, imscc).

    For a graded Moodle quiz use moodle-mbz (a quiz backup: course → Restore); moodle-xml fills
    only the question bank, and imscc restores with every mark set to 1 and a total of 4.
    """
    try:
        quiz = get_quiz(quiz_id)
    except UnknownQuiz as exc:
        raise click.ClickException(str(exc)) from None
    except BankError as exc:
        raise click.ClickException(f"the item bank is invalid: {exc.messages[0]}") from None
    try:
        result = export_quiz(quiz, fmt, lang, mlang=mlang)
    except ValueError as exc:
        raise click.ClickException(str(exc).splitlines()[0]) from None
    if check:
        try:
            problems = validate_export(fmt, result.data)
        except FileNotFoundError as exc:
            raise click.ClickException(str(exc)) from None
        if problems:
            for line in problems:
                click.echo(f"invalid  {line}", err=True)
            # Nothing is written: a file that fails its check must not reach an LMS by accident.
            raise click.ClickException(
                f"{len(problems)} validation problem(s); {output} not written"
            )
    try:
        output.write_bytes(result.data)
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from None
    note = ", checked" if check else ""
    click.echo(f"wrote {output} ({len(result.data)} bytes, {result.media_type}{note})")
