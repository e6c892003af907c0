"""LTI Advantage service calls: OAuth2 tokens, Assignment and Grade Services, Names and Roles.

Tokens come from pylti1p3's client-credentials grant (an RS256 assertion signed with our key),
cached in the database per registration and scope set until they expire, so every worker
process shares them. Each call classifies the platform's answer:

* ``Transient``: worth retrying later (429; Canvas's throttling 403 with
  ``x-rate-limit-remaining: 0``; 5xx; no connection), with the platform's ``Retry-After``;
* ``Refused``: the platform said no for good (any other 4xx), with its reason for the
  instructor (an unpublished course, a deleted grade column);
* ``Superseded``: the platform holds a newer score (Moodle's 409 for an older timestamp).

A 401 refetches the token once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import requests
from pylti1p3.exception import LtiServiceException
from pylti1p3.service_connector import ServiceConnector
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.db.base import utcnow
from service.db.courses import Assignment, Course
from service.db.lti import LtiAccessToken, LtiLineItem, LtiPlatform
from service.lti.launch import http
from service.lti.platforms import registration

SCOPE = "https://purl.imsglobal.org/spec/lti-ags/scope/"
SCORE = SCOPE + "score"
LINEITEM = SCOPE + "lineitem"
LINEITEM_READ = SCOPE + "lineitem.readonly"
NRPS_SCOPE = "https://purl.imsglobal.org/spec/lti-nrps/scope/contextmembership.readonly"
SCORE_TYPE = "application/vnd.ims.lis.v1.score+json"
LINEITEM_TYPE = "application/vnd.ims.lis.v2.lineitem+json"
LINEITEMS_TYPE = "application/vnd.ims.lis.v2.lineitemcontainer+json"
MEMBERS_TYPE = "application/vnd.ims.lti-nrps.v2.membershipcontainer+json"
#: A token is not used in its last seconds: a call must not reach the platform expired.
TOKEN_MARGIN = timedelta(seconds=30)
#: A line-item claim older than this is taken over (its worker died before creating it).
CLAIM_STALE = timedelta(minutes=2)


class PlatformError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Transient(PlatformError):
    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message, status)
        self.retry_after = retry_after


class Refused(PlatformError):
    pass


class Superseded(PlatformError):
    pass


def _reason(r: requests.Response) -> str:
    text = (r.text or "").strip()
    try:
        body = r.json()
        if isinstance(body, dict):
            text = str(body.get("reason") or body.get("message") or body.get("error") or text)
            if isinstance(body.get("errors"), list | dict):
                text = f"{text} {json.dumps(body['errors'])[:300]}".strip()
    except ValueError:
        pass
    return " ".join(text.split())[:500] or r.reason or "no reason given"


def _retry_after(r: requests.Response) -> float | None:
    raw = r.headers.get("Retry-After")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, (parsedate_to_datetime(raw) - utcnow()).total_seconds())
        except (TypeError, ValueError):
            return None


def classify(r: requests.Response, what: str) -> None:
    """Raise for anything but a 2xx (see the module docstring)."""
    if r.ok:
        return
    reason = f"{what}: HTTP {r.status_code}: {_reason(r)}"
    throttled = r.status_code == 403 and r.headers.get("x-rate-limit-remaining") == "0"
    if r.status_code == 429 or throttled or r.status_code >= 500:
        raise Transient(reason, r.status_code, _retry_after(r))
    if r.status_code == 409:
        raise Superseded(reason, r.status_code)
    raise Refused(reason, r.status_code)


class Connector(ServiceConnector):
    """pylti1p3's service connector with the token cache in the database."""

    def __init__(self, session: Session, platform: LtiPlatform) -> None:
        super().__init__(registration(session, platform), http())
        self.db = session
        self.platform = platform

    def _scope_key(self, scopes: Any) -> str:
        return " ".join(sorted(scopes))

    def _get_cached_access_token(self, scope_key: str) -> str | None:
        row = self.db.get(LtiAccessToken, (self.platform.id, scope_key))
        if row is None or row.expires_at - TOKEN_MARGIN <= utcnow():
            return None
        return row.token

    def _cache_access_token(self, scope_key: str, access_token: str, expires_in: float) -> None:
        expires = utcnow() + timedelta(seconds=float(expires_in or 0))
        row = self.db.get(LtiAccessToken, (self.platform.id, scope_key))
        if row is None:
            row = LtiAccessToken(platform_id=self.platform.id, scopes=scope_key)
            self.db.add(row)
        row.token, row.expires_at = access_token, expires
        # The connector belongs to a task: commit, so no write lock is held over the next call.
        self.db.commit()

    def forget_token(self, scopes: list[str]) -> None:
        self.db.execute(
            delete(LtiAccessToken).where(
                LtiAccessToken.platform_id == self.platform.id,
                LtiAccessToken.scopes == self._scope_key(scopes),
            )
        )

    def token(self, scopes: list[str]) -> str:
        try:
            return self.get_access_token(scopes)
        except LtiServiceException as exc:
            classify(exc.response, "access token")
            raise Refused(f"access token: {exc}") from None
        except requests.RequestException as exc:
            raise Transient(f"access token: {type(exc).__name__}: {exc}") from None
        except (KeyError, ValueError) as exc:
            raise Refused(f"access token: the platform's answer lacks {exc}") from None

    def call(
        self,
        method: str,
        url: str,
        scopes: list[str],
        what: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        accept: str = "application/json",
    ) -> requests.Response:
        """One service call, classified; a 401 refetches the token and tries once more."""
        for attempt in (1, 2):
            headers = {"Authorization": "Bearer " + self.token(scopes), "Accept": accept}
            data = None
            if body is not None:
                headers["Content-Type"] = content_type or "application/json"
                data = json.dumps(body)
            try:
                r = self._requests_session.request(method, url, data=data, headers=headers)
            except requests.RequestException as exc:
                raise Transient(f"{what}: {type(exc).__name__}: {exc}") from None
            if r.status_code == 401 and attempt == 1:
                self.forget_token(scopes)
                continue
            classify(r, what)
            return r
        raise AssertionError("unreachable")

    def pages(self, url: str, scopes: list[str], what: str, accept: str) -> Iterator[Any]:
        """Each page's JSON body, following ``Link: <...>; rel="next"``."""
        seen = 0
        next_url: str | None = url
        while next_url and seen < 200:
            r = self.call("GET", next_url, scopes, what, accept=accept)
            seen += 1
            yield r.json() if r.content else None
            next_url = r.links.get("next", {}).get("url")


