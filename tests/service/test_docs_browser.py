"""Headless Chromium opens /api/v1/docs on a live server and finds every path of the spec."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from service import create_app

pytestmark = pytest.mark.browser


@pytest.fixture
def live_url(tmp_path: Path) -> Iterator[str]:
    # SQLite only: the page needs no data, just a running app.
    app = create_app(
        {"DATABASE_URL": f"sqlite:///{tmp_path / 'docs.sqlite3'}", "IMPORT_BANK": False}
    )
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=5)


def test_docs_page_in_chromium(live_url: str, chromium_path: str) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    with urllib.request.urlopen(f"{live_url}/api/v1/openapi.json") as resp:
        spec = json.load(resp)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path, headless=True)
        try:
            page = browser.new_page()
            requests: list[str] = []
            page.on("request", lambda req: requests.append(req.url))
            page.goto(f"{live_url}/api/v1/docs")
            assert "kgrade" in page.title()
            sections = page.locator("section.op")
            shown = {
                (
                    sections.nth(i).get_attribute("data-method"),
                    sections.nth(i).get_attribute("data-path"),
                )
                for i in range(sections.count())
            }
            expected = {
                (m.upper(), path)
                for path, item in spec["paths"].items()
                for m in item
                if m != "parameters"
            }
            assert expected == shown
            # Each path is visible text, not just an attribute.
            body = page.inner_text("body")
            for path in spec["paths"]:
                assert path in body
            # Links inside the page work (schema anchors exist) and nothing came from elsewhere.
            page.click("a[href='#schema-Answer']")
            assert page.locator("#schema-Answer").is_visible()
            assert all(u.startswith(live_url) for u in requests), requests
        finally:
            browser.close()
