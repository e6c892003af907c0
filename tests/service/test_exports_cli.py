"""``kgrade export``: writes the same bytes as ``export_quiz``; bad requests exit non-zero."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from item_bank import get_quiz
from service.cli import main
from service.exports import FORMATS, export_quiz


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_export_writes_the_api_bytes_and_checks(
    tmp_path: Path, fmt: str, schemas_dir: Path
) -> None:
    out = tmp_path / f"x{FORMATS[fmt][1]}"
    code, output = run(
        "export",
        "sparse-attention-quiz",
        "--format",
        fmt,
        "--lang",
        "all",
        "-o",
        str(out),
        "--check",
    )
    assert code == 0, output
    assert "checked" in output
    assert out.read_bytes() == export_quiz(get_quiz("sparse-attention-quiz"), fmt, "all").data


def test_mlang_option(tmp_path: Path) -> None:
    out = tmp_path / "q.xml"
    code, _ = run("export", "ring-attention-quiz", "--format", "moodle-xml", "--lang", "all",
                  "--mlang", "mlang", "-o", str(out))  # fmt: skip
    assert code == 0
    assert b"{mlang other}" in out.read_bytes()


def test_unknown_quiz_lists_known_ids(tmp_path: Path) -> None:
    code, output = run("export", "nope", "--format", "qti12", "-o", str(tmp_path / "x.zip"))
    assert code == 1
    assert "unknown quiz 'nope'" in output
    assert "ring-attention-quiz" in output and "sparse-attention-quiz" in output
    assert not (tmp_path / "x.zip").exists()


@pytest.mark.parametrize(
    "args",
    [["--format", "qti13"], ["--format", "qti12", "--lang", "fr"],
     ["--format", "moodle-xml", "--mlang", "curly"]],
)  # fmt: skip
def test_bad_choices_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    code, output = run("export", "ring-attention-quiz", *args, "-o", str(tmp_path / "x"))
    assert code == 2
    assert "Invalid value" in output


def test_missing_format_is_a_usage_error(tmp_path: Path) -> None:
    code, _ = run("export", "ring-attention-quiz", "-o", str(tmp_path / "x"))
    assert code == 2


def test_unwritable_path_fails_in_one_line(tmp_path: Path) -> None:
    code, output = run("export", "ring-attention-quiz", "--format", "qti12",
                       "-o", str(tmp_path / "missing" / "x.zip"))  # fmt: skip
    assert code == 1
    assert output.strip().startswith("Error: cannot write")
    assert len(output.strip().splitlines()) == 1


def test_check_failure_exits_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `service.cli.export` the attribute is the click command; the module is in sys.modules
    cli_export = importlib.import_module("service.cli.export")

    monkeypatch.setattr(cli_export, "validate_export", lambda fmt, data: ["x.xml:1: broken"])
    out = tmp_path / "x.zip"
    code, output = run(
        "export", "ring-attention-quiz", "--format", "qti21", "-o", str(out), "--check"
    )
    assert code == 1
    assert "x.xml:1: broken" in output and "1 validation problem" in output
    assert not out.exists()
