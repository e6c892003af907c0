"""Flask extensions, created unbound here and bound to an app with ``init_app``: the database
(``db``) and the rate limits (``rate_limits``, flask-limiter)."""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial, wraps
from typing import Any, TypeVar, cast

from flask import Flask, Response, current_app, g, request
from flask_smorest import Api
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.db import load_models, make_engine
from service.db.request import RequestSession

F = TypeVar("F", bound=Callable[..., Any])


class Database:
    """One engine per app, one session per app context (request or CLI command).

    A small replacement for Flask-SQLAlchemy (not a dependency) with the same shape:
    ``db.init_app(app)``, then ``db.session`` inside a request; the session is closed (and any
    uncommitted work rolled back) when the app context ends. It is a ``RequestSession``: a Core
    connection, with an ORM session on it only for requests that use the ORM.
    """

    EXT_KEY = "kgrade.db"

    def init_app(self, app: Flask) -> None:
        load_models()
        engine = make_engine(app.config["DATABASE_URL"], **app.config.get("ENGINE_OPTIONS", {}))
        factory = sessionmaker(bind=engine, expire_on_commit=False)
        app.extensions[self.EXT_KEY] = (engine, factory)
        app.teardown_appcontext(self._close)

    @property
    def engine(self) -> Engine:
        return current_app.extensions[self.EXT_KEY][0]

    @property
    def session(self) -> Session:
        """The app context's session: a ``RequestSession`` (``service.db.request``), which
        offers ``Session``'s interface and makes the ORM session only if it is used."""
        sess: RequestSession | None = g.get("_kgrade_session")
        if sess is None:
            sess = RequestSession(*current_app.extensions[self.EXT_KEY])
            g._kgrade_session = sess
        return cast(Session, sess)

    @staticmethod
    def _close(_exc: BaseException | None) -> None:
        sess: RequestSession | None = g.pop("_kgrade_session", None)
        if sess is not None:
            sess.close()


def current_api() -> Api:
    return current_app.extensions["flask-smorest"]["apis"][""]["ext_obj"]


db = Database()


# --- rate limits (flask-limiter) ---------------------------------------------------------------

#: Paths never limited, whatever limits a deployment configures: probes and scrapes must
#: never be throttled (a throttled readiness probe takes the pod out of service).
UNLIMITED_PATHS = ("/healthz", "/readyz", "/metrics")


@dataclass(frozen=True)
class LimitSpec:
    """One named limit: its setting (``N/SECONDS`` in the app config), what it counts and by
    what key, for the views, the 429's message and the OpenAPI document."""

    name: str
    setting: str
    env: str
    default: str
    counts: str  # "submissions", "failed sign-ins": the 429's message says "at most N <counts>"
    per: str  # what the key is, for the docs: "student", "IP address"
    key: Callable[[], str]
    exempt_when: Callable[[], bool] | None = None
    #: Count a request only when its response passes this (None: every request counts).
    deduct_when: Callable[[Response], bool] | None = None
    methods: tuple[str, ...] | None = None
    note: str = ""


def parse_rate(raw: str, setting: str) -> tuple[int, int]:
    """``"6/60"`` -> (6, 60): at most N in any SECONDS; a clear error naming the setting."""
    count, sep, seconds = str(raw).strip().partition("/")
    try:
        n, s = int(count), int(seconds) if sep else 60
    except ValueError:
        raise RuntimeError(f"{setting} must be N/SECONDS (say 6/60), not {raw!r}") from None
    if n < 1 or s < 1:
        raise RuntimeError(f"{setting} must be N/SECONDS with N, SECONDS >= 1, not {raw!r}")
    return n, s


#: flask-limiter's settings for limits on every request (not on one view)
APP_WIDE_LIMITS = ("RATELIMIT_DEFAULT", "RATELIMIT_APPLICATION", "RATELIMIT_META")


