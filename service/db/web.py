"""Sessions of the pages: who is signed in, in which course, and how the browser carries it.

A session starts from an LTI launch or a stand-alone sign-in with an API token. The browser
carries it in a cookie, or (inside an LMS iframe whose browser blocks third-party cookies) in
the URL. Only hashes of the session token and of the one-time entry ticket are stored.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base, UTCDateTime, utcnow


class WebSession(Base):
    __tablename__ = "web_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The one-time ticket that moves a launch (a cross-site POST) onto our own page.
    ticket_hash: Mapped[str | None] = mapped_column(String(64), unique=True, nullable=True)
    ticket_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    user_id: Mapped[int] = mapped_column(Integer, ForeignKey("users.id", ondelete="CASCADE"))
    course_id: Mapped[int] = mapped_column(Integer, ForeignKey("courses.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(20))
    # A stand-alone sign-in: the API token it was opened with (revoking it ends the session).
    token_id: Mapped[int | None] = mapped_column(
        Integer, ForeignKey("api_tokens.id", ondelete="CASCADE"), nullable=True
    )
    launch_id: Mapped[str | None] = mapped_column(
        String(64), ForeignKey("lti_launches.id", ondelete="SET NULL"), nullable=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
