"""Platform registrations in the database, and the pylti1p3 tool configuration that reads them.

A registration is keyed by (issuer, client_id) and lists its deployment ids; its JWKS is cached
in the row and refetched when a launch names a key id the cache lacks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pylti1p3.deployment import Deployment
from pylti1p3.registration import Registration
from pylti1p3.tool_config import ToolConfAbstract
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.base import utcnow
from service.db.lti import LtiDeployment, LtiPlatform
from service.lti import keys


class RegistrationError(ValueError):
    """A registration that cannot be stored as given (the message names the field)."""


def _check_url(name: str, url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.netloc:
        raise RegistrationError(f"{name}: must be an http(s) URL, got {url!r}")
    return url


@dataclass(frozen=True)
class PlatformSpec:
    issuer: str
    client_id: str
    auth_login_url: str
    auth_token_url: str
    key_set_url: str
    deployments: tuple[str, ...]
    name: str | None = None
    auth_audience: str | None = None


def register(session: Session, spec: PlatformSpec) -> tuple[LtiPlatform, bool]:
    """Store or update a registration and add its deployments; (row, created)."""
    if not spec.issuer.strip() or not spec.client_id.strip():
        raise RegistrationError("issuer and client id are required")
    if not spec.deployments:
        raise RegistrationError("--deployment: give at least one deployment id")
    for name, url in (
        ("--login-url", spec.auth_login_url),
        ("--token-url", spec.auth_token_url),
        ("--jwks-url", spec.key_set_url),
    ):
        _check_url(name, url)
    row = find(session, spec.issuer, spec.client_id)
    created = row is None
    if row is None:
        row = LtiPlatform(issuer=spec.issuer, client_id=spec.client_id, created_at=utcnow())
        session.add(row)
    row.name = (spec.name or urlsplit(spec.issuer).netloc or spec.issuer)[:200]
    if row.key_set_url != spec.key_set_url:
        row.key_set, row.key_set_fetched_at = None, None
    row.auth_login_url = spec.auth_login_url
    row.auth_token_url = spec.auth_token_url
    row.key_set_url = spec.key_set_url
    row.auth_audience = spec.auth_audience
    row.updated_at = utcnow()
    session.flush()
    known = set(deployments(session, row.id))
    for dep in spec.deployments:
        if dep not in known:
            session.add(LtiDeployment(platform_id=row.id, deployment_id=dep, created_at=utcnow()))
    session.flush()
    keys.active(session)  # the tool's key exists before any platform asks for it
    return row, created


def find(session: Session, issuer: str, client_id: str) -> LtiPlatform | None:
    return session.execute(
        select(LtiPlatform).where(LtiPlatform.issuer == issuer, LtiPlatform.client_id == client_id)
    ).scalar_one_or_none()


def for_issuer(session: Session, issuer: str) -> list[LtiPlatform]:
    return list(session.execute(select(LtiPlatform).where(LtiPlatform.issuer == issuer)).scalars())


def all_platforms(session: Session) -> list[LtiPlatform]:
    return list(session.execute(select(LtiPlatform).order_by(LtiPlatform.id)).scalars())


def deployments(session: Session, platform_id: int) -> list[str]:
    return list(
        session.execute(
            select(LtiDeployment.deployment_id)
            .where(LtiDeployment.platform_id == platform_id)
            .order_by(LtiDeployment.id)
        ).scalars()
    )


def origins(session: Session) -> list[str]:
    """The web origins of registered platforms (for ``frame-ancestors``)."""
    out: set[str] = set()
    for p in all_platforms(session):
        for url in (p.issuer, p.auth_login_url):
            parts = urlsplit(url)
            if parts.scheme in ("http", "https") and parts.netloc:
                out.add(f"{parts.scheme}://{parts.netloc}")
    return sorted(out)


def registration(session: Session, platform: LtiPlatform) -> Registration:
    """pylti1p3's view of a registration, with our signing key (private and public: the
    library derives the JWT ``kid`` from the public one)."""
    key = keys.active(session)
    reg = Registration()
    reg.set_issuer(platform.issuer)
    reg.set_client_id(platform.client_id)
    reg.set_auth_login_url(platform.auth_login_url)
    reg.set_auth_token_url(platform.auth_token_url)
    reg.set_key_set_url(platform.key_set_url)
    if platform.auth_audience:
        reg.set_auth_audience(platform.auth_audience)
    if platform.key_set:
        reg.set_key_set(platform.key_set)  # type: ignore[arg-type]
    reg.set_tool_private_key(key.private_pem)
    reg.set_tool_public_key(key.public_pem)
    return reg


class DbToolConf(ToolConfAbstract[Any]):
    """Registrations for pylti1p3, from the database; many client ids per issuer."""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        # Which registration a login or launch resolved to (the library keeps only its view).
        self.platform: LtiPlatform | None = None

    def check_iss_has_one_client(self, iss: str) -> bool:
        return False

    def check_iss_has_many_clients(self, iss: str) -> bool:
        return True

    # The library asks these only of issuers with one client (check_iss_has_one_client is
    # False here); they answer as the by-params lookups do without a client id: unambiguous
    # only when the issuer has one registration.
    def find_registration_by_issuer(
        self, iss: str, *args: Any, **kwargs: Any
    ) -> Registration | None:
        return self.find_registration_by_params(iss, None)

    def find_deployment(self, iss: str, deployment_id: str) -> Deployment | None:
        return self._deployment(self._platform(iss, None), deployment_id)

    def find_registration_by_params(
        self, iss: str, client_id: str | None, *args: Any, **kwargs: Any
    ) -> Registration | None:
        platform = self._platform(iss, client_id)
        if platform is None:
            return None
        self.platform = platform
        return registration(self.session, platform)

    def find_deployment_by_params(
        self, iss: str, deployment_id: str, client_id: str, *args: Any, **kwargs: Any
    ) -> Deployment | None:
        return self._deployment(find(self.session, iss, client_id), deployment_id)

    def _deployment(self, platform: LtiPlatform | None, deployment_id: str) -> Deployment | None:
        if platform is None or deployment_id not in deployments(self.session, platform.id):
            return None
        return Deployment().set_deployment_id(deployment_id)

    def _platform(self, iss: str, client_id: str | None) -> LtiPlatform | None:
        if client_id:
            return find(self.session, iss, client_id)
        # A login initiation may leave out client_id; that is only unambiguous with one.
        candidates: Iterable[LtiPlatform] = for_issuer(self.session, iss)
        candidates = list(candidates)
        return candidates[0] if len(candidates) == 1 else None

    def store_key_set(self, key_set: dict[str, Any]) -> None:
        if self.platform is not None:
            self.platform.key_set = key_set
            self.platform.key_set_fetched_at = utcnow()
