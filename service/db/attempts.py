"""Quiz attempts, their responses, and stored results of idempotent requests."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.db.base import Base, UTCDateTime, utcnow

IN_PROGRESS = "in_progress"
SUBMITTED = "submitted"


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (
        Index("ix_attempts_quiz_student", "quiz_id", "student"),
        Index("ix_attempts_course_user", "course_id", "user_id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    quiz_id: Mapped[str] = mapped_column(String(64), ForeignKey("quizzes.id"))
    course_id: Mapped[int] = mapped_column(Integer, ForeignKey("courses.id"))
    # Grades are per user (a student issued a new token, or launching again, keeps them);
    # ``student`` is the name shown, as it was when the attempt started.
    user_id: Mapped[int] = mapped_column(Integer, ForeignKey("users.id"))
    student: Mapped[str] = mapped_column(String(200))
    # Null when started from the catalogue (API or stand-alone page) rather than an assignment.
    assignment_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("assignments.id", ondelete="SET NULL"), nullable=True
    )
    # The API token that started it; null for attempts started from a page.
    token_id: Mapped[int | None] = mapped_column(
        Integer, ForeignKey("api_tokens.id"), nullable=True
    )
    number: Mapped[int] = mapped_column(Integer)
    lang: Mapped[str] = mapped_column(String(8))
    status: Mapped[str] = mapped_column(String(16), default=IN_PROGRESS)
    quiz_revision: Mapped[int] = mapped_column(Integer)
    # {item_id: revision} when the attempt started, then as graded at submit / regrade.
    item_revisions: Mapped[dict[str, int]] = mapped_column(JSON)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    submitted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    score: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_score: Mapped[float | None] = mapped_column(Float, nullable=True)
    graded_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    responses: Mapped[list[ResponseRecord]] = relationship(
        back_populates="attempt", order_by="ResponseRecord.id", lazy="selectin"
    )


class ResponseRecord(Base):
    __tablename__ = "responses"
    # One row per item and attempt: a second answer either is refused (409) or, when the quiz
    # allows re-answering, replaces this row. The constraint also settles concurrent double posts.
    __table_args__ = (UniqueConstraint("attempt_id", "item_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("attempts.id", ondelete="CASCADE")
    )
    item_id: Mapped[str] = mapped_column(String(64))
    item_revision: Mapped[int] = mapped_column(Integer)
    answer: Mapped[list[str]] = mapped_column(JSON)
    correct: Mapped[bool] = mapped_column(Boolean)
    points: Mapped[float] = mapped_column(Float)
    max_points: Mapped[float] = mapped_column(Float)
    times_answered: Mapped[int] = mapped_column(Integer, default=1)
    answered_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    attempt: Mapped[Attempt] = relationship(back_populates="responses")


class IdempotencyRecord(Base):
    """The stored outcome of a request sent with an ``Idempotency-Key`` header.

    Written in the same transaction as the request's own changes, so a retry either finds both
    or neither.
    """

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("token_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_id: Mapped[int] = mapped_column(Integer, ForeignKey("api_tokens.id"))
    key: Mapped[str] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[int] = mapped_column(Integer)
    body: Mapped[str] = mapped_column(Text)
    headers: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