class RateLimits:
    """Rate limits through flask-limiter, one ``Limiter`` per app.

    A ``Limiter`` keeps its storage and key prefix on itself, so one module-level instance
    cannot serve two apps (tests build several; two on one Redis must share counts, not one
    object). Views name a limit with ``limited(name)``; on the first request the view is wrapped
    with that app's ``Limiter.limit`` (flask-limiter's own decorator, so its checks, conditional
    deductions and error all apply), and the wrapped view is kept for the app's life.

    Storage: ``RATE_LIMIT_STORAGE_URL``, else ``REDIS_URL`` (counts shared by every process and
    pod), else memory (``make run``: one process). Keys carry ``RATE_LIMIT_KEY_PREFIX``. The
    moving-window strategy counts the last SECONDS exactly, like the per-student limit it
    replaced. A storage outage lets requests through (logged): a limiter must not take sign-in
    down with it. A limit that counts only some responses (``deduct_when``) tests before the
    view and counts after it, so requests already in flight together may pass it by their
    number: a bound on abuse, not an exact quota (the old limiter locked the student's row).
    """

    EXT_KEY = "kgrade.limiter"

    def __init__(self) -> None:
        self.specs: dict[str, LimitSpec] = {}

    def define(self, spec: LimitSpec) -> LimitSpec:
        self.specs[spec.name] = spec
        return spec

    def init_app(self, app: Flask) -> None:
        from flask_limiter import Limiter, RateLimitExceeded

        for spec in self.specs.values():
            parse_rate(self.rate_string(spec, app.config), spec.env)  # fail at start-up
        url = storage_url(app.config)
        options: dict[str, Any] = {}
        if not url.startswith("memory://"):
            # Storage keys under our prefix: Limiter.reset (tests) deletes only this app's.
            options = {
                "key_prefix": f"{key_prefix(app.config)}LIMITS",
                "socket_connect_timeout": 2,
                "socket_timeout": 2,
            }
        limiter = Limiter(
            # Our limits name their own keys; this one serves limits a deployment sets with
            # flask-limiter's own RATELIMIT_DEFAULT / RATELIMIT_APPLICATION: per address.
            key_func=_remote_address,
            storage_uri=url,
            storage_options=options,
            strategy="moving-window",
            key_prefix=key_prefix(app.config),
            swallow_errors=True,
            headers_enabled=False,
        )
        limiter.request_filter(lambda: request.path.rstrip("/") in UNLIMITED_PATHS)
        limiter.init_app(app)
        if not any(app.config.get(k) for k in APP_WIDE_LIMITS):
            # Our limits sit on their views (``limited``), which check themselves when called;
            # the before-request pass only serves app-wide limits a deployment may set, and
            # costs about 0.3 ms of CPU on every request (half of a /healthz).
            with contextlib.suppress(ValueError, AttributeError):
                app.before_request_funcs[None].remove(limiter._check_request_limit)
        _skip_hooks_when_unused(app, limiter)
        app.extensions[self.EXT_KEY] = _AppLimits(limiter)
        app.register_error_handler(RateLimitExceeded, self._too_many)

    def limiter(self, app: Flask | None = None) -> Any:
        return (app or current_app).extensions[self.EXT_KEY].limiter

    def reset(self, app: Flask) -> None:
        """Forget every count of this app (tests: each starts with none)."""
        self.limiter(app).reset()

    def limited(self, name: str) -> Callable[[F], F]:
        """Decorate a view (below its route and authentication) with the limit ``name``."""
        spec = self.specs[name]

        def decorator(func: F) -> F:
            @wraps(func)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                state: _AppLimits | None = current_app.extensions.get(self.EXT_KEY)
                if state is None:  # an app built without limits
                    return func(*args, **kwargs)
                return state.view(spec, func, self.rate_string)(*args, **kwargs)

            apidoc = dict(getattr(wrapper, "_apidoc", {}))
            apidoc["kgrade_rate_limit"] = name  # read by service.api.common's doc callback
            wrapper._apidoc = apidoc  # type: ignore[attr-defined]
            return wrapper  # type: ignore[return-value]

        return decorator

    @staticmethod
    def rate_string(spec: LimitSpec, config: Mapping[str, Any]) -> str:
        value = config.get(spec.setting)
        return str(value if value is not None else os.environ.get(spec.env) or spec.default)

    def describe(self, name: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """The limit as the OpenAPI document states it (``x-rate-limit``)."""
        spec = self.specs[name]
        n, seconds = parse_rate(self.rate_string(spec, config), spec.env)
        out: dict[str, Any] = {
            "limit": n,
            "window_seconds": seconds,
            "per": spec.per,
            "counts": spec.counts,
            "setting": spec.env,
        }
        if spec.note:
            out["note"] = spec.note
        return out

    def _too_many(self, exc: Any) -> Any:
        """The 429 of any limit: the API's JSON error under /api (or for a JSON client), else
        a page; always with ``Retry-After``, never flask-limiter's own HTML."""
        from service.web.guard import error_page

        current = self.limiter().current_limit
        retry = 1
        if current is not None:
            # window[0]: when the oldest counted request leaves the window (moving window).
            retry = max(1, math.ceil(current.window[0] - time.time()))
        message = f"rate limit: {exc.description}; retry in {retry} s"
        headers = {"Retry-After": str(retry)}
        if request.path.startswith("/api"):
            exc.data = {"message": message, "headers": headers}
            return current_api().handle_http_exception(exc)
        return error_page(
            429, f"Too many attempts: {exc.description}. Try again in {retry} s.", headers=headers
        )


#: Where flask-limiter keeps a request's state, made on first use (``Limiter.context``).
_LIMITER_STATE = "_limiter_request_context"


def _skip_hooks_when_unused(app: Flask, limiter: Any) -> None:
    """Run flask-limiter's after-request and teardown hooks only in requests where it did
    something.

    Those hooks read the request's limiter state (conditional deductions, the limit that
    applied) and reset it; asking for the state makes an empty one. A request that met no limit
    (every quiz request: limits sit on their own views, the before-request pass is gone) has
    nothing to deduct, report or reset, and making and resetting its empty state was about
    2 % of a quiz answer's CPU. With any state made in the request, they run as before.
    """
    try:
        from flask_limiter._compat import request_context  # where Limiter.context keeps it
    except ImportError:  # another flask-limiter layout: keep its hooks as they are
        return

    def used() -> bool:
        return hasattr(request_context(), _LIMITER_STATE)

    inject = getattr(type(limiter), "_Limiter__inject_headers", None)
    after = app.after_request_funcs.get(None, [])
    for i, hook in enumerate(after):
        if isinstance(hook, partial) and hook.func is inject and hook.args == (limiter,):

            def after_request(response: Response, hook: Any = hook) -> Response:
                return hook(response) if used() else response

            after[i] = after_request
    release = getattr(limiter, "_Limiter__release_context", None)
    teardown = app.teardown_request_funcs.get(None, [])
    for i, hook in enumerate(teardown):
        if release is not None and hook == release:

            def teardown_request(exc: BaseException | None = None, hook: Any = hook) -> None:
                if used():
                    hook(exc)

            teardown[i] = teardown_request


class _AppLimits:
    """One app's Limiter and its views wrapped by it (made on first use, once)."""

    def __init__(self, limiter: Any) -> None:
        self.limiter = limiter
        self._views: dict[tuple[str, int], Callable[..., Any]] = {}
        self._lock = threading.Lock()

    def view(
        self,
        spec: LimitSpec,
        func: Callable[..., Any],
        rate_string: Callable[[LimitSpec, Mapping[str, Any]], str],
    ) -> Callable[..., Any]:
        key = (spec.name, id(func))
        wrapped = self._views.get(key)
        if wrapped is None:
            with self._lock:  # registering twice would count every request twice
                wrapped = self._views.get(key)
                if wrapped is None:

                    def limit_value() -> str:
                        # Read per request: a changed setting (tests) applies at once.
                        n, s = parse_rate(rate_string(spec, current_app.config), spec.env)
                        return f"{n} per {s} second"

                    def message() -> str:
                        n, s = parse_rate(rate_string(spec, current_app.config), spec.env)
                        return f"at most {n} {spec.counts} per {s} s per {spec.per}"

                    wrapped = self.limiter.limit(
                        limit_value,
                        key_func=spec.key,
                        exempt_when=spec.exempt_when,
                        deduct_when=spec.deduct_when,
                        methods=list(spec.methods) if spec.methods else None,
                        error_message=message,
                    )(func)
                    self._views[key] = wrapped
        return wrapped


def storage_url(config: Mapping[str, Any]) -> str:
    url = config.get("RATE_LIMIT_STORAGE_URL") or config.get(
        "REDIS_URL", os.environ.get("REDIS_URL")
    )
    return url or "memory://"


def key_prefix(config: Mapping[str, Any]) -> str:
    """``RATE_LIMIT_KEY_PREFIX``, else the deployment's Redis namespace
    (``KGRADE_REDIS_KEYPREFIX``, as the Celery broker keys) + ``kgrade-rl:``."""
    prefix = config.get("RATE_LIMIT_KEY_PREFIX")
    if prefix:
        return str(prefix)
    return f"{os.environ.get('KGRADE_REDIS_KEYPREFIX', '')}kgrade-rl:"


rate_limits = RateLimits()


# --- the limits ------------------------------------------------------------------------------


def _student() -> str:
    from service.auth import current_principal  # the view authenticated it already

    return f"user:{current_principal().user_id}"


def _instructor() -> bool:
    from service.auth import current_principal

    return current_principal().is_instructor


def _remote_address() -> str:
    # Behind a proxy, KGRADE_PROXY_FIX makes this the client's address, not the proxy's.
    return f"ip:{request.remote_addr or 'unknown'}"


def _accepted(resp: Response) -> bool:
    # Only a submission that was stored counts: a refused one (4xx, 503 with the broker down)
    # or an idempotent replay of one already counted uses no slot.
    return 200 <= resp.status_code < 300 and "Idempotent-Replayed" not in resp.headers


def _failed_signin(resp: Response) -> bool:
    # A classroom behind one NAT address signs in together: only failures count. A refusal
    # by the limit itself (429) does not, so the window ends when it says it does.
    return 400 <= resp.status_code < 500 and resp.status_code != 429


SUBMISSIONS = rate_limits.define(
    LimitSpec(
        name="submissions",
        setting="SUBMISSION_RATE",
        env="KGRADE_SUBMISSION_RATE",
        default="6/60",
        counts="submissions",
        per="student",
        key=_student,
        exempt_when=_instructor,
        deduct_when=_accepted,
        note="counts accepted submissions (202) in a moving window; instructors are exempt",
    )
)
SIGNIN = rate_limits.define(
    LimitSpec(
        name="signin",
        setting="SIGNIN_RATE",
        env="KGRADE_SIGNIN_RATE",
        default="10/60",
        counts="failed sign-ins",
        per="IP address",
        key=_remote_address,
        deduct_when=_failed_signin,
        methods=("POST",),
        note="counts refused sign-ins (bad or revoked token, expired form) per client address",
    )
)
