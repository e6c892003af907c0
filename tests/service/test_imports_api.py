"""``POST /api/v1/quizzes/import`` and ``kgrade import``: stored quiz and warnings, 4xx naming
the field for bad files, and nothing stored is ever overwritten or lost."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from item_bank import get_quiz, load_quiz
from service.cli import main
from service.exports import export_quiz
from service.imports import ImportFailed, import_quiz
from tests.service.conftest import World, table_snapshot

URL = "/api/v1/quizzes/import"
FOREIGN = Path(__file__).resolve().parents[1] / "fixtures" / "foreign"


def upload(world: World, data: bytes, name: str, who: str = "prof", **form: str) -> Any:
    body: dict[str, Any] = {"file": (io.BytesIO(data), name), **form}
    return world.post(URL, who, data=body, content_type="multipart/form-data")


def test_import_stores_the_quiz_with_warnings(world: World) -> None:
    quiz = get_quiz("sparse-attention-quiz")
    exported = export_quiz(quiz, "moodle-xml", "all")
    r = upload(world, exported.data, exported.filename)
    assert r.status_code == 201, r.get_json()
    body = r.get_json()
    assert body["format"] == "moodle-xml"
    assert any("topics" in w for w in body["warnings"])
    assert r.headers["Location"].endswith("/api/v1/quizzes/sparse-attention-quiz")
    stored = world.get("/api/v1/quizzes/sparse-attention-quiz/data", "prof").get_json()
    back = load_quiz(stored)
    assert [it.prompt for it in back.items] == [it.prompt for it in quiz.items]


def test_id_clash_is_409_and_keeps_the_stored_quiz(world: World, app: Any) -> None:
    before = world.get("/api/v1/quizzes/quiz-a/data", "prof").get_json()
    exported = export_quiz(get_quiz("ring-attention-quiz"), "qti12", "en")
    snapshot = table_snapshot(app)
    r = upload(world, exported.data, exported.filename, quiz_id="quiz-a")
    assert r.status_code == 409
    assert "quiz_id" in r.get_json()["errors"]["form"]
    assert table_snapshot(app) == snapshot
    assert world.get("/api/v1/quizzes/quiz-a/data", "prof").get_json() == before
    # With another id it goes in beside it.
    r = upload(world, exported.data, exported.filename, quiz_id="ring-copy")
    assert r.status_code == 201 and r.get_json()["quiz"]["id"] == "ring-copy"


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


BAD_FILES = [
    ("not-a-zip", b"PK\x03\x04 this is no zip", "x.zip", "file"),
    ("unknown format", b"just some text", "notes.txt", "file"),
    ("unknown xml", b"<?xml version='1.0'?><html/>", "page.xml", "file"),
    ("broken xml", b"<quiz><question>", "q.xml", "file"),
    ("empty", b"", "empty.xml", "file"),
    ("zip without quiz", _zip({"readme.txt": b"hello"}), "a.zip", "file"),
    ("gzip (mbz)", b"\x1f\x8b\x08\x00rest", "backup.mbz", "file"),
    ("no supported items", (FOREIGN / "moodle/multianswer.xml").read_bytes(), "m.xml", "file"),
]


@pytest.mark.parametrize(
    ("case", "data", "name", "field"), BAD_FILES, ids=[c[0] for c in BAD_FILES]
)
def test_bad_files_are_4xx_naming_the_field(
    world: World, app: Any, case: str, data: bytes, name: str, field: str
) -> None:
    snapshot = table_snapshot(app)
    r = upload(world, data, name)
    assert r.status_code == 422, (case, r.get_json())
    body = r.get_json()
    assert field in body["errors"]["files"] and body["message"].startswith(f"{field}: ")
    assert table_snapshot(app) == snapshot


def test_bad_quiz_id_and_missing_file(world: World) -> None:
    exported = export_quiz(get_quiz("ring-attention-quiz"), "moodle-xml", "en")
    r = upload(world, exported.data, "a.xml", quiz_id="9 bad id")
    assert r.status_code == 422 and "quiz_id" in r.get_json()["errors"]["form"]
    r = world.post(URL, "prof", data={}, content_type="multipart/form-data")
    assert r.status_code == 422 and "file" in r.get_json()["errors"]["files"]
    r = world.post(URL, "prof", json={"file": "x"})
    assert r.status_code == 415


def test_students_may_not_import(world: World) -> None:
    exported = export_quiz(get_quiz("ring-attention-quiz"), "moodle-xml", "en")
    assert upload(world, exported.data, "a.xml", who="alice").status_code == 403
    assert world.client.post(URL, data={}).status_code == 401


# --- safety of the readers (no app needed) ---------------------------------------------------


def test_entities_are_refused_not_expanded(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    xxe = (
        f'<?xml version="1.0"?><!DOCTYPE quiz [<!ENTITY x SYSTEM "file://{secret}">]>'
        "<quiz><question type='multichoice'><name><text>&x;</text></name></question></quiz>"
    ).encode()
    with pytest.raises(ImportFailed, match="ENTITY") as err:
        import_quiz(xxe, "xxe.xml")
    assert "TOPSECRET" not in str(err.value)
    laughs = (
        b'<?xml version="1.0"?><!DOCTYPE quiz [<!ENTITY a "aaaaaaaaaa">'
        b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><quiz>&b;</quiz>'
    )
    with pytest.raises(ImportFailed, match="ENTITY"):
        import_quiz(laughs, "laughs.xml")


def test_zip_bomb_is_refused() -> None:
    bomb = _zip({"imsmanifest.xml": b"<manifest/>", "big.xml": b"\0" * (20 * 2**20)})
    with pytest.raises(ImportFailed, match="too large"):
        import_quiz(bomb, "bomb.zip")


@pytest.mark.parametrize("fmt", ["moodle-xml", "qti12", "imscc", "qti21"])
def test_damaged_exports_fail_cleanly(fmt: str) -> None:
    """Cut or corrupted files give ImportFailed, never another exception (a 500 in the API)."""
    data = export_quiz(get_quiz("ring-attention-quiz"), fmt, "all").data
    damaged = [data[: len(data) // k] for k in (2, 3, 5)]
    damaged.append(data.replace(b"xml", b"xm!", 3))
    damaged.append(data[:200] + bytes(reversed(data[200:400])) + data[400:])
    for blob in damaged:
        try:
            import_quiz(blob, f"damaged.{fmt}")
        except ImportFailed as exc:
            assert exc.field == "file" and str(exc)


# --- the command line ------------------------------------------------------------------------


def test_cli_writes_yaml_and_refuses_to_overwrite(tmp_path: Path) -> None:
    quiz = get_quiz("ring-attention-quiz")
    src = tmp_path / "ring.xml"
    src.write_bytes(export_quiz(quiz, "moodle-xml", "all", mlang="mlang").data)
    out = tmp_path / "out.yaml"
    runner = CliRunner()
    r = runner.invoke(main, ["import", str(src), "--quiz-id", "ring-2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    data = yaml.safe_load(out.read_text(encoding="utf-8"))
    back = load_quiz(data)
    assert back.id == "ring-2"
    assert [it.explanation for it in back.items] == [it.explanation for it in quiz.items]
    assert out.read_text(encoding="utf-8").startswith("# Imported by `kgrade import`")
    first = out.read_bytes()
    r = runner.invoke(main, ["import", str(src), "-o", str(out)])
    assert r.exit_code != 0 and "--force" in r.output
    assert out.read_bytes() == first


def test_cli_reports_bad_files(tmp_path: Path) -> None:
    src = tmp_path / "notes.txt"
    src.write_text("hello")
    r = CliRunner().invoke(main, ["import", str(src)])
    assert r.exit_code != 0 and "FILE: unknown format" in r.output
    r = CliRunner().invoke(main, ["import", str(FOREIGN / "moodle/multianswer.xml")])
    assert r.exit_code != 0 and "'cloze' is not supported" in r.output
