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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, TypeVar

from flask import g, request
from flask_smorest import abort
from sqlalchemy import Select, bindparam, select, true
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
#: The token's columns, in this order at the start of every lookup's row (read by position).
_TOKEN_COLS = (_T.id, _T.name, _T.role, _T.token_hash, _T.revoked, _T.user_id, _T.course_id)
_TOKEN_LOOKUP = Prepared(select(*_TOKEN_COLS).where(_T.token_hash == bindparam("digest")))


@dataclass(frozen=True, eq=False)
class JoinedRead:
    """A view's first read, made in the token lookup's statement: one round trip for both.

    A statement costs more than its work on the quiz flow's small reads (on PostgreSQL about
    80 us of the client's CPU and 60 of the server's), and an answer, most of a quiz's
    requests, needs the token and then its attempt. ``query`` must yield one row at most, its
    first column never NULL in a row it finds (a primary key); it is left-joined to the
    token's row, so a token that finds nothing still authenticates. ``params`` maps the view's
    URL arguments to ``query``'s bind values (no ``digest``), or to None where the read can find
    nothing (a malformed id): the token is then looked up alone, and the view reads as usual.
    The row is read before the token is checked and dropped if the check fails.
    """

    query: Select[Any]
    params: Callable[[Mapping[str, Any]], dict[str, Any] | None]
    stmt: Prepared = field(init=False)

    def __post_init__(self) -> None:
        joined = self.query.subquery("joined")
        stmt = (
            select(*_TOKEN_COLS, *joined.c)
            .select_from(ApiToken.__table__.outerjoin(joined, true()))
            .where(_T.token_hash == bindparam("digest"))
        )
        object.__setattr__(self, "stmt", Prepared(stmt))


@dataclass(frozen=True)
class Prefetched:
    """What a ``JoinedRead`` found: ``query``'s row (by position), or None for no row."""

    row: tuple[Any, ...] | None


def _digest(token: str) -> str | None:
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    return hash_token(token)


def _principal(row: Sequence[Any] | None, digest: str) -> Principal | None:
    """The principal of a lookup's row (``_TOKEN_COLS`` first), if the token is valid."""
    if row is None:
        return None
    token_id, name, role, token_hash, revoked, user_id, course_id = row[: len(_TOKEN_COLS)]
    if revoked or not hmac.compare_digest(token_hash, digest):
        return None
    return Principal(token_id=token_id, name=name, role=role, user_id=user_id, course_id=course_id)


def authenticate(session: Session, token: str) -> Principal | None:
    digest = _digest(token)
    if digest is None:
        return None
    # on the session's connection (same transaction): every API request runs this, and the
    # ORM's statement handling, even Core's, costs more than the lookup itself
    row = _TOKEN_LOOKUP.execute(session.connection(), {"digest": digest}).first()
    return _principal(row, digest)


def authenticate_joined(
    session: Session, token: str, joined: JoinedRead, params: dict[str, Any]
) -> tuple[Principal | None, Prefetched | None]:
    """``authenticate`` with ``joined``'s read in the same statement: the principal, and what
    the read found (None with no principal)."""
    digest = _digest(token)
    if digest is None:
        return None, None
    row = joined.stmt.execute(session.connection(), {**params, "digest": digest}).first()
    principal = _principal(row, digest)
    if principal is None or row is None:
        return None, None
    rest = tuple(row[len(_TOKEN_COLS) :])
    return principal, Prefetched(rest if rest[0] is not None else None)


def prefetched(joined: JoinedRead) -> Prefetched | None:
    """What ``requires(joined=joined)`` read with this request's token; None if it did not
    read it (the view then reads as usual)."""
    found: tuple[JoinedRead, Prefetched] | None = g.get("prefetched")
    return found[1] if found is not None and found[0] is joined else None


def _unauthorized(message: str) -> None:
    abort(401, message=message, headers={"WWW-Authenticate": 'Bearer realm="kgrade"'})


def current_principal() -> Principal:
    principal: Principal | None = g.get("principal")
    if principal is None:  # a view reached without @requires is a programming error
        raise RuntimeError("no authenticated principal in this request")
    return principal


def requires(*roles: str, joined: JoinedRead | None = None) -> Callable[[F], F]:
    """Reject the request with 401 (no/bad token) or 403 (role not in ``roles``).

    Runs before the body is parsed, so an anonymous caller learns nothing about validation.
    ``joined``: the view's first read, made in the token's statement (``prefetched``).
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
            params = joined.params(kwargs) if joined is not None else None
            if joined is not None and params is not None:
                principal, found = authenticate_joined(db.session, token.strip(), joined, params)
                g.prefetched = (joined, found)
            else:
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
