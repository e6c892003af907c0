"""Fuzzing the API against its own OpenAPI document (schemathesis), as CI's guard against 500s.

The app is the one ``make run`` serves: ``create_app`` on a SQLite file migrated and filled with
the item bank by ``kgrade db upgrade``'s own code, called in-process over WSGI. Every generated
request goes out twice, once with an instructor's token and once with a student's, so both
roles' code paths see the same input. Valid-looking (positive) and schema-violating (negative)
data are both generated.

The run is deterministic: a fixed seed, ``derandomize``, no example database, and a fixed budget
of cases per operation. A new 500 (or an error that is not the API's JSON error shape) fails
the same way on every machine. Grading jobs are not sent anywhere: the enqueue is replaced by a
no-op, since the grading pipeline has tests of its own and no broker runs here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from flask import Flask
from hypothesis import HealthCheck, Phase, assume, seed, settings
from schemathesis import DataGenerationMethod
from schemathesis.checks import not_a_server_error
from schemathesis.exceptions import CheckFailed

from service import create_app
from service.cli.db import upgrade_and_import

#: Cases generated per API operation (about 25 operations, two roles each).
CASES_PER_OPERATION = 15
SEED = 16_2026


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flask]:
    from workers.tasks import grade_submission

    db_file: Path = tmp_path_factory.mktemp("fuzz") / "kgrade.sqlite3"
    url = f"sqlite:///{db_file}"
    upgrade_and_import(url)
    # Not TESTING: an unhandled exception must become the 500 a real client gets, not a raise.
    app = create_app({"DATABASE_URL": url, "IMPORT_BANK": False, "TASKS_EAGER": True})
    original = grade_submission.apply_async
    grade_submission.apply_async = lambda *a, **kw: None  # type: ignore[method-assign]
    try:
        yield app
    finally:
        grade_submission.apply_async = original  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def tokens(fuzz_app: Flask) -> dict[str, str]:
    from service.auth import create_token
    from service.db import write_intent
    from service.extensions import db

    with fuzz_app.app_context(), write_intent():
        out = {
            role: create_token(db.session, role=role, name=f"fuzz-{role}")[1]
            for role in ("instructor", "student")
        }
        db.session.commit()
    return out


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_app: Flask) -> Any:
    return schemathesis.from_wsgi(
        "/api/v1/openapi.json",
        fuzz_app,
        data_generation_methods=[DataGenerationMethod.positive, DataGenerationMethod.negative],
    )


schema = schemathesis.from_pytest_fixture("fuzz_schema")


def api_json_error(response: Any, case: Any) -> None:
    """Every error answer is the API's JSON error: ``{code, status, message, ...}``."""
    if response.status_code < 400:
        return
    # The docs page and the spec are not API resources, but their errors are JSON too.
    body = response.json if response.is_json else None
    if not isinstance(body, dict) or body.get("code") != response.status_code:
        raise CheckFailed(
            f"{case.method} {case.formatted_path}: {response.status_code} is not the API's JSON "
            f"error: {response.get_data()[:200]!r}"
        )
    if not body.get("message"):
        raise CheckFailed(f"{case.method} {case.formatted_path}: error without a message")


@schema.parametrize()
@seed(SEED)
@settings(
    max_examples=CASES_PER_OPERATION,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_api_never_500s_and_errors_are_json(case: Any, tokens: dict[str, str]) -> None:
    # A negative multipart body that is not a mapping of fields cannot be sent as a form at all
    # (the test client itself fails); such cases test the client, not the API.
    assume(case.media_type != "multipart/form-data" or isinstance(case.body, dict))
    for role in ("instructor", "student"):
        headers = dict(case.headers or {})
        headers["Authorization"] = f"Bearer {tokens[role]}"
        response = case.call_wsgi(headers=headers)
        case.validate_response(response, checks=(not_a_server_error, api_json_error))
