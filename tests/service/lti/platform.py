"""An LMS in a thread: real RS256 keys, a real HTTP server, nothing switched off.

``FakePlatform`` serves what kgrade calls (``/jwks``, ``/token``, line items, scores,
memberships) and what a browser needs (``/auth``: the OIDC authorization endpoint that answers
with an auto-submitting form carrying a signed ``id_token``; ``/dl-return``: where deep
linking comes back). It checks kgrade's token assertions and bearer tokens as a platform would,
records every score, and can be told to fail (``fail_next``) to exercise retries.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from html import escape
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from flask import Flask, Response, jsonify, request
from werkzeug.serving import make_server

L = "https://purl.imsglobal.org/spec/lti/claim/"
DL = "https://purl.imsglobal.org/spec/lti-dl/claim/"
AGS = "https://purl.imsglobal.org/spec/lti-ags/"
NRPS = "https://purl.imsglobal.org/spec/lti-nrps/claim/namesroleservice"
LEARNER = "http://purl.imsglobal.org/vocab/lis/v2/membership#Learner"
INSTRUCTOR = "http://purl.imsglobal.org/vocab/lis/v2/membership#Instructor"
SCORE_TYPE = "application/vnd.ims.lis.v1.score+json"


def new_key() -> Any:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_jwk(key: Any, kid: str) -> dict[str, Any]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return {**jwk, "kid": kid, "alg": "RS256", "use": "sig"}


@dataclass
class Failure:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""


@dataclass
class FakePlatform:
    issuer: str = ""
    client_id: str = "kgrade-client-1"
    deployment_id: str = "dep-1"
    tool_jwks_url: str = "https://tool.test/lti/jwks"
    # How the platform reads the tool's JWKS when the tool is a test client, not a server.
    tool_jwks: Any = None
    page_size: int = 2
    scores: list[dict[str, Any]] = field(default_factory=list)
    token_requests: list[dict[str, Any]] = field(default_factory=list)
    lineitem_posts: list[dict[str, Any]] = field(default_factory=list)
    deep_link_returns: list[str] = field(default_factory=list)
    lineitems: dict[str, dict[str, Any]] = field(default_factory=dict)
    members: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, list[Failure]] = field(default_factory=dict)
    storage: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.key = new_key()
        self.kid = "p1"
        self.retired: list[tuple[Any, str]] = []
        self.tokens: dict[str, float] = {}
        self.next_lineitem = 2  # ids are never reused, even after a deletion
        self.lock = threading.Lock()
        self.app = self._make_app()
        self.server = make_server("127.0.0.1", 0, self.app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.issuer = self.issuer or self.url
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.lineitems["1"] = {
            "id": f"{self.url}/lineitems/1",
            "scoreMaximum": 100,
            "label": "Pre-made column",
            "resourceId": "premade",
        }

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)

    # --- registration --------------------------------------------------------------------

    @property
    def login_url(self) -> str:
        return f"{self.url}/auth"

    @property
    def token_url(self) -> str:
        return f"{self.url}/token"

    @property
    def jwks_url(self) -> str:
        return f"{self.url}/jwks"

    @property
    def lineitems_url(self) -> str:
        return f"{self.url}/lineitems"

    @property
    def memberships_url(self) -> str:
        return f"{self.url}/memberships"

    def rotate(self) -> None:
        """A new signing key (its kid unknown to any cached JWKS); the old one stays listed."""
        self.retired.append((self.key, self.kid))
        self.key, self.kid = new_key(), f"p{len(self.retired) + 1}"

    def fail_next(self, what: str, *failures: Failure) -> None:
        """The next calls to ``what`` ("token", "score", "lineitems", "members") fail so."""
        with self.lock:
            self.failures.setdefault(what, []).extend(failures)

    def _failure(self, what: str) -> Response | None:
        with self.lock:
            queue = self.failures.get(what) or []
            f = queue.pop(0) if queue else None
        if f is None:
            return None
        return Response(
            f.body or json.dumps({"reason": f"injected {f.status}"}),
            f.status,
            headers=f.headers,
            mimetype="application/json",
        )

    # --- id tokens -----------------------------------------------------------------------

    def claims(
        self,
        nonce: str,
        *,
        sub: str = "s1",
        roles: list[str] | None = None,
        context: str = "ctx-1",
        resource_link: str | None = "rl-1",
        message_type: str = "LtiResourceLinkRequest",
        lineitem: str | None = None,
        custom: dict[str, str] | None = None,
        name: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        now = int(time.time())
        c: dict[str, Any] = {
            "iss": self.issuer,
            "aud": self.client_id,
            "sub": sub,
            "iat": now,
            "exp": now + 300,
            "nonce": nonce,
            "name": name or f"Person {sub}",
            "email": f"{sub}@example.edu",
            L + "deployment_id": self.deployment_id,
            L + "version": "1.3.0",
            L + "message_type": message_type,
            L + "target_link_uri": "https://tool.test/lti/launch",
            L + "roles": roles if roles is not None else [LEARNER],
            L + "context": {"id": context, "title": f"Course {context}", "label": context.upper()},
            AGS + "claim/endpoint": {
                "scope": [
                    AGS + "scope/score",
                    AGS + "scope/lineitem",
                    AGS + "scope/lineitem.readonly",
                ],
                "lineitems": f"{self.lineitems_url}?context={context}",
                **({"lineitem": lineitem} if lineitem else {}),
            },
            NRPS: {"context_memberships_url": self.memberships_url, "service_versions": ["2.0"]},
        }
        if resource_link is not None:
            c[L + "resource_link"] = {"id": resource_link, "title": "A link"}
        if custom:
            c[L + "custom"] = custom
        if message_type == "LtiDeepLinkingRequest":
            c.pop(L + "resource_link", None)
            c[DL + "deep_linking_settings"] = {
                "deep_link_return_url": f"{self.url}/dl-return",
                "accept_types": ["ltiResourceLink"],
                "accept_presentation_document_targets": ["iframe", "window"],
                "accept_multiple": False,
                "data": "opaque-platform-data",
            }
        c.update(extra)
        return {k: v for k, v in c.items() if v is not None}

    def sign(self, claims: dict[str, Any], *, key: Any = None, kid: str | None = None) -> str:
        headers = {"kid": kid if kid is not None else self.kid}
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers=headers)

    def id_token(self, nonce: str, **kw: Any) -> str:
        return self.sign(self.claims(nonce, **kw))

    # --- the HTTP side -------------------------------------------------------------------

    def _tool_keys(self) -> dict[str, Any]:
        if self.tool_jwks is not None:
            return self.tool_jwks()
        import requests
        import urllib3

        # The tool under test serves a throwaway self-signed certificate.
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        return requests.get(self.tool_jwks_url, timeout=10, verify=False).json()

    def verify_tool_jwt(self, token: str, audience: str) -> dict[str, Any]:
        header = jwt.get_unverified_header(token)
        keys = {k["kid"]: k for k in self._tool_keys()["keys"]}
        key = jwt.algorithms.RSAAlgorithm.from_jwk(json.dumps(keys[header["kid"]]))
        return jwt.decode(token, key, algorithms=["RS256"], audience=audience)

    def _bearer_ok(self) -> bool:
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ")
        expires = self.tokens.get(token)
        return bool(expires and expires > time.time())

    def _make_app(self) -> Flask:
        app = Flask("fake-platform")
        platform = self

        @app.get("/jwks")
        def jwks() -> Response:
            keys = [public_jwk(platform.key, platform.kid)]
            keys += [public_jwk(k, kid) for k, kid in platform.retired]
            return jsonify({"keys": keys})

        @app.post("/token")
        def token() -> Any:
            if (f := platform._failure("token")) is not None:
                return f
            form = request.form.to_dict()
            platform.token_requests.append(form)
            assert form["grant_type"] == "client_credentials"
            assert form["client_assertion_type"] == (
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
            )
            try:
                claims = platform.verify_tool_jwt(form["client_assertion"], platform.token_url)
            except Exception as exc:  # noqa: BLE001 - a platform answers 400 to a bad assertion
                return jsonify({"error": "invalid_client", "detail": str(exc)}), 400
            if claims["iss"] != platform.client_id or claims["sub"] != platform.client_id:
                return jsonify({"error": "invalid_client"}), 400
            tok = secrets.token_urlsafe(16)
            platform.tokens[tok] = time.time() + 3600
            return jsonify(
                {
                    "access_token": tok,
                    "token_type": "bearer",
                    "expires_in": 3600,
                    "scope": form.get("scope", ""),
                }
            )

        @app.route("/lineitems", methods=["GET", "POST"])
        def lineitems() -> Any:
            if not platform._bearer_ok():
                return jsonify({"error": "unauthorized"}), 401
            if (f := platform._failure("lineitems")) is not None:
                return f
            if request.method == "POST":
                assert request.content_type == "application/vnd.ims.lis.v2.lineitem+json"
                body = request.get_json(force=True)
                platform.lineitem_posts.append(body)
                with platform.lock:
                    new_id = str(max(map(int, platform.lineitems), default=0) + 1)
                    new_id = str(max(int(new_id), platform.next_lineitem))
                    platform.next_lineitem = int(new_id) + 1
                    item = {**body, "id": f"{platform.url}/lineitems/{new_id}"}
                    platform.lineitems[new_id] = item
                return jsonify(item), 201
            items = list(platform.lineitems.values())
            rid = request.args.get("resource_id")
            if rid:
                items = [i for i in items if i.get("resourceId") == rid]
            page = int(request.args.get("page", 0))
            chunk = items[page * platform.page_size : (page + 1) * platform.page_size]
            resp = jsonify(chunk)
            if (page + 1) * platform.page_size < len(items):
                nxt = f"{platform.lineitems_url}?page={page + 1}" + (
                    f"&resource_id={rid}" if rid else ""
                )
                resp.headers["Link"] = f'<{nxt}>; rel="next"'
            return resp

        @app.post("/lineitems/<item_id>/scores")
        def scores(item_id: str) -> Any:
            if not platform._bearer_ok():
                return jsonify({"error": "unauthorized"}), 401
            if (f := platform._failure("score")) is not None:
                return f
            if item_id not in platform.lineitems:
                return jsonify({"reason": "line item deleted"}), 404
            if request.content_type != SCORE_TYPE:
                return jsonify({"reason": f"bad media type {request.content_type}"}), 415
            body = request.get_json(force=True)
            platform.scores.append(
                {
                    "lineitem": item_id,
                    "query": request.query_string.decode(),
                    "received": time.time(),
                    **body,
                }
            )
            return "", 200

        @app.get("/memberships")
        def memberships() -> Any:
            if not platform._bearer_ok():
                return jsonify({"error": "unauthorized"}), 401
            if (f := platform._failure("members")) is not None:
                return f
            page = int(request.args.get("page", 0))
            chunk = platform.members[page * platform.page_size : (page + 1) * platform.page_size]
            resp = jsonify({"id": platform.memberships_url, "members": chunk})
            if (page + 1) * platform.page_size < len(platform.members):
                resp.headers["Link"] = f'<{platform.memberships_url}?page={page + 1}>; rel="next"'
            return resp

        @app.route("/auth", methods=["GET", "POST"])
        def auth() -> Response:
            """The OIDC authorization endpoint: the user is whoever ``login_hint`` names."""
            p = request.values
            hint = json.loads(p["login_hint"])
            claims = platform.claims(p["nonce"], **hint)
            token = platform.sign(claims)
            html = (
                f'<!doctype html><html lang="en"><title>platform</title><body>'
                f'<form id="f" method="post" action="{escape(p["redirect_uri"])}">'
                f'<input type="hidden" name="id_token" value="{token}">'
                f'<input type="hidden" name="state" value="{escape(p["state"])}">'
                f"<noscript><button>go</button></noscript></form>"
                f'<script>document.getElementById("f").submit()</script></body></html>'
            )
            return Response(html, mimetype="text/html")

        @app.get("/course")
        def course_page() -> Response:
            """A course page of the LMS: kgrade in an iframe, started by login initiation, and
            the LTI Platform Storage responder (``lti.put_data`` / ``lti.get_data``)."""
            from urllib.parse import urlencode

            tool = request.args["tool"]
            query = {
                "iss": platform.issuer,
                "login_hint": request.args["hint"],
                "target_link_uri": f"{tool}/lti/launch",
                "client_id": platform.client_id,
                "lti_deployment_id": platform.deployment_id,
            }
            if request.args.get("storage"):
                query["lti_storage_target"] = "_parent"
            src = f"{tool}/lti/login?{urlencode(query)}"
            width, _, height = request.args.get("frame", "900x700").partition("x")
            html = (
                '<!doctype html><html lang="en"><head><title>LMS course</title>'
                '<link rel="icon" href="data:,"></head><body>'
                "<h1>LMS course page</h1>"
                f'<iframe id="tool" title="kgrade" src="{escape(src)}" width="{int(width)}" height="{int(height)}"'
                ' allow="clipboard-write"></iframe>'
                "<script>"
                "var store = {};"
                'window.addEventListener("message", function (e) {'
                "  var d = e.data || {};"
                '  if (d.subject === "lti.put_data") { store[e.origin + " " + d.key] = d.value;'
                '    e.source.postMessage({subject: "lti.put_data.response", message_id: d.message_id,'
                "      key: d.key, value: d.value}, e.origin); }"
                '  if (d.subject === "lti.get_data") {'
                '    e.source.postMessage({subject: "lti.get_data.response", message_id: d.message_id,'
                '      key: d.key, value: store[e.origin + " " + d.key]}, e.origin); }'
                "});"
                "</script></body></html>"
            )
            return Response(html, mimetype="text/html")

        @app.post("/dl-return")
        def dl_return() -> Response:
            platform.deep_link_returns.append(request.form["JWT"])
            return Response("<p>content added</p>", mimetype="text/html")

        return app


def registration_args(p: FakePlatform) -> list[str]:
    return [
        "--issuer",
        p.issuer,
        "--client-id",
        p.client_id,
        "--deployment",
        p.deployment_id,
        "--login-url",
        p.login_url,
        "--token-url",
        p.token_url,
        "--jwks-url",
        p.jwks_url,
    ]


def member(sub: str, role: str = LEARNER, status: str = "Active") -> dict[str, Any]:
    return {
        "user_id": sub,
        "name": f"Person {sub}",
        "email": f"{sub}@example.edu",
        "roles": [role],
        "status": status,
    }


def ids() -> Iterator[str]:
    while True:
        yield uuid.uuid4().hex
