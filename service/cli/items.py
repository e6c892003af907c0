"""``kgrade items``: validate, list and show the item bank."""

from __future__ import annotations

import json
import sys

import click

from item_bank import BankError, UnknownQuiz, check_bank, get_quiz
from item_bank.model import Quiz, Text


@click.group()
def items() -> None:
    """Work with the item bank (quizzes kept as data)."""


@items.command("validate")
def validate_cmd() -> None:
    """Validate every quiz file; exit 1 with one line per problem."""
    report = check_bank()
    for q in report.quizzes:
        click.echo(f"ok  {q.id}: {len(q.items)} items, {q.points_possible:g} points")
    if report.errors:
        for line in report.errors:
            click.echo(f"error  {line}", err=True)
        click.echo(f"{len(report.errors)} problem(s) in the item bank", err=True)
        sys.exit(1)


def _bank_or_exit() -> list[Quiz]:
    report = check_bank()
    if report.errors:
        raise click.ClickException(
            "the item bank is invalid; run `kgrade items validate`: " + report.errors[0]
        )
    return list(report.quizzes)


@items.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_cmd(as_json: bool) -> None:
    """List the quizzes in the bank."""
    quizzes = _bank_or_exit()
    rows = [
        {
            "id": q.id,
            "title": q.title.en,
            "source_lang": q.source_lang,
            "items": len(q.items),
            "points": q.points_possible,
            "revision": q.revision,
        }
        for q in quizzes
    ]
    if as_json:
        click.echo(json.dumps(rows, ensure_ascii=False, indent=2))
        return
    for r in rows:
        click.echo(
            f"{r['id']:<24} {r['items']:>2} items  {r['points']:>4g} pts  "
            f"[{r['source_lang']}]  {r['title']}"
        )


def _texts(t: Text, source_lang: str) -> dict[str, object]:
    return {
        "lang": t.lang,
        "source": t.source_form(source_lang)[1],
        "texts": t.variants(source_lang),
    }


def quiz_as_json(q: Quiz) -> dict[str, object]:
    """The instructor's full view of a quiz: every language and the answer key."""
    return {
        "id": q.id,
        "revision": q.revision,
        "source_lang": q.source_lang,
        "source_file": q.source_file,
        "title": _texts(q.title, q.source_lang),
        "description": _texts(q.description, q.source_lang),
        "points_possible": q.points_possible,
        "items": [
            {
                "id": it.id,
                "type": it.type,
                "points": it.points,
                "revision": it.revision,
                "topics": list(it.topics),
                "prompt": _texts(it.prompt, q.source_lang),
                "correct": list(it.correct_ids),
                "options": [
                    {
                        "id": o.id,
                        "correct": o.correct,
                        "text": _texts(o.text, q.source_lang),
                        "feedback": _texts(o.feedback, q.source_lang) if o.feedback else None,
                    }
                    for o in it.options
                ],
                "explanation": _texts(it.explanation, q.source_lang),
            }
            for it in q.items
        ],
    }


@items.command("show")
@click.argument("quiz_id")
@click.option("--json", "as_json", is_flag=True, help="Print the whole quiz as JSON.")
@click.option("--lang", type=click.Choice(["en", "source"]), default="en", show_default=True)
def show_cmd(quiz_id: str, as_json: bool, lang: str) -> None:
    """Show one quiz with its items, options, texts and answer key."""
    try:
        q = get_quiz(quiz_id)
    except UnknownQuiz as exc:
        raise click.ClickException(str(exc)) from None
    except BankError as exc:
        raise click.ClickException(exc.messages[0]) from None
    if as_json:
        click.echo(json.dumps(quiz_as_json(q), ensure_ascii=False, indent=2))
        return
    click.echo(f"{q.id}  rev {q.revision}  {q.title.render(lang, q.source_lang)[1]}")
    for it in q.items:
        click.echo(f"\n{it.id}. {it.prompt.render(lang, q.source_lang)[1]}  ({it.points:g} pt)")
        for o in it.options:
            mark = "*" if o.correct else " "
            click.echo(f"  {mark} {o.id}) {o.text.render(lang, q.source_lang)[1]}")
        click.echo(f"  -> {it.explanation.render(lang, q.source_lang)[1]}")
