"""Loading the item bank shipped with kgrade (``item_bank/quizzes/*.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from item_bank.model import Quiz
from item_bank.schema import BankError, load_quiz

QUIZ_DIR = Path(__file__).resolve().parent / "quizzes"
EXERCISE_DIR = Path(__file__).resolve().parent / "exercises"


class UnknownQuiz(KeyError):
    def __init__(self, quiz_id: str, known: list[str]) -> None:
        super().__init__(quiz_id)
        self.quiz_id = quiz_id
        self.known = known

    def __str__(self) -> str:
        return f"unknown quiz {self.quiz_id!r}; known quizzes: {', '.join(self.known) or 'none'}"


@dataclass(frozen=True)
class BankReport:
    quizzes: tuple[Quiz, ...]
    errors: tuple[str, ...]


def load_file(path: Path) -> Quiz:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise BankError([f"{path.name}: cannot read: {exc}".splitlines()[0]]) from None
    quiz = load_quiz(data, source=path.name)
    if path.stem != quiz.id:
        raise BankError([f"{path.name}: id: quiz id {quiz.id!r} must match the file name"])
    return quiz


def check_bank(directory: Path = QUIZ_DIR) -> BankReport:
    """Load every quiz file, collecting all errors instead of stopping at the first."""
    quizzes: list[Quiz] = []
    errors: list[str] = []
    for path in sorted(directory.glob("*.yaml")):
        try:
            quizzes.append(load_file(path))
        except BankError as exc:
            errors.extend(exc.messages)
    if not quizzes and not errors:
        errors.append(f"{directory}: no quiz files (*.yaml)")
    return BankReport(tuple(quizzes), tuple(errors))


@lru_cache(maxsize=1)
def _bank() -> dict[str, Quiz]:
    report = check_bank()
    if report.errors:
        raise BankError(list(report.errors))
    return {q.id: q for q in report.quizzes}


def quiz_ids() -> list[str]:
    return sorted(_bank())


def get_quiz(quiz_id: str) -> Quiz:
    bank = _bank()
    try:
        return bank[quiz_id]
    except KeyError:
        raise UnknownQuiz(quiz_id, sorted(bank)) from None


def all_quizzes() -> list[Quiz]:
    return [q for _, q in sorted(_bank().items())]
