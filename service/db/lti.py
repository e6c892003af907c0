"""LTI 1.3 state: platform registrations, our key pairs, logins in flight, launches, line items,
service tokens and grade passbacks (see ``service/lti``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base, UTCDateTime, utcnow


class LtiPlatform(Base):
    """One registration: a platform issuer and the client id it gave kgrade.

    Hosted Canvas shares one issuer across customers, so the pair is the key, not the issuer.
    """

    __tablename__ = "lti_platforms"
    __table_args__ = (UniqueConstraint("issuer", "client_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    issuer: Mapped[str] = mapped_column(String(255))
    client_id: Mapped[str] = mapped_column(String(255))
    auth_login_url: Mapped[str] = mapped_column(String(1024))
    auth_token_url: Mapped[str] = mapped_column(String(1024))
    key_set_url: Mapped[str] = mapped_column(String(1024))
    # The ``aud`` of our token-request assertions when it is not the token URL (e.g. Brightspace).
    auth_audience: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    # The platform's JWKS as last fetched; refetched when a launch names an unknown ``kid``.
    key_set: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    key_set_fetched_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class LtiDeployment(Base):
    __tablename__ = "lti_deployments"
    __table_args__ = (UniqueConstraint("platform_id", "deployment_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    platform_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("lti_platforms.id", ondelete="CASCADE")
    )
    deployment_id: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ToolKey(Base):
    """A key pair of ours. The newest unretired one signs; retired ones stay published in
    ``/lti/jwks`` until ``expires_at`` so platforms holding a cached JWKS keep verifying."""

    __tablename__ = "lti_tool_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kid: Mapped[str] = mapped_column(String(64), unique=True)
    private_pem: Mapped[str] = mapped_column(Text)
    public_pem: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    retired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class LtiLogin(Base):
    """An OIDC login we started: its ``state`` and ``nonce``, consumed by exactly one launch."""

    __tablename__ = "lti_logins"

    state: Mapped[str] = mapped_column(String(64), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(128), unique=True)
    platform_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("lti_platforms.id", ondelete="CASCADE")
    )
    # Set when the platform keeps state and nonce for us (LTI Platform Storage, postMessage).
    storage_target: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # The login initiation's parameters: a launch whose browser refused our state cookie can
    # start the login again in a new window (first-party, so the cookie sticks).
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    consumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class LtiLaunch(Base):
    """A validated launch: who, where, and the claims workers and later pages need."""

    __tablename__ = "lti_launches"
    __table_args__ = (Index("ix_lti_launches_created_at", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    platform_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("lti_platforms.id", ondelete="CASCADE")
    )
    deployment_id: Mapped[str] = mapped_column(String(255))
    message_type: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[int] = mapped_column(Integer, ForeignKey("users.id", ondelete="CASCADE"))
    course_id: Mapped[int | None] = mapped_column(
        Integer, ForeignKey("courses.id", ondelete="CASCADE"), nullable=True
    )
    role: Mapped[str] = mapped_column(String(20))
    resource_link_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # The subset of the id_token kept: resource link, AGS and NRPS claims, deep-linking
    # settings, custom parameters, launch presentation, for_user.
    claims: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class LtiLineItem(Base):
    """The grade column of one assignment in one platform context.

    Its unique key is the lock that keeps racing passback workers from creating two columns:
    the worker that inserts the row creates the line item, the others wait for its URL.
    """

    __tablename__ = "lti_lineitems"
    __table_args__ = (UniqueConstraint("platform_id", "context_id", "resource_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    platform_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("lti_platforms.id", ondelete="CASCADE")
    )
    context_id: Mapped[str] = mapped_column(String(255))
    resource_id: Mapped[str] = mapped_column(String(255))
    url: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class LtiAccessToken(Base):
    """OAuth2 service tokens, cached per registration and scope set until they expire."""

    __tablename__ = "lti_access_tokens"

    platform_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("lti_platforms.id", ondelete="CASCADE"), primary_key=True
    )
    scopes: Mapped[str] = mapped_column(String(1024), primary_key=True)
    token: Mapped[str] = mapped_column(Text)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


# Passback states. "pending" until a task posts it; "sent" once the platform accepted it;
# "failed" when the platform refused it for good (the instructor sees why and may re-send).
PASSBACK_PENDING = "pending"
PASSBACK_SENT = "sent"
PASSBACK_FAILED = "failed"
PASSBACK_STATES: tuple[str, ...] = (PASSBACK_PENDING, PASSBACK_SENT, PASSBACK_FAILED)


class GradePassback(Base):
    """One score to post to a line item, for one grading event.

    ``event`` is unique, so an event (an attempt submitted, a grading finished, a re-send) is
    recorded once and posted once; retries reuse its ``timestamp``.
    """

    __tablename__ = "grade_passbacks"
    __table_args__ = (Index("ix_grade_passbacks_assignment_user", "assignment_id", "user_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    event: Mapped[str] = mapped_column(String(128), unique=True)
    assignment_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("assignments.id", ondelete="CASCADE")
    )
    user_id: Mapped[int] = mapped_column(Integer, ForeignKey("users.id", ondelete="CASCADE"))
    activity_progress: Mapped[str] = mapped_column(String(16))
    grading_progress: Mapped[str] = mapped_column(String(16))
    score_given: Mapped[float | None] = mapped_column(Float, nullable=True)
    score_maximum: Mapped[float] = mapped_column(Float)
    comment: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    # ISO 8601 with milliseconds and offset, fixed when the event is recorded.
    timestamp: Mapped[str] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(16), default=PASSBACK_PENDING)
    tries: Mapped[int] = mapped_column(Integer, default=0)
    http_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(String(2000), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
