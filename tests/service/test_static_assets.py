"""The browser assets that `make assets` (part of every set-up) builds into service/static/vendor/.

frontend/build.mjs bundles the CodeMirror editor, copies KaTeX and Chart.js from the npm packages
pinned in frontend/package-lock.json, and writes a licence file per shipped package and
manifest.json. These checks read the built folder; no browser.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.conftest import ROOT

FRONTEND = ROOT / "frontend"
VENDOR = ROOT / "service" / "static" / "vendor"
MANIFEST = VENDOR / "manifest.json"


@pytest.fixture(scope="module")
def manifest() -> list[dict]:
    if not MANIFEST.is_file():
        message = f"{MANIFEST.relative_to(ROOT)} is missing: run `make assets`"
        if os.environ.get("KGRADE_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return json.loads(MANIFEST.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def package_json() -> dict:
    return json.loads((FRONTEND / "package.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def lock() -> dict:
    return json.loads((FRONTEND / "package-lock.json").read_text(encoding="utf-8"))


def _by_name(manifest: list[dict]) -> dict[str, dict]:
    return {entry["name"]: entry for entry in manifest}


def test_manifest_lists_the_shipped_packages(manifest):
    names = [entry["name"] for entry in manifest]
    assert names == sorted(names) and len(names) == len(set(names))
    for required in (
        "katex",
        "chart.js",
        "codemirror",
        "@codemirror/view",
        "@codemirror/state",
        "@codemirror/lang-python",
        "@lezer/python",
    ):
        assert required in names
    # Used by the browser tests only, never shipped.
    assert "axe-core" not in names and "esbuild" not in names
    assert not (VENDOR / "axe.min.js").exists()
    for entry in manifest:
        assert set(entry) >= {"name", "version", "license", "files"}
        assert entry["version"] and entry["license"] and entry["files"]


def test_every_manifest_file_exists(manifest):
    for entry in manifest:
        for name in entry["files"]:
            path = VENDOR / name
            assert path.is_file(), f"{entry['name']}: {name} missing"
            assert path.stat().st_size > 0, f"{entry['name']}: {name} is empty"


def test_every_shipped_package_has_a_licence(manifest):
    for entry in manifest:
        path = VENDOR / "licenses" / f"{entry['name'].replace('/', '__')}.txt"
        assert path.is_file(), f"no licence file for {entry['name']}"
        text = path.read_text(encoding="utf-8").strip()
        assert text, f"empty licence file for {entry['name']}"
        assert entry.get("license_file", f"licenses/{path.name}") == f"licenses/{path.name}"


def test_editor_bundle_exposes_kgrade_editor(manifest):
    text = (VENDOR / "editor.js").read_text(encoding="utf-8")
    assert "KgradeEditor" in text
    bundled = [entry["name"] for entry in manifest if "editor.js" in entry["files"]]
    assert "@codemirror/view" in bundled and "@lezer/python" in bundled


def test_katex_and_chart_are_in_place(manifest):
    katex = VENDOR / "katex"
    for name in ("katex.min.js", "katex.min.css", "contrib/auto-render.min.js"):
        assert (katex / name).is_file()
    fonts = list((katex / "fonts").iterdir())
    assert fonts, "the KaTeX fonts folder is empty"
    # Every font the stylesheet points at is shipped (the pages must work offline).
    css = (katex / "katex.min.css").read_text(encoding="utf-8")
    referenced = set(re.findall(r"url\(fonts/([^)]+)\)", css))
    assert referenced and referenced <= {f.name for f in fonts}
    chart = (VENDOR / "chart.umd.min.js").read_text(encoding="utf-8")
    assert ".Chart=" in chart or "Chart =" in chart


def test_pins_are_exact(package_json):
    for section in ("dependencies", "devDependencies"):
        for name, version in package_json[section].items():
            assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"{name} is not pinned: {version}"


def test_manifest_versions_match_the_pins_and_the_lock(manifest, package_json, lock):
    shipped = _by_name(manifest)
    pinned = package_json["dependencies"]
    for name, version in pinned.items():
        if name in shipped:
            assert shipped[name]["version"] == version, name
    for name in ("katex", "chart.js", "codemirror"):
        assert shipped[name]["version"] == pinned[name]
    assert shipped["chart.js"]["version"].startswith("4.")
    # Every shipped package, transitive ones included, is the version the lock pins.
    for name, entry in shipped.items():
        assert lock["packages"][f"node_modules/{name}"]["version"] == entry["version"], name
