"""API tokens: who is calling, in which role and course. Only a SHA-256 of each token is stored."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, CheckConstraint, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base, UTCDateTime, utcnow

ROLES: tuple[str, ...] = ("instructor", "student")


class ApiToken(Base):
    __tablename__ = "api_tokens"
    __table_args__ = (CheckConstraint("role IN ('instructor', 'student')", name="role"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    role: Mapped[str] = mapped_column(String(20))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    # Whose token it is and the course it reaches: every read and write it makes is scoped
    # to that course.
    user_id: Mapped[int] = mapped_column(Integer, ForeignKey("users.id", ondelete="CASCADE"))
    course_id: Mapped[int] = mapped_column(Integer, ForeignKey("courses.id", ondelete="CASCADE"))
