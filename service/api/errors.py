"""The JSON error body every failure uses (flask-smorest's format, documented)."""

from __future__ import annotations

from marshmallow import Schema, fields


class ErrorSchema(Schema):
    """Every error response: HTTP code and status, a sentence, and per-field messages."""

    code = fields.Integer(required=True, metadata={"description": "HTTP status code"})
    status = fields.String(required=True, metadata={"description": "HTTP status name"})
    message = fields.String(metadata={"description": "what went wrong, in one sentence"})
    errors = fields.Dict(
        metadata={
            "description": "messages keyed by location (json, query, headers, path) and field "
            'name, e.g. {"json": {"answer": ["unknown option \'z\'"]}}'
        }
    )
