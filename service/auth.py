"""Bearer-token authentication with two roles, ``instructor`` and ``student``.

Tokens are ``kg_`` + 43 random URL-safe characters (256 bits), shown once at creation. Only their
SHA-256 is stored: with that much entropy a slow password hash adds nothing, and a plain hash
lets a request be authenticated with one indexed lookup. The hash found is compared again in
constant time so the check does not hinge on the database's string comparison.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from flask import g, request
from flask_smorest import abort
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from service.db.courses import Course
from service.db.prepared import Prepared
from service.db.tokens import ROLES, ApiToken

TOKEN_PREFIX = "kg_"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Principal:
    """Who acts, in which course and role: from a bearer token or a page's session."""

    token_id: int | None
    name: str
    role: str
    user_id: int
    course_id: int

    @property
    def is_instructor(self) -> bool:
        return self.role == "instructor"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(
    session: Session, *, role: str, name: str, course: Course | None = None
) -> tuple[ApiToken, str]:
    """Store a new token for ``name`` in ``role`` in ``course`` (default: the ``default``
    course); returns the row and the plaintext token. Tokens of one name are one local user,
    who becomes a member of the course in that role."""
    from service.core import people

    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    name = name.strip()
    if not name or len(name) > 200:
        raise ValueError("name must be 1 to 200 characters")
    course = course or people.default_course(session)
    user = people.local_user(session, name)
    people.enrol(session, course, user, role, source="token")
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(
        name=name,
        role=role,
        token_hash=hash_token(plaintext),
        revoked=False,
        user_id=user.id,
        course_id=course.id,
    )
    session.add(row)
    session.flush()
    return row, plaintext


def revoke_token(session: Session, token_id: int) -> bool:
    row = session.get(ApiToken, token_id)
    if row is None:
        return False
    row.revoked = True
    return True


_T = ApiToken.__table__.c
_TOKEN_LOOKUP = Prepared(
    select(_T.id, _T.name, _T.role, _T.token_hash, _T.revoked, _T.user_id, _T.course_id).where(
        _T.token_hash == bindparam("digest")
    )
)


def authenticate(session: Session, token: str) -> Principal | None:
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    digest = hash_token(token)
    # on the session's connection (same transaction): every API request runs this, and the
    # ORM's statement handling, even Core's, costs more than the lookup itself
    row = _TOKEN_LOOKUP.execute(session.connection(), {"digest": digest}).first()
    if row is None or row.revoked or not hmac.compare_digest(row.token_hash, digest):
        return None
    return Principal(
        token_id=row.id,
        name=row.name,
        role=row.role,
        user_id=row.user_id,
        course_id=row.course_id,
    )


def _unauthorized(message: str) -> None:
    abort(401, message=message, headers={"WWW-Authenticate": 'Bearer realm="kgrade"'})


def current_principal() -> Principal:
    principal: Principal | None = g.get("principal")
    if principal is None:  # a view reached without @requires is a programming error
        raise RuntimeError("no authenticated principal in this request")
    return principal


def requires(*roles: str) -> Callable[[F], F]:
    """Reject the request with 401 (no/bad token) or 403 (role not in ``roles``).

    Runs before the body is parsed, so an anonymous caller learns nothing about validation.
    """
    from service.extensions import db  # imported late: extensions imports the models

    def decorator(func: F) -> F:
        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            header = request.headers.get("Authorization", "")
            scheme, _, token = header.partition(" ")
            if not header:
                _unauthorized("missing Authorization header: send 'Authorization: Bearer <token>'")
            if scheme.lower() != "bearer" or not token.strip():
                _unauthorized("the Authorization header must be 'Bearer <token>'")
            principal = authenticate(db.session, token.strip())
            if principal is None:
                _unauthorized("invalid or revoked token")
            assert principal is not None
            if principal.role not in roles:
                abort(
                    403,
                    message=f"this endpoint is for {' or '.join(roles)} tokens; "
                    f"yours is a {principal.role} token",
                )
            g.principal = principal
            return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator
