"""Browser tests: the service on a real port (HTTP, or HTTPS for the tool inside an LMS frame),
Debian's Chromium driven by Playwright for Python, and axe-core from npm.

``KGRADE_SCREENSHOTS=DIR`` saves a PNG of every page the tests visit into DIR (the committed
ones in docs/screenshots come from such a run).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from werkzeug.serving import make_server

from service import create_app
from service.auth import create_token
from service.db import write_intent
from service.extensions import db
from service.migrations import upgrade
from tests.conftest import ROOT

pytestmark = pytest.mark.browser

AXE = ROOT / "frontend" / "node_modules" / "axe-core" / "axe.min.js"
#: Impacts that fail a page (axe's scale: minor, moderate, serious, critical).
BLOCKING = ("serious", "critical")
PHONE = {"width": 360, "height": 740}
WIDE = {"width": 1280, "height": 900}


@dataclass
class Site:
    """kgrade served on a real port, with its app for arranging data."""

    app: Flask
    url: str
    tmp: Path

    def token(self, role: str, name: str, course: Any = None) -> str:
        with self.app.app_context(), write_intent():
            t = create_token(db.session, role=role, name=name, course=course)[1]
            db.session.commit()
        return t


class Server:
    def __init__(self, app: Flask, ssl: bool = False, host: str = "127.0.0.1") -> None:
        ctx = None
        if ssl:
            ctx = _ssl_context()
        self.server = make_server(host, 0, app, threaded=True, ssl_context=ctx)
        scheme = "https" if ssl else "http"
        name = "localhost" if ssl else host
        self.url = f"{scheme}://{name}:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)


def _ssl_context() -> Any:
    """A throwaway self-signed certificate for localhost (the browser is told to accept it)."""
    import datetime
    import ssl
    import tempfile

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    folder = Path(tempfile.mkdtemp(prefix="kgrade-tls-"))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    return ctx


def make_site_app(tmp: Path, **config: Any) -> Flask:
    url = f"sqlite:///{tmp / 'site.sqlite3'}"
    upgrade(url)
    return create_app({"DATABASE_URL": url, "IMPORT_BANK": True, "TASKS_EAGER": True, **config})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("site")
    app = make_site_app(tmp)
    server = Server(app)
    try:
        yield Site(app, server.url, tmp)
    finally:
        server.stop()


#: Debian's Chromium as root, headless, with nothing reaching out of this machine.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def playwright() -> Iterator[Any]:
    """One Playwright driver for the session (a second one in the same thread is refused)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        yield p


@pytest.fixture(scope="session")
def chromium(playwright: Any, chromium_path: str) -> Iterator[Any]:
    browser = playwright.chromium.launch(
        executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS
    )
    try:
        yield browser
    finally:
        browser.close()


@dataclass
class Seen:
    """Everything the page loaded: to prove what did not reach the browser."""

    bodies: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join(b for _, b in self.bodies)


def watch(page: Any) -> Seen:
    seen = Seen()

    def on_response(resp: Any) -> None:
        ctype = resp.headers.get("content-type", "")
        if any(t in ctype for t in ("text/html", "application/json", "javascript")):
            # Redirects have no body.
            with contextlib.suppress(Exception):
                seen.bodies.append((resp.url, resp.text()))

    page.on("response", on_response)
    page.on("pageerror", lambda exc: seen.errors.append(str(exc)))
    page.on(
        "console",
        lambda msg: seen.errors.append(msg.text) if msg.type == "error" else None,
    )
    return seen


def axe(target: Any) -> list[dict[str, Any]]:
    """axe-core's violations on a page or frame (WCAG 2.1 A and AA rules, best practices)."""
    if not AXE.is_file():
        pytest.fail(f"axe-core is missing at {AXE}: run `make assets`")
    if not target.evaluate("() => !!window.axe"):
        target.evaluate(AXE.read_text())
    result = target.evaluate(
        """() => axe.run(document, {runOnly: {type: 'tag',
              values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice']}})"""
    )
    return [
        {
            "id": v["id"],
            "impact": v["impact"],
            "help": v["help"],
            "nodes": [n["target"] for n in v["nodes"]][:5],
        }
        for v in result["violations"]
    ]


AXE_LOG: dict[str, list[dict[str, Any]]] = {}


def check_page(target: Any, name: str, *, width_of: Any = None) -> None:
    """axe (no serious or critical violation), no sideways scrolling, and a screenshot."""
    found = axe(target)
    AXE_LOG[name] = found
    blocking = [v for v in found if v["impact"] in BLOCKING]
    assert blocking == [], f"{name}: {json.dumps(blocking, indent=1)}"
    overflow = target.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 1, f"{name}: the page scrolls sideways by {overflow}px"
    shot(width_of or target, name)


def shot(page: Any, name: str) -> None:
    folder = os.environ.get("KGRADE_SCREENSHOTS")
    if not folder or not hasattr(page, "screenshot"):
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(300)  # let the editor and the chart finish their layout
    page.screenshot(
        path=str(Path(folder) / f"{re.sub(r'[^a-z0-9-]+', '-', name.lower())}.png"), full_page=True
    )


def sign_in(context: Any, site: Site, token: str) -> Any:
    page = context.new_page()
    page.goto(site.url + "/signin")
    page.get_by_label("Access token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(site.url + "/")
    return page


def pytest_sessionfinish(session: Any) -> None:
    """Write the axe result per page where the screenshots go (for docs)."""
    folder = os.environ.get("KGRADE_SCREENSHOTS")
    if folder and AXE_LOG:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "axe.json").write_text(json.dumps(AXE_LOG, indent=1, sort_keys=True))


@pytest.fixture(scope="module")
def grading(site: Site, celery_redis: dict[str, str], tmp_path_factory: Any) -> Iterator[Path]:
    """A real CPU grading worker for the site (Redis), timing on tiny shapes so that timings
    exist on a CPU (``KGRADE_BENCH_REHEARSAL``)."""
    import uuid

    from tests.service.conftest import running_worker
    from workers.queues import worker_argv

    var = tmp_path_factory.mktemp("grader")
    env = dict(
        os.environ,
        **celery_redis,
        DATABASE_URL=site.app.config["DATABASE_URL"],
        KGRADE_VAR_DIR=str(var),
        KGRADE_BENCH_REHEARSAL="1",
    )
    with running_worker(worker_argv(["cpu"], f"web-{uuid.uuid4().hex[:6]}@%h"), env, var) as log:
        yield log


def watch_progress(page: Any, timeout_s: float) -> list[str]:
    """The progress lines a submission page showed, until it shows a verdict."""
    import time

    phases: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if page.locator("#verdict-h").count():
            return phases
        try:
            line = page.locator("#grading-status .phase").inner_text(timeout=1000)
        except Exception:  # noqa: BLE001 - the page is reloading with the result
            line = ""
        if line and (not phases or phases[-1] != line):
            phases.append(line)
        time.sleep(0.1)
    raise AssertionError(f"no verdict after {timeout_s} s; saw {phases}")
