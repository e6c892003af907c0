"""OIDC login initiation and launch validation on pylti1p3, with the checks it skips.

pylti1p3next 2.0.2 validates state, JWT format, nonce, registration, RS256 signature (with
``exp`` and ``iat``), deployment and message claims. kgrade adds, around it:

* the nonce is consumed once, atomically, and only together with the state it was issued
  with (``lti_logins``): a replayed ``id_token`` + ``state`` is refused;
* ``aud`` may be a list: our client id must be in it and ``azp`` must name it;
* ``exp`` and ``iat`` are required, not only checked when present;
* only ``LtiResourceLinkRequest``, ``LtiDeepLinkingRequest`` and ``LtiSubmissionReviewRequest``
  are accepted;
* the platform's JWKS is cached in the database and fetched again for an unknown ``kid``;
* every outgoing HTTP call has a timeout;
* ``target_link_uri`` must point at this tool (no open redirect);
* the state may be kept by the platform (LTI Platform Storage) when cookies are refused.

Every refusal is a ``LaunchError`` with a sentence naming the problem; the views make it a 400.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests
from pylti1p3.contrib.flask import FlaskCookieService, FlaskMessageLaunch, FlaskOIDCLogin
from pylti1p3.contrib.flask.request import FlaskRequest
from pylti1p3.exception import LtiException, OIDCException, ToolConfException
from pylti1p3.session import SessionService
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from service.db.base import utcnow
from service.db.lti import LtiLogin, LtiPlatform
from service.lti.platforms import DbToolConf

#: How long a login may take to come back as a launch.
LOGIN_LIFETIME = timedelta(minutes=10)
#: Seconds for any call to a platform (JWKS, token, AGS, NRPS).
HTTP_TIMEOUT_S = 15.0

L = "https://purl.imsglobal.org/spec/lti/claim/"
DL = "https://purl.imsglobal.org/spec/lti-dl/claim/"
AGS = "https://purl.imsglobal.org/spec/lti-ags/claim/endpoint"
NRPS = "https://purl.imsglobal.org/spec/lti-nrps/claim/namesroleservice"
RESOURCE_LINK = "LtiResourceLinkRequest"
DEEP_LINKING = "LtiDeepLinkingRequest"
SUBMISSION_REVIEW = "LtiSubmissionReviewRequest"
MESSAGE_TYPES = (RESOURCE_LINK, DEEP_LINKING, SUBMISSION_REVIEW)
LOGIN_PARAMS = (
    "iss",
    "login_hint",
    "target_link_uri",
    "lti_message_hint",
    "client_id",
    "lti_deployment_id",
)


class LaunchError(Exception):
    """A login or launch kgrade refuses; the message says what is wrong."""


class CookieRefused(LaunchError):
    """The browser did not send the state cookie back; ``login`` is the login to retry in a
    new window (where the cookie is first-party)."""

    def __init__(self, message: str, login: LtiLogin) -> None:
        super().__init__(message)
        self.login = login


class TimeoutSession(requests.Session):
    """requests with a default timeout: a platform that hangs cannot hang a worker."""

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        kwargs.setdefault("timeout", HTTP_TIMEOUT_S)
        return super().request(*args, **kwargs)


def http() -> requests.Session:
    s = TimeoutSession()
    s.headers["User-Agent"] = "kgrade-lti/1.0"
    return s


class DbSessionService(SessionService):
    """pylti1p3's session service over ``lti_logins``: nonces are checked there (and consumed
    by ``validate_launch``); the library's own launch cache and its "same state, same token"
    shortcut (which lets a replay through) are off: kgrade stores launches itself."""

    def __init__(self, request: FlaskRequest, session: Session) -> None:
        super().__init__(request)
        self.db = session

    def save_nonce(self, nonce: str) -> None:
        pass  # recorded with its state by begin_login, from the redirect it built

    def check_nonce(self, nonce: str) -> bool:
        return (
            self.db.execute(
                select(LtiLogin.state).where(
                    LtiLogin.nonce == nonce,
                    LtiLogin.consumed_at.is_(None),
                    LtiLogin.expires_at > utcnow(),
                )
            ).first()
            is not None
        )

    def check_state_is_valid(self, state: str, id_token_hash: str) -> bool:
        return False

    def set_state_valid(self, state: str, id_token_hash: str) -> None:
        pass

    def save_launch_data(self, key: str, jwt_body: Any) -> None:
        pass

    def save_state_params(self, state: str, params: Any) -> None:
        pass


def _request(params: dict[str, str], is_secure: bool, cookies: dict[str, str]) -> FlaskRequest:
    return FlaskRequest(
        cookies=cookies, session={}, request_data=params, request_is_secure=is_secure
    )


@dataclass
class LoginStarted:
    redirect_url: str
    state: str
    nonce: str
    platform: LtiPlatform
    storage_target: str | None
    cookies: FlaskCookieService


def begin_login(
    session: Session,
    params: dict[str, str],
    *,
    launch_url: str,
    tool_host: str,
    is_secure: bool,
    cookies: dict[str, str],
) -> LoginStarted:
    """Validate a login initiation and record its state and nonce; where to send the browser."""
    for name in ("iss", "login_hint"):
        if not params.get(name):
            raise LaunchError(f"the login initiation has no '{name}'")
    target = params.get("target_link_uri")
    if target and urlsplit(target).netloc.lower() != tool_host.lower():
        raise LaunchError(
            f"target_link_uri {target!r} is not on this tool ({tool_host}); "
            "check the tool URL registered in the platform"
        )
    storage_target = params.get("lti_storage_target") or None
    if storage_target and len(storage_target) > 255:
        raise LaunchError("lti_storage_target is too long")
    req = _request(params, is_secure, cookies)
    conf = DbToolConf(session)
    cookie_service = FlaskCookieService(req)
    oidc = FlaskOIDCLogin(
        req, conf, session_service=DbSessionService(req, session), cookie_service=cookie_service
    )
    try:
        url = oidc.get_redirect_object(launch_url).get_redirect_url()
    except OIDCException as exc:
        message = str(exc)
        if "registration" in message.lower():
            message = (
                f"no registration for issuer {params['iss']!r}"
                + (f" and client_id {params['client_id']!r}" if params.get("client_id") else "")
                + " (kgrade lti register; with several registrations for one issuer the "
                "platform must send client_id)"
            )
        raise LaunchError(message) from None
    except (LtiException, ToolConfException) as exc:
        raise LaunchError(str(exc)) from None
    query = parse_qs(urlsplit(url).query)
    state, nonce = query["state"][0], query["nonce"][0]
    assert conf.platform is not None
    now = utcnow()
    # Logins that never came back go as new ones come.
    session.execute(delete(LtiLogin).where(LtiLogin.expires_at < now - LOGIN_LIFETIME))
    session.add(
        LtiLogin(
            state=state,
            nonce=nonce,
            platform_id=conf.platform.id,
            storage_target=storage_target,
            params={k: params[k] for k in LOGIN_PARAMS if params.get(k)},
            created_at=now,
            expires_at=now + LOGIN_LIFETIME,
        )
    )
    session.flush()
    return LoginStarted(url, state, nonce, conf.platform, storage_target, cookie_service)


class KgradeMessageLaunch(FlaskMessageLaunch):
    """pylti1p3's launch with kgrade's extra checks (see the module docstring)."""

    def __init__(self, request: FlaskRequest, conf: DbToolConf, session: Session) -> None:
        super().__init__(
            request,
            conf,
            session_service=DbSessionService(request, session),
            cookie_service=FlaskCookieService(request),
            requests_session=http(),
        )
        # Stricter than the library's default, never looser: exp and iat must be present.
        self._jwt_verify_options = {"verify_aud": False, "require": ["exp", "iat"]}
        self._conf = conf
        self.state_from_storage = False

    def validate_state(self) -> KgradeMessageLaunch:
        state = self._get_request_param("state")
        if not state:
            raise LaunchError("the launch has no 'state'")
        if self._cookie_service.get_cookie(state) == state:
            return self
        login = self._conf.session.get(LtiLogin, state) if len(state) <= 64 else None
        if login is None or login.expires_at < utcnow():
            raise LaunchError("state not found: this launch was not started here, or expired")
        if login.storage_target and self._get_request_param("lti_storage_checked") == "1":
            # The platform's storage (postMessage) held this state and nonce for the browser
            # that started the login: the page we served compared them before posting back.
            self.state_from_storage = True
            return self
        raise CookieRefused(
            "your browser did not send back kgrade's cookie (third-party cookies are blocked "
            "in this frame)",
            login,
        )

    def get_client_id(self) -> str:
        body = self._jwt.get("body", {})
        aud, azp = body.get("aud"), body.get("azp")
        if isinstance(aud, list):
            if not aud or not all(isinstance(a, str) and a for a in aud):
                raise LaunchError("'aud' must be a client id or a list of them")
            if azp is None:
                if len(aud) != 1:
                    raise LaunchError("'aud' names several clients but 'azp' is missing")
                return aud[0]
            if azp not in aud:
                raise LaunchError(f"'azp' {azp!r} is not among the token's audiences")
            return azp
        if not isinstance(aud, str) or not aud:
            raise LaunchError("the id_token has no 'aud'")
        if azp is not None and azp != aud:
            raise LaunchError(f"'azp' {azp!r} is not the token's audience {aud!r}")
        return aud

    def validate_registration(self) -> KgradeMessageLaunch:
        body = self._jwt.get("body", {})
        iss, client_id = body.get("iss"), self.get_client_id()
        if not iss or self._conf.find_registration_by_params(iss, client_id) is None:
            raise LaunchError(f"no registration for issuer {iss!r} and client id {client_id!r}")
        super().validate_registration()
        return self

    def get_public_key(self) -> tuple[str, str]:
        assert self._registration is not None
        cached = self._registration.get_key_set() is not None
        try:
            key = super().get_public_key()
        except LtiException as exc:
            if not cached or "Unable to find public key" not in str(exc):
                raise
            # A kid our cached JWKS lacks: the platform rotated its keys. Fetch once more.
            self._registration.set_key_set(None)
            key = super().get_public_key()
        if not cached:
            self._conf.store_key_set(self._registration.get_key_set())  # type: ignore[arg-type]
        return key

    def validate_message(self) -> KgradeMessageLaunch:
        body = self._jwt.get("body", {})
        kind = body.get(L + "message_type")
        if kind not in MESSAGE_TYPES:
            raise LaunchError(
                f"message_type {kind!r} is not one kgrade handles ({', '.join(MESSAGE_TYPES)})"
            )
        if body.get(L + "version") != "1.3.0":
            raise LaunchError(f"LTI version {body.get(L + 'version')!r}; kgrade speaks 1.3.0")
        super().validate_message()
        return self


@dataclass
class Launch:
    """A validated launch: its claims and the registration it came through."""

    id: str
    platform: LtiPlatform
    claims: dict[str, Any]
    state: str
    from_storage: bool = False

    @property
    def message_type(self) -> str:
        return str(self.claims[L + "message_type"])

    @property
    def deployment_id(self) -> str:
        return str(self.claims[L + "deployment_id"])

    def claim(self, name: str, default: Any = None) -> Any:
        return self.claims.get(L + name, default)


def validate_launch(
    session: Session, params: dict[str, str], *, is_secure: bool, cookies: dict[str, str]
) -> Launch:
    """Validate a launch POST (``id_token``, ``state``) and consume its nonce."""
    if not params.get("id_token"):
        raise LaunchError("the launch has no 'id_token'")
    req = _request(params, is_secure, cookies)
    conf = DbToolConf(session)
    launch = KgradeMessageLaunch(req, conf, session)
    try:
        launch.validate()
    except LaunchError:
        raise
    except (LtiException, OIDCException, ToolConfException) as exc:
        raise LaunchError(_plain(str(exc))) from None
    except (ValueError, TypeError, KeyError) as exc:  # malformed claims the library trips on
        raise LaunchError(f"malformed id_token ({type(exc).__name__}: {exc})") from None
    claims: dict[str, Any] = dict(launch.get_launch_data())
    state = params["state"]
    # One launch per login: the nonce goes with the state it was issued with, and only once.
    consumed = session.execute(
        update(LtiLogin)
        .where(
            LtiLogin.state == state,
            LtiLogin.nonce == claims.get("nonce"),
            LtiLogin.consumed_at.is_(None),
            LtiLogin.expires_at > utcnow(),
        )
        .values(consumed_at=utcnow())
    ).rowcount
    if consumed != 1:
        raise LaunchError("this launch was already used (nonce replayed) or its login expired")
    assert conf.platform is not None
    return Launch(
        id=uuid.uuid4().hex,
        platform=conf.platform,
        claims=claims,
        state=state,
        from_storage=launch.state_from_storage,
    )


def _plain(message: str) -> str:
    known = {
        "Invalid Nonce.": "nonce not issued by kgrade (or already used)",
        "State not found": "state not found: this launch was not started here",
        "Unable to find public key": "the token's key id is not in the platform's JWKS",
    }
    for k, v in known.items():
        if message.startswith(k):
            return v
    if message.startswith("Can't decode id_token: "):
        return "id_token refused: " + message.removeprefix("Can't decode id_token: ")
    return message
