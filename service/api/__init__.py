"""The REST API under ``/api/v1``: flask-smorest blueprints, one module per resource.

Adding a resource (e.g. the grader's ``service/api/exercises.py``) is one line in ``BLUEPRINTS``:
the module defines ``blp = service.api.common.Blueprint(...)`` with ``url_prefix="/api/v1"``, its
marshmallow schemas beside it, and decorates each view with ``service.api.common.endpoint`` (auth,
documented errors, transactions, ``Idempotency-Key``, and running what the view's
``@blp.arguments`` / ``@blp.response`` declare). Its paths then appear in
``/api/v1/openapi.json`` and on ``/api/v1/docs`` with no further change.
"""

from __future__ import annotations

import importlib
from typing import Any

from flask import Flask
from flask_smorest import Api
from werkzeug.exceptions import HTTPException
from werkzeug.routing import IntegerConverter

from service.api.common import MAX_DB_ID
from service.api.errors import ErrorSchema


class KgradeApi(Api):
    """flask-smorest's ``Api`` with kgrade's documented error schema, and a message on every
    error (werkzeug's own 404/405/413 carry only a description)."""

    ERROR_SCHEMA = ErrorSchema

    def handle_http_exception(self, error: HTTPException) -> Any:
        payload, code, headers = super().handle_http_exception(error)
        if "message" not in payload:
            first = _first_error(payload.get("errors"))
            if first:
                # webargs' validation errors: name the first field in the sentence too.
                payload["message"] = first
            elif error.description:
                payload["message"] = error.description
        return payload, code, headers


def _first_error(errors: Any, path: str = "") -> str | None:
    """``json.answer: Missing data...`` for the first message in a nested errors mapping."""
    if isinstance(errors, dict):
        for key, value in errors.items():
            found = _first_error(value, f"{path}.{key}" if path else str(key))
            if found:
                return found
    elif isinstance(errors, list) and errors:
        if all(isinstance(e, str) for e in errors):
            return f"{path}: {errors[0]}" if path else errors[0]
        return _first_error(errors[0], path)
    return None


class DbIdConverter(IntegerConverter):
    """``<db_id:name>``: a stored row's integer id in a path.

    Routing takes any run of digits, so that the view can answer an id no row can have (over
    the 32-bit column, or 0) with the 404 that names the field (``common.db_id``); the
    OpenAPI document states the range a real id has.
    """


def _db_id_schema(_converter: DbIdConverter) -> dict[str, Any]:
    return {"type": "integer", "minimum": 1, "maximum": MAX_DB_ID}


def make_api(app: Flask) -> Api:
    """flask-smorest's ``Api`` binds to one app, so each app built by ``create_app`` gets its own
    (tests build many apps in one process)."""
    return KgradeApi(app)


BLUEPRINTS: list[str] = [
    "service.api.meta",
    "service.api.quizzes",
    "service.api.imports",
    "service.api.attempts",
    "service.api.grades",
    "service.api.exercises",
    "service.api.assignments",
]


def _document_extra_paths(app: Flask, api: Api) -> None:
    """Put the spec and docs routes themselves in the spec, so that it lists every endpoint."""
    api.spec.path(
        rule=next(app.url_map.iter_rules("api-docs.openapi_json")),
        parameters=[],
        operations={
            "get": {
                "tags": ["docs"],
                "summary": "This OpenAPI document",
                "responses": {
                    "200": {
                        "description": "OpenAPI 3 document",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    )
    api.spec.path(
        rule=next(app.url_map.iter_rules("docs.docs_page")),
        parameters=[],
        operations={
            "get": {
                "tags": ["docs"],
                "summary": "Readable API reference (HTML, works offline)",
                "responses": {
                    "200": {
                        "description": "HTML page",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    )
    api.spec.tag({"name": "docs", "description": "The API's own documentation."})


def register_api(app: Flask) -> None:
    from service.api.outage import register_outage_handler

    api = make_api(app)
    register_outage_handler(app)
    # Before the blueprints: their rules look the converter up when they are added.
    app.url_map.converters["db_id"] = DbIdConverter
    api.register_converter(DbIdConverter, _db_id_schema)
    for name in BLUEPRINTS:
        api.register_blueprint(importlib.import_module(name).blp)
    from service.api.docs import bp as docs_bp

    app.register_blueprint(docs_bp)
    _document_extra_paths(app, api)
