"""Quizzes in the database: bank import, instructor create/update with revision bumps, lookup.

Each quiz row holds its current version in the item bank's data-file form (``dump_quiz``), so
the API accepts, stores and returns exactly the schema of ``item_bank/quizzes/*.yaml`` and
``load_quiz`` stays the only validator. Every change to an item's content bumps that item's
revision (and any change bumps the quiz revision); each item revision is kept in
``item_revisions`` so attempts can name the key they were graded against.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from item_bank import BankError, Quiz, check_bank, dump_quiz, load_quiz
from item_bank.schema import ID_RE
from service.db.base import utcnow
from service.db.prepared import Prepared
from service.db.quizzes import ItemRevision, QuizRecord


class QuizNotFound(KeyError):
    def __init__(self, quiz_id: str) -> None:
        super().__init__(quiz_id)
        self.quiz_id = quiz_id

    def __str__(self) -> str:
        return f"unknown quiz {self.quiz_id!r}"


class QuizExists(ValueError):
    pass


# Parsed quizzes by (id, revision, updated_at): re-validating the stored JSON on every request
# would dominate the cost of answering an item. The key changes with every write, so a stale
# entry is never returned; the bound keeps memory flat.
_CACHE: OrderedDict[tuple[str, int, str], Quiz] = OrderedDict()
_CACHE_SIZE = 256


def _cache_put(key: tuple[str, int, str], quiz: Quiz) -> None:
    _CACHE[key] = quiz
    _CACHE.move_to_end(key)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)


#: session.info key: the quiz rows' versions a query of the current transaction already read
_SEEN = "kgrade.quiz_versions"


def note_version(session: Session, quiz_id: str, revision: int, updated_at: datetime) -> None:
    """What a query of this transaction read of quiz ``quiz_id``'s row beside something else
    (an attempt joined to its quiz): ``get_quiz`` then knows whether its cached copy is current
    without a query of its own, in this transaction only."""
    session.info.setdefault(_SEEN, {})[quiz_id] = (session.get_transaction(), revision, updated_at)


def _content(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False)


def _item_content(item: dict[str, Any]) -> str:
    return _content({k: v for k, v in item.items() if k != "revision"})


def _quiz_content(data: dict[str, Any]) -> str:
    return _content(
        {
            **{k: v for k, v in data.items() if k not in ("revision", "items")},
            "items": [_item_content(i) for i in data["items"]],
        }
    )


_QUIZ_ID = re.compile(ID_RE)
_Q = QuizRecord.__table__.c
#: the quiz row's version: starting an attempt reads it to find its parsed quiz in the cache
_VERSION = Prepared(select(_Q.revision, _Q.updated_at).where(_Q.id == bindparam("quiz_id")))
_VERSION_FOR_UPDATE = Prepared(_VERSION.stmt.with_for_update())  # type: ignore[attr-defined]


def get_quiz(session: Session, quiz_id: str, *, for_update: bool = False) -> Quiz:
    if not _QUIZ_ID.match(quiz_id):
        # Not a possible id: answer without a query (PostgreSQL rejects NUL bytes in text with
        # an error, which must stay a 404 and not become a 500).
        raise QuizNotFound(quiz_id)
    seen = None if for_update else session.info.get(_SEEN, {}).get(quiz_id)
    if seen is not None and seen[0] is not None and seen[0] is session.get_transaction():
        revision, updated_at = seen[1], seen[2]
    else:
        stmt = _VERSION_FOR_UPDATE if for_update else _VERSION
        row = stmt.execute(session.connection(), {"quiz_id": quiz_id}).first()
        if row is None:
            raise QuizNotFound(quiz_id)
        revision, updated_at = row.revision, row.updated_at
    key = (quiz_id, revision, updated_at.isoformat())
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    data = session.execute(select(QuizRecord.data).where(QuizRecord.id == quiz_id)).scalar_one()
    quiz = load_quiz(data, source=f"quiz {quiz_id}")
    _cache_put(key, quiz)
    return quiz


def list_quizzes(session: Session) -> list[Quiz]:
    ids = session.execute(select(QuizRecord.id).order_by(QuizRecord.id)).scalars().all()
    return [get_quiz(session, i) for i in ids]


@dataclass
class RevisionReport:
    quiz: Quiz
    created: bool = False
    quiz_revision_before: int | None = None
    changed_items: list[tuple[str, int, int]] = field(default_factory=list)  # id, old, new
    added_items: list[str] = field(default_factory=list)
    removed_items: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.created or self.quiz_revision_before != self.quiz.revision


def _latest_history(session: Session, quiz_id: str) -> dict[str, ItemRevision]:
    rows = session.execute(
        select(ItemRevision)
        .where(ItemRevision.quiz_id == quiz_id)
        .order_by(ItemRevision.item_id, ItemRevision.revision)
    ).scalars()
    return {r.item_id: r for r in rows}  # the last (highest) revision per item wins


def _apply_revisions(session: Session, old: Quiz | None, new: Quiz, report: RevisionReport) -> Quiz:
    """Give ``new`` the item and quiz revisions its changes against ``old`` call for."""
    old_items = {it["id"]: it for it in dump_quiz(old)["items"]} if old else {}
    history = _latest_history(session, new.id) if old else {}
    new_data = dump_quiz(new)
    items = []
    for it_obj, it in zip(new.items, new_data["items"], strict=True):
        before = old_items.get(it["id"])
        if before is not None:
            if _item_content(before) == _item_content(it):
                rev = before["revision"]
            else:
                rev = before["revision"] + 1
                report.changed_items.append((it["id"], before["revision"], rev))
        else:
            report.added_items.append(it["id"])
            past = history.get(it["id"])
            if past is None:
                rev = it["revision"]
            elif _item_content(past.data) == _item_content(it):
                rev = past.revision
            else:
                rev = past.revision + 1
        items.append(replace(it_obj, revision=rev))
    if old is not None:
        report.removed_items = [i for i in old_items if i not in {it.id for it in new.items}]
        same = _quiz_content(dump_quiz(old)) == _quiz_content(new_data)
        quiz_rev = old.revision if same else old.revision + 1
    else:
        quiz_rev = new.revision
    return replace(new, items=tuple(items), revision=quiz_rev)


def _record_items(session: Session, quiz: Quiz) -> None:
    known = set(
        session.execute(
            select(ItemRevision.item_id, ItemRevision.revision).where(
                ItemRevision.quiz_id == quiz.id
            )
        ).all()
    )
    for it in dump_quiz(quiz)["items"]:
        if (it["id"], it["revision"]) not in known:
            session.add(
                ItemRevision(quiz_id=quiz.id, item_id=it["id"], revision=it["revision"], data=it)
            )


def parse_quiz_data(data: Any, *, quiz_id: str | None = None) -> Quiz:
    """Validate an API body as quiz data; ``quiz_id`` (from the URL) fills in or must match id."""
    if isinstance(data, dict) and quiz_id is not None:
        data = dict(data)
        body_id = data.setdefault("id", quiz_id)
        if body_id != quiz_id:
            raise BankError(
                [f"id: the body's id {body_id!r} differs from the URL's {quiz_id!r}"],
                {"id": [f"must equal the quiz id in the URL ({quiz_id!r})"]},
            )
    return load_quiz(data, source="request body")


def create_quiz(session: Session, quiz: Quiz, *, origin: str = "api") -> RevisionReport:
    if session.get(QuizRecord, quiz.id) is not None:
        raise QuizExists(f"quiz {quiz.id!r} already exists; PUT /api/v1/quizzes/{quiz.id}")
    report = RevisionReport(quiz=quiz, created=True)
    quiz = _apply_revisions(session, None, quiz, report)
    data = dump_quiz(quiz)
    now = utcnow()
    session.add(
        QuizRecord(
            id=quiz.id,
            revision=quiz.revision,
            data=data,
            origin=origin,
            bank_hash=_hash(data) if origin == "bank" else None,
            created_at=now,
            updated_at=now,
        )
    )
    session.flush()
    _record_items(session, quiz)
    report.quiz = quiz
    report.added_items = [it.id for it in quiz.items]
    return report


def update_quiz(
    session: Session, quiz_id: str, new: Quiz, *, origin: str = "api"
) -> RevisionReport:
    rec = (
        session.get(QuizRecord, quiz_id, with_for_update=True) if _QUIZ_ID.match(quiz_id) else None
    )
    if rec is None:
        raise QuizNotFound(quiz_id)
    old = load_quiz(rec.data, source=f"quiz {quiz_id}")
    report = RevisionReport(quiz=new, quiz_revision_before=old.revision)
    quiz = _apply_revisions(session, old, new, report)
    report.quiz = quiz
    if quiz.revision != old.revision:
        data = dump_quiz(quiz)
        rec.data = data
        rec.revision = quiz.revision
        rec.updated_at = utcnow()
        rec.origin = origin
        rec.bank_hash = _hash(data) if origin == "bank" else None
        _record_items(session, quiz)
    session.flush()
    return report


def _hash(data: dict[str, Any]) -> str:
    return hashlib.sha256(_quiz_content(data).encode()).hexdigest()


@dataclass
class BankSync:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # edited by instructors: the bank yields
    errors: list[str] = field(default_factory=list)


def sync_bank(session: Session, quizzes: list[Quiz] | None = None) -> BankSync:
    """Bring the shipped item bank into the database.

    New bank quizzes are inserted; a quiz still as the bank last shipped it is updated (with
    revision bumps) when the bank file changed; one an instructor has edited is left alone.
    """
    out = BankSync()
    if quizzes is None:
        report = check_bank()
        quizzes = list(report.quizzes)
        # An empty bank directory is not an error for the service (quizzes can come via the API).
        out.errors = [e for e in report.errors if "no quiz files" not in e]
    for quiz in quizzes:
        rec = session.get(QuizRecord, quiz.id)
        if rec is None:
            create_quiz(session, quiz, origin="bank")
            out.created.append(quiz.id)
        elif rec.origin != "bank" or rec.bank_hash != _hash(rec.data):
            out.kept.append(quiz.id)
        elif _quiz_content(rec.data) != _quiz_content(dump_quiz(quiz)):
            update_quiz(session, quiz.id, quiz, origin="bank")
            out.updated.append(quiz.id)
    session.flush()
    return out


def quiz_count(session: Session) -> int:
    return session.execute(select(func.count()).select_from(QuizRecord)).scalar_one()


def item_history(session: Session, quiz_id: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for item_id, rev in session.execute(
        select(ItemRevision.item_id, ItemRevision.revision)
        .where(ItemRevision.quiz_id == quiz_id)
        .order_by(ItemRevision.item_id, ItemRevision.revision)
    ).all():
        out.setdefault(item_id, []).append(rev)
    return out
