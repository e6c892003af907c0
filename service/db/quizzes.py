"""Quizzes as stored data: the data-file JSON of the current version, and every item revision."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base, UTCDateTime, utcnow


class QuizRecord(Base):
    """The current version of one quiz, in the item bank's data-file form (``dump_quiz``)."""

    __tablename__ = "quizzes"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    revision: Mapped[int] = mapped_column(Integer)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    # "bank": imported from item_bank/quizzes and kept in sync with it; "api": created or edited
    # by an instructor, after which the bank file no longer overwrites it.
    origin: Mapped[str] = mapped_column(String(16))
    bank_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ItemRevision(Base):
    """Every revision an item has had, so a grade can be traced to the key it was scored with."""

    __tablename__ = "item_revisions"

    quiz_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("quizzes.id", ondelete="CASCADE"), primary_key=True
    )
    item_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    revision: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
