"""The tool's RSA key pairs: made on first use, published in ``/lti/jwks``, rotated by
``kgrade lti rotate-key``.

The newest unretired key signs (deep-linking responses, service-token assertions). Rotating
makes a new one and retires the old, which stays in the JWKS for a grace period so platforms
that cached our JWKS (Moodle does) keep verifying what we signed just before.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwcrypto.jwk import JWK
from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.db.base import utcnow
from service.db.lti import ToolKey

#: How long a retired key stays published (``kgrade lti rotate-key --grace-days``).
DEFAULT_GRACE = timedelta(days=7)


def _new_key() -> ToolKey:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public_pem = (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    # The RFC 7638 thumbprint: what pylti1p3 derives from the public key for the JWT header, so
    # the ``kid`` we publish and the one we sign with are the same by construction.
    kid = JWK.from_pem(public_pem.encode()).thumbprint()
    return ToolKey(kid=kid, private_pem=private_pem, public_pem=public_pem, created_at=utcnow())


def active(session: Session) -> ToolKey:
    """The signing key, made now if there is none."""
    key = session.execute(
        select(ToolKey).where(ToolKey.retired_at.is_(None)).order_by(ToolKey.id.desc()).limit(1)
    ).scalar_one_or_none()
    if key is not None:
        return key
    key = _new_key()
    try:
        with session.begin_nested():
            session.add(key)
    except IntegrityError:  # pragma: no cover - two processes made one at the same instant
        pass
    return session.execute(
        select(ToolKey).where(ToolKey.retired_at.is_(None)).order_by(ToolKey.id.asc()).limit(1)
    ).scalar_one()


def rotate(session: Session, grace: timedelta = DEFAULT_GRACE) -> tuple[ToolKey, list[ToolKey]]:
    """A new signing key; the current ones retire and stay published for ``grace``."""
    now = utcnow()
    retired = list(session.execute(select(ToolKey).where(ToolKey.retired_at.is_(None))).scalars())
    for key in retired:
        key.retired_at = now
        key.expires_at = now + grace
    new = _new_key()
    session.add(new)
    session.flush()
    return new, retired


def public_jwk(key: ToolKey) -> dict[str, Any]:
    jwk = json.loads(JWK.from_pem(key.public_pem.encode()).export_public())
    return {**jwk, "kid": key.kid, "alg": "RS256", "use": "sig"}


def published(session: Session) -> list[ToolKey]:
    """Keys in the JWKS: the signing key and retired ones still in their grace period."""
    now = utcnow()
    return list(
        session.execute(
            select(ToolKey)
            .where(or_(ToolKey.retired_at.is_(None), ToolKey.expires_at > now))
            .order_by(ToolKey.id.desc())
        ).scalars()
    )
