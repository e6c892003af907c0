"""``kgrade import``: read a quiz from an LMS file into the item bank's YAML form.

The YAML goes to standard output unless ``-o`` names a file; an existing file is never
overwritten without ``--force``, so an import cannot replace a bank quiz by accident. Warnings
(what the file's format could not carry, what was skipped) go to standard error and, with
``-o``, also to comments at the top of the file.
"""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from item_bank import dump_quiz, quiz_ids
from service.imports import ImportFailed, ImportResult, import_quiz


def quiz_yaml(result: ImportResult, source: str) -> str:
    head = [f"# Imported by `kgrade import` from {source} ({result.format})."]
    if result.warnings:
        head.append(f"# {len(result.warnings)} warning(s):")
        head += [f"#   - {w}" for w in result.warnings]
    body = yaml.safe_dump(dump_quiz(result.quiz), allow_unicode=True, sort_keys=False, width=100)
    return "\n".join(head) + "\n" + body


@click.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--quiz-id", default=None, help="Id for the imported quiz (default: from the file).")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="YAML file to write (default: standard output).",
)
@click.option("--force", is_flag=True, help="Overwrite OUTPUT if it exists.")
def import_cmd(file: Path, quiz_id: str | None, output: Path | None, force: bool) -> None:
    """Import FILE (Moodle XML, Canvas QTI 1.2 zip, QTI 2.1 package, .imscc) as quiz YAML."""
    if output is not None and output.exists() and not force:
        raise click.ClickException(f"{output} exists; pass --force to overwrite it")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise click.ClickException(f"cannot read {file}: {exc.strerror or exc}") from None
    try:
        result = import_quiz(data, file.name, quiz_id=quiz_id)
    except ImportFailed as exc:
        for w in exc.warnings:
            click.echo(f"warning  {w}", err=True)
        option = "--quiz-id" if exc.field == "quiz_id" else "FILE"
        raise click.ClickException(f"{option}: {exc}") from None
    for w in result.warnings:
        click.echo(f"warning  {w}", err=True)
    try:
        if result.quiz.id in quiz_ids():
            click.echo(
                f"note  the item bank already has a quiz {result.quiz.id!r}; "
                "use --quiz-id to import it beside that one",
                err=True,
            )
    except Exception:  # noqa: BLE001 - an unreadable bank must not block an import
        pass
    text = quiz_yaml(result, file.name)
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from None
    n = len(result.quiz.items)
    click.echo(
        f"wrote {output} ({result.format}: {n} question(s), {len(result.warnings)} warning(s))",
        err=True,
    )