def scores_url(lineitem: str) -> str:
    """``<lineitem>/scores``, inserted before any query string (Moodle's ``?type_id=``)."""
    p = urlsplit(lineitem)
    return urlunsplit((p.scheme, p.netloc, p.path.rstrip("/") + "/scores", p.query, p.fragment))


def _with_query(url: str, **params: str) -> str:
    p = urlsplit(url)
    query = "&".join(q for q in (p.query, urlencode(params)) if q)
    return urlunsplit((p.scheme, p.netloc, p.path, query, p.fragment))


def ags_scopes(course: Course) -> list[str]:
    granted = list(course.ags_scopes or [])
    return sorted(set(granted)) or [SCORE]


def lineitem_for(session: Session, conn: Connector, course: Course, assignment: Assignment) -> str:
    """The assignment's grade column URL, made only if the platform has none for it.

    1. the URL we hold (from the launch claim or an earlier lookup);
    2. the platform's line items filtered by ``resource_id`` (pages followed, filtered here too);
    3. else a new line item, created by whichever worker claims the unique
       (registration, context, resourceId) row first; the others wait for its URL.
    """
    if assignment.lineitem_url:
        return assignment.lineitem_url
    rid = assignment.line_item_resource_id
    assert course.platform_id is not None and course.context_id is not None
    key = (
        LtiLineItem.platform_id == course.platform_id,
        LtiLineItem.context_id == course.context_id,
        LtiLineItem.resource_id == rid,
    )
    row = session.execute(select(LtiLineItem).where(*key)).scalar_one_or_none()
    if row is not None and row.url:
        assignment.lineitem_url = row.url
        return row.url
    if not course.lineitems_url:
        raise Refused(
            "the platform gave this course no line items service (is Assignment and Grade "
            "Services enabled for the tool?) and the link carries no grade column"
        )
    scopes = ags_scopes(course)
    for page in conn.pages(
        _with_query(course.lineitems_url, resource_id=rid), scopes, "line items", LINEITEMS_TYPE
    ):
        for item in page or []:
            if isinstance(item, dict) and item.get("resourceId") == rid and item.get("id"):
                return _remember(session, course, assignment, rid, str(item["id"]))
    if row is None:
        row = LtiLineItem(
            platform_id=course.platform_id,
            context_id=course.context_id,
            resource_id=rid,
            url=None,
            claimed_at=utcnow(),
        )
        try:
            with session.begin_nested():
                session.add(row)
        except IntegrityError:
            raise Transient("another worker is creating this grade column") from None
        session.commit()  # the claim is visible to other workers before the POST
    elif row.claimed_at > utcnow() - CLAIM_STALE:
        raise Transient("another worker is creating this grade column")
    else:
        row.claimed_at = utcnow()
        session.commit()
    r = conn.call(
        "POST",
        course.lineitems_url,
        scopes,
        "create line item",
        body={
            "scoreMaximum": assignment.score_maximum,
            "label": assignment.title,
            "resourceId": rid,
            "tag": "kgrade",
            **(
                {"resourceLinkId": assignment.resource_link_id}
                if assignment.resource_link_id
                else {}
            ),
        },
        content_type=LINEITEM_TYPE,
        accept=LINEITEM_TYPE,
    )
    url = str(r.json()["id"])
    return _remember(session, course, assignment, rid, url)


def _remember(session: Session, course: Course, assignment: Assignment, rid: str, url: str) -> str:
    row = session.execute(
        select(LtiLineItem).where(
            LtiLineItem.platform_id == course.platform_id,
            LtiLineItem.context_id == course.context_id,
            LtiLineItem.resource_id == rid,
        )
    ).scalar_one_or_none()
    if row is None:
        row = LtiLineItem(
            platform_id=course.platform_id,
            context_id=course.context_id,
            resource_id=rid,
            claimed_at=utcnow(),
        )
        session.add(row)
    row.url = url
    assignment.lineitem_url = url
    session.flush()
    return url


def forget_lineitem(session: Session, course: Course, assignment: Assignment) -> None:
    assignment.lineitem_url = None
    session.execute(
        delete(LtiLineItem).where(
            LtiLineItem.platform_id == course.platform_id,
            LtiLineItem.context_id == course.context_id,
            LtiLineItem.resource_id == assignment.line_item_resource_id,
        )
    )


def post_score(conn: Connector, course: Course, lineitem: str, score: dict[str, Any]) -> int:
    r = conn.call(
        "POST",
        scores_url(lineitem),
        ags_scopes(course),
        "score",
        body=score,
        content_type=SCORE_TYPE,
    )
    return r.status_code


def memberships(conn: Connector, url: str) -> Iterator[dict[str, Any]]:
    for page in conn.pages(url, [NRPS_SCOPE], "roster", MEMBERS_TYPE):
        for m in (page or {}).get("members") or []:
            if isinstance(m, dict):
                yield m
