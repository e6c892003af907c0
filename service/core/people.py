"""Courses, users and memberships: found or made from a token, a launch or a roster."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.core.errors import invalid, not_found
from service.db.base import utcnow
from service.db.courses import (
    ACTIVE,
    DEFAULT_COURSE,
    LOCAL_ISSUER,
    ROLES,
    Course,
    Membership,
    User,
)

_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


def _get_or_insert(session: Session, find: object, make: object) -> object:
    """Find a row, else insert it; a concurrent insert of the same key is found on retry."""
    row = session.execute(find).scalar_one_or_none()  # type: ignore[call-overload]
    if row is not None:
        return row
    try:
        with session.begin_nested():
            new = make()  # type: ignore[operator]
            session.add(new)
        return new
    except IntegrityError:
        return session.execute(find).scalar_one()  # type: ignore[call-overload]


def course_by_slug(session: Session, slug: str) -> Course:
    course = session.execute(select(Course).where(Course.slug == slug)).scalar_one_or_none()
    if course is None:
        if slug == DEFAULT_COURSE:
            return default_course(session)
        raise not_found("course", f"unknown course {slug!r}", location="json")
    return course


def default_course(session: Session) -> Course:
    return _get_or_insert(  # type: ignore[return-value]
        session,
        select(Course).where(Course.slug == DEFAULT_COURSE),
        lambda: Course(slug=DEFAULT_COURSE, title="kgrade (stand-alone)"),
    )


def create_local_course(session: Session, slug: str, title: str) -> Course:
    if not _SLUG.match(slug):
        raise invalid(
            "json", "slug", "1 to 64 of a-z, 0-9 and '-', starting with a letter or digit"
        )
    if session.execute(select(Course.id).where(Course.slug == slug)).first():
        raise invalid("json", "slug", f"course {slug!r} exists", status=409)
    course = Course(slug=slug, title=title.strip()[:255] or slug)
    session.add(course)
    session.flush()
    return course


def local_user(session: Session, name: str) -> User:
    """The kgrade-only user called ``name`` (tokens of the same name are one person)."""
    return _get_or_insert(  # type: ignore[return-value]
        session,
        select(User).where(User.issuer == LOCAL_ISSUER, User.sub == name),
        lambda: User(issuer=LOCAL_ISSUER, sub=name, name=name),
    )


def lti_user(session: Session, issuer: str, sub: str, name: str | None, email: str | None) -> User:
    """The platform's user ``sub``; name and email refreshed from what the platform sent."""
    user: User = _get_or_insert(  # type: ignore[assignment]
        session,
        select(User).where(User.issuer == issuer, User.sub == sub),
        lambda: User(issuer=issuer, sub=sub, name=(name or sub)[:200], email=email),
    )
    changed = False
    if name and user.name != name[:200]:
        user.name, changed = name[:200], True
    if email and user.email != email:
        user.email, changed = email[:320], True
    if changed:
        user.updated_at = utcnow()
    return user


def lti_slug(issuer: str, context_id: str) -> str:
    return "lti-" + hashlib.sha256(f"{issuer}\n{context_id}".encode()).hexdigest()[:16]


def lti_course(
    session: Session,
    *,
    issuer: str,
    context_id: str,
    title: str | None,
    label: str | None,
) -> Course:
    """The course of an LTI context; its title follows the platform's."""
    course: Course = _get_or_insert(  # type: ignore[assignment]
        session,
        select(Course).where(Course.issuer == issuer, Course.context_id == context_id),
        lambda: Course(
            slug=lti_slug(issuer, context_id),
            title=(title or label or context_id)[:255],
            label=label[:255] if label else None,
            issuer=issuer,
            context_id=context_id,
        ),
    )
    if title and course.title != title[:255]:
        course.title = title[:255]
    if label and course.label != label[:255]:
        course.label = label[:255]
    return course


def enrol(
    session: Session,
    course: Course,
    user: User,
    role: str,
    *,
    source: str,
    lti_roles: Iterable[str] = (),
    status: str = ACTIVE,
    launched: bool = False,
) -> Membership:
    """Make or update ``user``'s membership of ``course``."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    m: Membership = _get_or_insert(  # type: ignore[assignment]
        session,
        select(Membership).where(Membership.course_id == course.id, Membership.user_id == user.id),
        lambda: Membership(
            course_id=course.id, user_id=user.id, role=role, source=source, lti_roles=[]
        ),
    )
    m.role = role
    m.status = status
    if lti_roles:
        m.lti_roles = list(lti_roles)
    if launched:
        m.last_launch_at = utcnow()
        m.source = "launch" if m.source != "token" else m.source
    m.updated_at = utcnow()
    return m


@dataclass(frozen=True)
class Member:
    user_id: int
    name: str
    email: str | None
    role: str
    status: str
    source: str
    sub: str


def members(session: Session, course_id: int, role: str | None = None) -> list[Member]:
    """Everyone in a course (the roster), by name."""
    stmt = (
        select(User, Membership)
        .join(Membership, Membership.user_id == User.id)
        .where(Membership.course_id == course_id)
        .order_by(User.name, User.id)
    )
    if role is not None:
        stmt = stmt.where(Membership.role == role)
    return [
        Member(u.id, u.name, u.email, m.role, m.status, m.source, u.sub)
        for u, m in session.execute(stmt).all()
    ]
