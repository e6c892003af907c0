"""LTI 1.3 login and launch: the OIDC redirect, a valid launch, and every attack refused.

The platform signs real RS256 tokens; the tool fetches its JWKS over HTTP; nothing in the
verification is switched off.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import select

from service.db.courses import Course, Membership, User
from service.db.lti import LtiLogin
from service.extensions import db
from tests.service.lti.conftest import TOOL, LtiWorld, text
from tests.service.lti.platform import INSTRUCTOR, LEARNER, L, new_key


def test_login_redirects_to_the_platform_with_state_and_nonce(lti: LtiWorld) -> None:
    b = lti.browser()
    r = b.login(lti_message_hint="msg-7")
    assert r.status_code == 302, r.get_data(as_text=True)
    url = urlsplit(r.headers["Location"])
    assert f"{url.scheme}://{url.netloc}{url.path}" == lti.platform.login_url
    q = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert q["scope"] == "openid"
    assert q["response_type"] == "id_token"
    assert q["response_mode"] == "form_post"
    assert q["prompt"] == "none"
    assert q["client_id"] == lti.platform.client_id
    assert q["redirect_uri"] == f"{TOOL}/lti/launch"
    assert q["login_hint"] == "hint-1" and q["lti_message_hint"] == "msg-7"
    assert q["state"] and q["nonce"] and q["state"] != q["nonce"]
    # The state cookie is third-party inside an LMS frame: SameSite=None, Secure, Partitioned.
    cookie = next(c for c in r.headers.getlist("Set-Cookie") if q["state"] in c)
    assert "SameSite=None" in cookie and "Secure" in cookie and "Partitioned" in cookie
    # A second login gets a new state and nonce.
    q2 = parse_qs(urlsplit(b.login().headers["Location"]).query)
    assert q2["state"][0] != q["state"] and q2["nonce"][0] != q["nonce"]


def test_login_by_get_works_too(lti: LtiWorld) -> None:
    p = lti.platform
    b = lti.browser()
    r = b.client.get(
        "/lti/login",
        query_string={"iss": p.issuer, "login_hint": "h", "client_id": p.client_id},
    )
    assert r.status_code == 302 and r.headers["Location"].startswith(p.login_url)


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"iss": ""}, "'iss'"),
        ({"login_hint": ""}, "'login_hint'"),
        ({"iss": "https://stranger.example"}, "no registration"),
        ({"client_id": "someone-else"}, "no registration"),
        ({"target_link_uri": "https://evil.example/steal"}, "target_link_uri"),
    ],
)
def test_bad_login_is_a_400_naming_the_problem(
    lti: LtiWorld, params: dict[str, str], says: str
) -> None:
    r = lti.browser().login(**params)
    assert r.status_code == 400
    assert says in text(r)
    j = lti.browser().client.post(
        "/lti/login", data={"iss": "", "login_hint": "x"}, headers={"Accept": "application/json"}
    )
    assert j.status_code == 400 and j.is_json and "'iss'" in j.get_json()["message"]


def test_a_valid_launch_makes_course_user_and_session(lti: LtiWorld) -> None:
    b, page = lti.student("s-42", name="Ada Lovelace", context="ctx-A")
    # No assignment behind this link yet: the student is told so, signed in all the same.
    assert page.status_code == 200
    assert "not set up yet" in page.get_data(as_text=True)
    with lti.app.app_context():
        user = db.session.execute(select(User).where(User.sub == "s-42")).scalar_one()
        assert user.issuer == lti.platform.issuer and user.name == "Ada Lovelace"
        course = db.session.execute(select(Course).where(Course.context_id == "ctx-A")).scalar_one()
        assert course.title == "Course ctx-A" and course.platform_id is not None
        assert course.nrps_url == lti.platform.memberships_url
        m = db.session.execute(
            select(Membership).where(
                Membership.user_id == user.id, Membership.course_id == course.id
            )
        ).scalar_one()
        assert m.role == "student" and m.lti_roles == [LEARNER]
    # The session cookie has the attributes an LMS iframe needs.
    state, nonce = b.start()
    r = b.post_launch(lti.platform.id_token(nonce, sub="s-42"), state)
    cookie = next(c for c in r.headers.getlist("Set-Cookie") if c.startswith("kgrade_session="))
    for attr in ("Secure", "HttpOnly", "SameSite=None", "Partitioned", "Path=/"):
        assert attr in cookie, cookie


@pytest.mark.parametrize(
    ("roles", "role"),
    [
        ([INSTRUCTOR], "instructor"),
        (
            ["http://purl.imsglobal.org/vocab/lis/v2/membership/Instructor#TeachingAssistant"],
            "instructor",
        ),
        (["http://purl.imsglobal.org/vocab/lis/v2/system/person#Administrator"], "instructor"),
        (
            ["http://purl.imsglobal.org/vocab/lis/v2/institution/person#Administrator", LEARNER],
            "instructor",
        ),
        (
            [LEARNER, "http://purl.imsglobal.org/vocab/lis/v2/institution/person#Instructor"],
            "student",
        ),
        (["Learner"], "student"),
    ],
)
def test_roles_map_to_instructor_or_student(lti: LtiWorld, roles: list[str], role: str) -> None:
    b = lti.browser()
    b.launch(sub="r1", roles=roles)
    with lti.app.app_context():
        m = db.session.execute(
            select(Membership).join(User, User.id == Membership.user_id).where(User.sub == "r1")
        ).scalar_one()
        assert m.role == role


def test_a_role_without_access_is_refused(lti: LtiWorld) -> None:
    b = lti.browser()
    state, nonce = b.start()
    mentor = "http://purl.imsglobal.org/vocab/lis/v2/membership#Mentor"
    r = b.post_launch(lti.platform.id_token(nonce, roles=[mentor]), state)
    assert r.status_code == 400 and "no access" in text(r)


def _attack(lti: LtiWorld, build: Any, *, extra: dict[str, str] | None = None) -> Any:
    b = lti.browser()
    state, nonce = b.start()
    token, state = build(b, state, nonce)
    return b.post_launch(token, state, **(extra or {}))


def _claims(lti: LtiWorld, nonce: str, **changes: Any) -> dict[str, Any]:
    c = lti.platform.claims(nonce)
    for k, v in changes.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    return c


ATTACKS: dict[str, tuple[Any, str]] = {
    "expired": (
        lambda lti, b, s, n: (lti.platform.sign(_claims(lti, n, exp=int(time.time()) - 5)), s),
        "expired",
    ),
    "future iat": (
        lambda lti, b, s, n: (lti.platform.sign(_claims(lti, n, iat=int(time.time()) + 600)), s),
        "not yet valid",
    ),
    "no exp": (lambda lti, b, s, n: (lti.platform.sign(_claims(lti, n, exp=None)), s), "exp"),
    "wrong aud": (
        lambda lti, b, s, n: (lti.platform.sign(_claims(lti, n, aud="other-client")), s),
        "no registration",
    ),
    "list aud with bad azp": (
        lambda lti, b, s, n: (
            lti.platform.sign(_claims(lti, n, aud=[lti.platform.client_id, "x"], azp="x")),
            s,
        ),
        "no registration",
    ),
    "list aud, azp not in it": (
        lambda lti, b, s, n: (
            lti.platform.sign(_claims(lti, n, aud=[lti.platform.client_id], azp="zz")),
            s,
        ),
        "azp",
    ),
    "list aud of several, no azp": (
        lambda lti, b, s, n: (
            lti.platform.sign(_claims(lti, n, aud=[lti.platform.client_id, "x"])),
            s,
        ),
        "azp",
    ),
    "unknown deployment": (
        lambda lti, b, s, n: (
            lti.platform.sign(_claims(lti, n, **{L + "deployment_id": "dep-9"})),
            s,
        ),
        "deployment",
    ),
    "forged signature": (
        lambda lti, b, s, n: (lti.platform.sign(lti.platform.claims(n), key=new_key()), s),
        "id_token refused",
    ),
    "unknown kid": (
        lambda lti, b, s, n: (lti.platform.sign(lti.platform.claims(n), kid="nope"), s),
        "key id",
    ),
    "bad state": (lambda lti, b, s, n: (lti.platform.id_token(n), "state-forged"), "state"),
    "unissued nonce": (lambda lti, b, s, n: (lti.platform.id_token("made-up-nonce"), s), "nonce"),
    "another login's nonce": (
        lambda lti, b, s, n: (lti.platform.id_token(b.start()[1]), s),
        "already used",
    ),
    "wrong version": (
        lambda lti, b, s, n: (lti.platform.sign(_claims(lti, n, **{L + "version": "1.1"})), s),
        "version",
    ),
    "privacy message type": (
        lambda lti, b, s, n: (
            lti.platform.sign(_claims(lti, n, **{L + "message_type": "DataPrivacyLaunchRequest"})),
            s,
        ),
        "message_type",
    ),
    "unknown message type": (
        lambda lti, b, s, n: (
            lti.platform.sign(_claims(lti, n, **{L + "message_type": "Nope"})),
            s,
        ),
        "message_type",
    ),
    "no sub": (lambda lti, b, s, n: (lti.platform.sign(_claims(lti, n, sub=None)), s), "sub"),
    "no roles": (
        lambda lti, b, s, n: (lti.platform.sign(_claims(lti, n, **{L + "roles": None})), s),
        "Roles",
    ),
    "no resource link": (
        lambda lti, b, s, n: (lti.platform.sign(_claims(lti, n, **{L + "resource_link": None})), s),
        "Resource Link",
    ),
    "two-part token": (lambda lti, b, s, n: ("abc.def", s), "3 parts"),
    "garbage token": (lambda lti, b, s, n: ("a.b.c", s), "decoded"),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_refused_with_a_400_naming_it(lti: LtiWorld, name: str) -> None:
    build, says = ATTACKS[name]
    r = _attack(lti, lambda b, s, n: build(lti, b, s, n))
    body = text(r)
    assert r.status_code == 400, body
    assert says.lower() in body.lower(), body
    assert b"Traceback" not in r.data


def test_replayed_launch_is_refused(lti: LtiWorld) -> None:
    b = lti.browser()
    state, nonce = b.start()
    token = lti.platform.id_token(nonce)
    assert b.post_launch(token, state).status_code == 303
    again = b.post_launch(token, state)
    assert again.status_code == 400 and "already used" in text(again)
    # The same token from another browser (a stolen one) has no state cookie either.
    thief = lti.browser()
    assert thief.post_launch(token, state).status_code == 400


def test_platform_key_rotation_is_followed(lti: LtiWorld) -> None:
    b = lti.browser()
    b.launch()  # the tool caches the platform's JWKS
    lti.platform.rotate()
    page = b.launch()  # a new kid: fetched again, not refused
    assert page.status_code == 200


def test_launch_without_cookie_offers_a_new_window(lti: LtiWorld) -> None:
    b = lti.browser()
    state, nonce = b.start()
    b.client.delete_cookie(f"lti1p3-{state}", domain="tool.test")
    r = b.post_launch(lti.platform.id_token(nonce), state)
    assert r.status_code == 400
    html = r.get_data(as_text=True)
    assert "new window" in html and "lti1p3_new_window=1" in html
    with lti.app.app_context():
        login = db.session.get(LtiLogin, state)
        assert login is not None and login.consumed_at is None  # nothing was accepted


def test_platform_storage_keeps_the_state_when_cookies_are_refused(lti: LtiWorld) -> None:
    b = lti.browser()
    r = b.login(lti_storage_target="post_message_forwarding")
    assert r.status_code == 200  # a page that stores state and nonce through postMessage
    html = r.get_data(as_text=True)
    assert 'id="lti-storage-login"' in html and 'data-target="post_message_forwarding"' in html
    loc = html.split('data-auth-url="')[1].split('"')[0].replace("&amp;", "&")
    q = parse_qs(urlsplit(loc).query)
    state, nonce = q["state"][0], q["nonce"][0]
    assert f'data-state="{state}"' in html and f'data-nonce="{nonce}"' in html
    b.client.delete_cookie(f"lti1p3-{state}", domain="tool.test")
    token = lti.platform.id_token(nonce)
    first = b.post_launch(token, state)
    assert first.status_code == 200 and 'id="lti-storage-launch"' in first.get_data(as_text=True)
    # The page's script compared the platform's stored values, then posted back.
    done = b.post_launch(token, state, lti_storage_checked="1")
    assert done.status_code == 303
    assert b.post_launch(token, state, lti_storage_checked="1").status_code == 400  # once only


def test_jwks_publishes_the_tool_key(lti: LtiWorld) -> None:
    r = lti.browser().client.get("/lti/jwks")
    keys = r.get_json()["keys"]
    assert len(keys) == 1 and keys[0]["kty"] == "RSA" and keys[0]["alg"] == "RS256"
    assert keys[0]["kid"] and "d" not in keys[0]  # public only


def test_frame_ancestors_names_the_registered_platform(lti: LtiWorld) -> None:
    r = lti.browser().client.get("/signin")
    csp = r.headers["Content-Security-Policy"]
    directive = next(d for d in csp.split(";") if "frame-ancestors" in d)
    assert lti.platform.url in directive and "'self'" in directive
    assert "*" not in directive
