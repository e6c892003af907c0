"""Response headers of every page: who may frame kgrade, what a page may load, no sniffing.

``frame-ancestors`` names this tool and the registered platforms' origins only (an LMS iframe
works, a stranger's frame does not); scripts come only from ``/static`` (no inline script
anywhere); forms may post to us and, for deep linking, back to a registered platform. Behind a
TLS proxy, ``KGRADE_PROXY_FIX`` makes the app see https (so the session cookie can be
``SameSite=None; Secure; Partitioned``).
"""

from __future__ import annotations

import time

from flask import Flask, Response
from werkzeug.middleware.proxy_fix import ProxyFix

from service.extensions import db

#: Registered origins are read at most this often (seconds) per process.
_TTL = 30.0
_cache: dict[str, tuple[float, list[str]]] = {}


def platform_origins() -> list[str]:
    from service.lti.platforms import origins

    key = str(db.engine.url)
    hit = _cache.get(key)
    if hit is not None and time.monotonic() - hit[0] < _TTL:
        return hit[1]
    try:
        found = origins(db.session)
    except Exception:  # noqa: BLE001 - no LTI tables yet (before migration): frame nobody
        db.session.rollback()
        found = []
    _cache[key] = (time.monotonic(), found)
    return found


def forget_origins() -> None:
    """After a registration changes (``kgrade lti register``, tests)."""
    _cache.clear()


def csp() -> str:
    platforms = " ".join(platform_origins())
    return "; ".join(
        [
            "default-src 'self'",
            "script-src 'self'",
            # KaTeX and Chart.js set style attributes.
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data:",
            "font-src 'self' data:",
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'self'",
            f"form-action 'self' {platforms}".strip(),
            f"frame-ancestors 'self' {platforms}".strip(),
        ]
    )


def init_app(app: Flask) -> None:
    hops = int(app.config.get("PROXY_FIX") or 0)
    if hops:
        app.wsgi_app = ProxyFix(  # type: ignore[method-assign]
            app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops, x_port=hops, x_prefix=hops
        )

    @app.after_request
    def _headers(resp: Response) -> Response:
        resp.headers.setdefault("X-Content-Type-Options", "nosniff")
        if resp.mimetype == "text/html":
            resp.headers.setdefault("Content-Security-Policy", csp())
            # Session tokens may ride in URLs inside an LMS frame: never hand them on.
            resp.headers.setdefault("Referrer-Policy", "same-origin")
        return resp
