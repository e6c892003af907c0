"""What a validated launch means for kgrade: the course, the person and their role, the
assignment behind the link, and the page to open.

An LTI context becomes a course, (issuer, sub) a user, the roles an instructor or a student.
The resource link finds its assignment: bound on an earlier launch, or named by the
``kgrade_assignment`` custom parameter our deep-linking response put on the link (the first
launch binds it; a link the LMS copied into another course gets a copy of the assignment).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.core import assignments, people
from service.db.base import utcnow
from service.db.courses import INSTRUCTOR, STUDENT, Assignment, Course, User
from service.db.lti import LtiLaunch
from service.lti.launch import (
    AGS,
    DEEP_LINKING,
    DL,
    NRPS,
    SUBMISSION_REVIEW,
    Launch,
    LaunchError,
)

log = logging.getLogger(__name__)

#: The custom parameter our deep-linking response puts on each link.
ASSIGNMENT_PARAM = "kgrade_assignment"
#: Custom parameter carrying the platform's due date (``$ResourceLink.submission.endDateTime``).
DUE_PARAM = "kgrade_due"

LAUNCH_KEPT = timedelta(days=7)

_INSTRUCTOR = {"Instructor", "TeachingAssistant", "Administrator"}
_LEARNER = {"Learner", "Student"}


def _role_name(uri: str) -> tuple[str, str]:
    """(vocabulary, name) of an LTI role URI: ``membership``, ``institution``, ``system``, or
    ``""`` for the short names LTI 1.1 used (``Instructor``)."""
    base, _, frag = uri.partition("#")
    if not frag:
        return "", uri.rsplit("/", 1)[-1]
    vocab = (
        "membership"
        if "/membership" in base
        else ("system" if "/system/" in base else "institution" if "/institution/" in base else "")
    )
    return vocab, frag


def map_role(roles: list[str]) -> str | None:
    """instructor (Instructor, TeachingAssistant, Administrator), student (Learner), or None.

    Course roles decide; an administrator of the whole platform or institution also gets in as
    instructor. Other institution roles (a faculty member's "Instructor") say nothing about this
    course and are ignored.
    """
    names = [_role_name(r) for r in roles if isinstance(r, str)]
    course = {n for v, n in names if v in ("membership", "")}
    if course & _INSTRUCTOR or any(
        n == "Administrator" for v, n in names if v in ("system", "institution")
    ):
        return INSTRUCTOR
    if course & _LEARNER:
        return STUDENT
    return None


@dataclass
class Arrival:
    """Where a launch leads: who, in which course, and which page."""

    launch: LtiLaunch
    user: User
    course: Course
    role: str
    assignment: Assignment | None
    page: str  # "assignment", "setup", "unset", "deep_link", "review"
    for_user: User | None = None


def _kept_claims(launch: Launch) -> dict[str, Any]:
    c = launch.claims
    keep = {
        "resource_link": launch.claim("resource_link"),
        "context": launch.claim("context"),
        "custom": launch.claim("custom"),
        "launch_presentation": launch.claim("launch_presentation"),
        "for_user": launch.claim("for_user"),
        "ags": c.get(AGS),
        "nrps": c.get(NRPS),
        "deep_linking_settings": c.get(DL + "deep_linking_settings"),
        "target_link_uri": launch.claim("target_link_uri"),
    }
    return {k: v for k, v in keep.items() if v is not None}


def arrive(session: Session, launch: Launch) -> Arrival:
    """Record the launch and everything it tells us; where it leads."""
    c = launch.claims
    role = map_role(list(launch.claim("roles") or []))
    if role is None:
        raise LaunchError(
            "kgrade is for instructors, teaching assistants and learners; your roles in this "
            "course give no access"
        )
    context = launch.claim("context") or {}
    if not context.get("id"):
        raise LaunchError("this launch has no course (context claim): place kgrade in a course")
    iss = str(c["iss"])
    course = people.lti_course(
        session,
        issuer=iss,
        context_id=str(context["id"]),
        title=context.get("title"),
        label=context.get("label"),
    )
    course.platform_id = launch.platform.id
    course.deployment_id = launch.deployment_id
    ags = c.get(AGS) or {}
    if ags.get("lineitems"):
        course.lineitems_url = str(ags["lineitems"])
    if ags.get("scope"):
        course.ags_scopes = [str(s) for s in ags["scope"]]
    nrps = c.get(NRPS) or {}
    if nrps.get("context_memberships_url"):
        course.nrps_url = str(nrps["context_memberships_url"])
    name = (
        c.get("name")
        or " ".join(p for p in (c.get("given_name"), c.get("family_name")) if p)
        or None
    )
    user = people.lti_user(session, iss, str(c["sub"]), name, c.get("email"))
    people.enrol(
        session,
        course,
        user,
        role,
        source="launch",
        lti_roles=[r for r in launch.claim("roles") or [] if isinstance(r, str)],
        launched=True,
    )
    session.flush()
    rl = launch.claim("resource_link") or {}
    # Launches are kept for a week (deep linking and review pages need theirs for hours).
    session.execute(delete(LtiLaunch).where(LtiLaunch.created_at < utcnow() - LAUNCH_KEPT))
    row = LtiLaunch(
        id=launch.id,
        platform_id=launch.platform.id,
        deployment_id=launch.deployment_id,
        message_type=launch.message_type,
        user_id=user.id,
        course_id=course.id,
        role=role,
        resource_link_id=str(rl["id"]) if rl.get("id") else None,
        claims=_kept_claims(launch),
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    if launch.message_type == DEEP_LINKING:
        if role != INSTRUCTOR:
            raise LaunchError("only instructors can add kgrade content to a course")
        return Arrival(row, user, course, role, None, "deep_link")
    assignment = _assignment_for(session, course, launch, row)
    if launch.message_type == SUBMISSION_REVIEW:
        for_user = None
        fu = launch.claim("for_user") or {}
        if fu.get("user_id"):
            for_user = people.lti_user(session, iss, str(fu["user_id"]), fu.get("name"), None)
        return Arrival(row, user, course, role, assignment, "review", for_user)
    if assignment is None:
        return Arrival(row, user, course, role, None, "setup" if role == INSTRUCTOR else "unset")
    return Arrival(row, user, course, role, assignment, "assignment")


def _assignment_for(
    session: Session, course: Course, launch: Launch, row: LtiLaunch
) -> Assignment | None:
    rl_id = row.resource_link_id
    if rl_id is None:
        return None
    found = session.execute(
        select(Assignment).where(
            Assignment.course_id == course.id, Assignment.resource_link_id == rl_id
        )
    ).scalar_one_or_none()
    custom = launch.claim("custom") or {}
    if found is None:
        source = assignments.find(session, str(custom.get(ASSIGNMENT_PARAM) or ""))
        if source is None:
            return None
        found = _bind(session, course, source, rl_id)
    ags = launch.claims.get(AGS) or {}
    if ags.get("lineitem") and found.lineitem_url != ags["lineitem"]:
        found.lineitem_url = str(ags["lineitem"])
    due = custom.get(DUE_PARAM)
    if isinstance(due, str) and due and not due.startswith("$"):
        try:
            found.due_at = assignments.parse_due(due)
        except Exception:  # noqa: BLE001 - a platform's odd date must not block the launch
            log.warning("ignoring unreadable due date %r from the platform", due)
    return found


def _bind(session: Session, course: Course, source: Assignment, rl_id: str) -> Assignment:
    """Bind ``source`` to the link, or a copy of it when it lives in another course or is
    bound to another link already (the LMS copied the course, or the link)."""
    try:
        with session.begin_nested():
            if source.course_id == course.id and source.resource_link_id in (None, rl_id):
                source.resource_link_id = rl_id
                session.flush()
                return source
            copy = assignments.copy_to(session, source, course.id)
            copy.resource_link_id = rl_id
            session.flush()
            return copy
    except IntegrityError:
        # A concurrent first launch of the same link bound it first.
        return session.execute(
            select(Assignment).where(
                Assignment.course_id == course.id, Assignment.resource_link_id == rl_id
            )
        ).scalar_one()


def launch_row(session: Session, launch_id: str) -> LtiLaunch | None:
    if not launch_id or len(launch_id) > 64:
        return None
    return session.get(LtiLaunch, launch_id)
