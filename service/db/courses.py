"""Courses, the people in them, and the assignments an instructor placed there.

A course is either an LTI context (one per platform issuer and ``context.id``) or a local course
for the bearer-token API and the stand-alone pages (the ``default`` course holds every token
made without ``--course``). A user is one person per issuer: ``(issuer, sub)`` from an LTI
launch, or ``("local", name)`` for a token holder. Everything students make (attempts,
submissions) carries its course, and every read is scoped by it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    Float,
    ForeignKey,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base, UTCDateTime, utcnow

#: The issuer of users that exist only in kgrade (token holders, stand-alone sign-in).
LOCAL_ISSUER = "local"
#: The course every token made without ``--course`` belongs to.
DEFAULT_COURSE = "default"

INSTRUCTOR = "instructor"
STUDENT = "student"
ROLES: tuple[str, ...] = (INSTRUCTOR, STUDENT)

#: Membership states, as NRPS reports them (``Active``, ``Inactive``, ``Deleted``).
ACTIVE = "active"
INACTIVE = "inactive"
DELETED = "deleted"

QUIZ = "quiz"
EXERCISE = "exercise"
KINDS: tuple[str, ...] = (QUIZ, EXERCISE)

#: How an assignment delivers a quiz: English, or the course's own wording ("source").
LANG_MODES: tuple[str, ...] = ("en", "source")

BEST = "best"
LAST = "last"
POLICIES: tuple[str, ...] = (BEST, LAST)


class Course(Base):
    __tablename__ = "courses"
    __table_args__ = (UniqueConstraint("issuer", "context_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Short id in URLs and on the command line: "default", a name given to `kgrade course`,
    # or "lti-<hash>" for a course that came from a launch.
    slug: Mapped[str] = mapped_column(String(64), unique=True)
    title: Mapped[str] = mapped_column(String(255))
    label: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # LTI: the platform issuer and context id; null for local courses.
    issuer: Mapped[str | None] = mapped_column(String(255), nullable=True)
    context_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # The registration and deployment of the latest launch: whose keys the services use.
    platform_id: Mapped[int | None] = mapped_column(
        Integer, ForeignKey("lti_platforms.id", ondelete="SET NULL"), nullable=True
    )
    deployment_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # Service endpoints from the latest launch (AGS line items, NRPS memberships).
    lineitems_url: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    ags_scopes: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    nrps_url: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    roster_synced_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    roster_error: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    @property
    def is_lti(self) -> bool:
        return self.issuer is not None


class User(Base):
    __tablename__ = "users"
    __table_args__ = (UniqueConstraint("issuer", "sub"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    issuer: Mapped[str] = mapped_column(String(255))
    sub: Mapped[str] = mapped_column(String(255))
    name: Mapped[str] = mapped_column(String(200))
    email: Mapped[str | None] = mapped_column(String(320), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Membership(Base):
    __tablename__ = "memberships"
    __table_args__ = (
        UniqueConstraint("course_id", "user_id"),
        CheckConstraint("role IN ('instructor', 'student')", name="role"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    course_id: Mapped[int] = mapped_column(Integer, ForeignKey("courses.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(Integer, ForeignKey("users.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(20))
    # The LTI role URIs as the platform sent them (launch or roster).
    lti_roles: Mapped[list[str]] = mapped_column(JSON, default=list)
    status: Mapped[str] = mapped_column(String(16), default=ACTIVE)
    # Where we learnt of it: "launch", "roster" (NRPS) or "token".
    source: Mapped[str] = mapped_column(String(16))
    last_launch_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Assignment(Base):
    """A quiz or kernel exercise placed in a course, with how it is delivered and graded.

    Made by deep linking (the LMS then holds a link and a grade column for it) or on the
    stand-alone instructor page. ``resource_link_id`` binds it to the LMS link on first launch.
    """

    __tablename__ = "assignments"
    __table_args__ = (
        UniqueConstraint("course_id", "resource_link_id"),
        CheckConstraint("kind IN ('quiz', 'exercise')", name="kind"),
        CheckConstraint("policy IN ('best', 'last')", name="policy"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    course_id: Mapped[int] = mapped_column(Integer, ForeignKey("courses.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    resource_id: Mapped[str] = mapped_column(String(64))
    title: Mapped[str] = mapped_column(String(255))
    # Delivery language of a quiz: "en" or "source" (the course's own wording).
    lang: Mapped[str] = mapped_column(String(8), default="en")
    allowed_attempts: Mapped[int | None] = mapped_column(Integer, nullable=True)
    policy: Mapped[str] = mapped_column(String(8), default=BEST)
    due_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    score_maximum: Mapped[float] = mapped_column(Float)
    resource_link_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    lineitem_url: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    # The course it was copied from when the LMS copied a course with this link in it.
    copied_from: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_by: Mapped[int | None] = mapped_column(
        Integer, ForeignKey("users.id", ondelete="SET NULL"), nullable=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    @property
    def line_item_resource_id(self) -> str:
        """The AGS ``resourceId`` of its grade column: unique per assignment in a context."""
        return f"kgrade:{self.kind}:{self.resource_id}:{self.id}"

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "resource_id": self.resource_id,
            "title": self.title,
            "lang": self.lang,
            "allowed_attempts": self.allowed_attempts,
            "policy": self.policy,
            "due_at": self.due_at,
            "score_maximum": self.score_maximum,
            "lti_linked": self.resource_link_id is not None,
            "lineitem_url": self.lineitem_url,
        }
