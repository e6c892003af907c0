"""Shared pieces of the REST API: the error schema, auth + docs decorator, transactions and
``Idempotency-Key`` handling.

``endpoint(blp, roles=..., errors=..., write=..., idempotent=...)`` is the one decorator a view
needs beyond flask-smorest's ``@blp.arguments`` / ``@blp.response``; put it above them. It

* documents the bearer security requirement and every listed error status in the OpenAPI spec,
* authenticates (401) and checks the role (403) before the body is parsed,
* for ``write=True``: runs the view in one transaction that commits only when the response is a
  success; any error (abort, validation failure, unexpected exception) rolls everything back, so
  bad input never changes stored data,
* for ``lock_late=True`` (with ``write``): the request begins as a reader and the view takes the
  write lock itself (``service.db.begin_writing``) once it has read and checked what it needs,
  so the database's writers wait for each other only during the write,
* for ``idempotent=True``: stores the response under the caller's ``Idempotency-Key`` in the same
  transaction and replays it for a retry with the same key and body,
* for ``autocommit=True`` (with ``write``; a view whose every write is one statement that
  guards itself, as ``service.core.attempts.answer``'s): on PostgreSQL, a request without an
  ``Idempotency-Key`` runs without a transaction, each statement committing by itself, which
  saves its BEGIN and COMMIT round trips; with a key, the stored reply needs the transaction,
  and SQLite gains nothing (no round trips),
* for ``joined=READ`` (a ``service.auth.JoinedRead``): makes the view's first read in the token
  lookup's statement, one round trip for both; the view gets it from ``auth.prefetched``,
* for ``rate_limit=NAME``: applies that limit of ``service.extensions.rate_limits`` once the caller
  is authenticated (and after an idempotent replay, which a limit never refuses), and documents
  the 429 and the configured limit (``x-rate-limit``) in the OpenAPI document,
* parses the view's ``@blp.arguments`` and serializes its ``@blp.response`` itself.

This module's ``Blueprint`` makes ``arguments``, ``response``, ``alt_response`` and ``doc``
document the view and nothing else: flask-smorest's own wrap it in a call layer each (webargs
builds a new schema instance per request, and so on), about a sixth of a quiz answer's CPU.
``endpoint()`` then runs what they declared in its one layer: the body, query or headers
through the same webargs parser (same errors: 422 naming the field, 400 for bad JSON) with one
schema instance for the app's life (a plainly valid JSON body loaded by
``service.api.fastload`` without marshmallow's per-field layers, to the same result), and the
result through the response schema and the app's JSON provider as flask-smorest's ``response``
does. The OpenAPI document is flask-smorest's,
from the same decorators.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from flask import Response, current_app, make_response, request
from flask_smorest import Blueprint as SmorestBlueprint
from flask_smorest import abort
from flask_smorest.utils import set_status_and_headers_in_response, unpack_tuple_response
from marshmallow import Schema
from marshmallow.utils import missing
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from webargs.flaskparser import FlaskParser
from werkzeug import Response as WerkzeugResponse
from werkzeug.exceptions import HTTPException

from service.api.errors import ErrorSchema
from service.api.fastdump import compile_dump
from service.api.fastload import Load, compile_load
from service.auth import JoinedRead, current_principal, requires
from service.core.errors import ServiceError
from service.db import is_postgres, write_intent
from service.db.attempts import IdempotencyRecord
from service.extensions import db, rate_limits

F = TypeVar("F", bound=Callable[..., Any])


#: What a ``JSONDecodeError`` carries as its document when the body was not JSON. It must not
#: be empty: webargs reads a decode error with an empty document as "no body at all" and loads
#: the defaults, so a body nested 10,000 deep would silently start an attempt.
_UNDECODABLE = "<undecodable body>"


def parse_json_body(raw: bytes) -> Any:
    """``json.loads`` that reports every undecodable body as a ``JSONDecodeError``.

    Deeply nested input (``[[[[...]]]]``) makes the stdlib parser raise ``RecursionError``, which
    would otherwise escape as a 500.
    """
    try:
        return json.loads(raw)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", _UNDECODABLE, 0) from None
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError(f"not UTF-8: {exc.reason}", _UNDECODABLE, 0) from None


class KgradeParser(FlaskParser):
    def _raw_load_json(self, req: Any) -> Any:
        try:
            return super()._raw_load_json(req)
        except RecursionError:
            raise json.JSONDecodeError("nested too deeply", _UNDECODABLE, 0) from None


@dataclass(frozen=True)
class _Arguments:
    """What ``@blp.arguments`` declared, for ``endpoint()`` to parse."""

    schema: Schema
    location: str
    #: a JSON body's load without marshmallow's layers where it is plainly valid (fastload)
    fast: Load | None = None


@dataclass(frozen=True)
class _Reply:
    """What ``@blp.response`` declared, for ``endpoint()`` to serialize."""

    status: int
    schema: Schema | None


#: Attributes the doc-only decorators leave on the view for endpoint().
_ARGUMENTS = "_kgrade_arguments"
_REPLY = "_kgrade_reply"


def _documented(func: F, decorator: Callable[[Any], Any]) -> F:
    """``func`` with the documentation a flask-smorest ``decorator`` collects (``_apidoc``), and
    without the call layer the decorator would wrap around it: run on a stand-in."""

    def stand_in() -> None:  # pragma: no cover - never called
        pass

    stand_in._apidoc = getattr(func, "_apidoc", {})  # type: ignore[attr-defined]
    func._apidoc = decorator(stand_in)._apidoc  # type: ignore[attr-defined]
    return func


class Blueprint(SmorestBlueprint):
    """flask-smorest's Blueprint with a JSON parser that never lets bad input become a 500, and
    each rate-limited operation's limit, as this app configures it, in the OpenAPI document.

    Its view decorators only document (module docstring); ``endpoint()`` runs what they
    declare, so every view of it is decorated with ``endpoint()`` on top.
    """

    ARGUMENTS_PARSER = KgradeParser()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._prepare_doc_cbks.append(self._prepare_rate_limit_doc)

    def arguments(  # type: ignore[override]
        self, schema: type[Schema] | Schema, *, location: str = "json", **doc: Any
    ) -> Callable[[F], F]:
        # webargs' use_args options (unknown=, as_kwargs=, ...) are not run by endpoint()
        unknown = doc.keys() - {"content_type", "required", "description", "example", "examples"}
        if unknown:
            raise TypeError(f"arguments(): endpoint() does not run {sorted(unknown)}")
        decorator = super().arguments(schema, location=location, **doc)
        instance = schema() if isinstance(schema, type) else schema

        def document(func: F) -> F:
            # the decorator nearest the view is applied first, its arguments come last
            fast = compile_load(instance) if location == "json" else None
            declared = (_Arguments(instance, location, fast), *getattr(func, _ARGUMENTS, ()))
            setattr(func, _ARGUMENTS, declared)
            return _documented(func, decorator)

        return document

    def response(  # type: ignore[override]
        self, status_code: int, schema: type[Schema] | Schema | None = None, **doc: Any
    ) -> Callable[[F], F]:
        decorator = super().response(status_code, schema, **doc)
        instance = schema() if isinstance(schema, type) else schema

        def document(func: F) -> F:
            if hasattr(func, _REPLY):
                raise TypeError("one @blp.response per view (alt_response for the others)")
            setattr(func, _REPLY, _Reply(int(status_code), instance))
            return _documented(func, decorator)

        return document

    def alt_response(self, *args: Any, **kwargs: Any) -> Callable[[F], F]:  # type: ignore[override]
        decorator = super().alt_response(*args, **kwargs)
        return lambda func: _documented(func, decorator)

    @staticmethod
    def doc(**kwargs: Any) -> Callable[[F], F]:  # type: ignore[override]
        decorator = SmorestBlueprint.doc(**kwargs)
        return lambda func: _documented(func, decorator)

    @staticmethod
    def _prepare_rate_limit_doc(
        doc: dict[str, Any], doc_info: dict[str, Any], *, app: Any, **_kwargs: Any
    ) -> dict[str, Any]:
        name = doc_info.get("kgrade_rate_limit")
        if name is None:
            return doc
        limit = rate_limits.describe(name, app.config)
        doc["x-rate-limit"] = limit
        for code in (429, "429"):
            if code in doc.get("responses", {}):
                doc["responses"][code]["description"] = (
                    f"Rate limit: at most {limit['limit']} {limit['counts']} per "
                    f"{limit['window_seconds']} s per {limit['per']} ({limit['setting']}); "
                    "retry after the `Retry-After` seconds. Nothing was stored."
                )
        return doc


#: Integer ids are stored in 32-bit signed columns (PostgreSQL ``integer``); a larger number in
#: a URL cannot name a row, and passing it to the database is an overflow error (a 500).
MAX_DB_ID = 2**31 - 1


def db_id(value: int, field: str, location: str = "path", what: str = "") -> int:
    """``value`` if it can be a stored row id, else the 404 a missing row gets, naming ``field``."""
    if not 1 <= value <= MAX_DB_ID:
        field_error(404, location, field, f"unknown {what or field.removesuffix('_id')} {value}")
    return value


def file_upload_body(
    extra_fields: dict[str, Any] | None = None, **other_types: Any
) -> dict[str, Any]:
    """An OpenAPI ``requestBody`` for a multipart upload: a required binary ``file`` plus
    ``extra_fields`` (name -> JSON schema), and other media types (``{"application/json":
    {"schema": ...}}``) as ``other_types``."""
    multipart = {
        "schema": {
            "type": "object",
            "properties": {"file": {"type": "string", "format": "binary"}, **(extra_fields or {})},
            "required": ["file"],
        }
    }
    return {"required": True, "content": {"multipart/form-data": multipart, **other_types}}


IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255


ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Malformed request (invalid JSON body, bad header)",
    401: "Missing, malformed, invalid or revoked bearer token",
    403: "The token's role may not use this endpoint, or the resource is another student's",
    404: "Unknown quiz, attempt, item, submission or assignment (or another course's)",
    409: "Conflicts with the stored state (already answered, submitted, attempt limit, exists)",
    413: "Request body larger than the configured limit",
    422: "The body, query or header failed validation; `errors` names each field",
    429: "Rate limit exceeded (see `x-rate-limit`); retry after the `Retry-After` seconds",
    503: "The database (or, for a submission, the grading queue) is unreachable for now (say, "
    "restarting): nothing was changed; retry after the `Retry-After` seconds (or a required "
    "component is not installed)",
}

IDEMPOTENCY_PARAM: dict[str, Any] = {
    "in": "header",
    "name": IDEMPOTENCY_HEADER,
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH},
    "description": "Any unique string (e.g. a UUID). A retry with the same key and the same "
    "body returns the stored response (header `Idempotent-Replayed: true`) instead of "
    "creating a second attempt or response; the same key with a different request is a 422.",
}


def error(status: int, message: str, **errors: Any) -> None:
    """Abort with a JSON error; keyword arguments become ``errors`` (location -> field -> msgs)."""
    if errors:
        abort(status, message=message, errors=errors)
    abort(status, message=message)


def field_error(status: int, location: str, field: str, message: str) -> None:
    abort(status, message=f"{field}: {message}", errors={location: {field: [message]}})


def endpoint(
    blp: Blueprint,
    *,
    roles: Iterable[str],
    errors: Iterable[int] = (),
    write: bool = False,
    idempotent: bool = False,
    rate_limit: str | None = None,
    lock_late: bool = False,
    autocommit: bool = False,
    joined: JoinedRead | None = None,
) -> Callable[[F], F]:
    roles = tuple(roles)
    if autocommit and not write:
        raise ValueError("endpoint(autocommit=True) is for write endpoints")

    def decorator(func: F) -> F:
        f: Callable[..., Any] = _view_call(func)
        if rate_limit is not None:
            f = rate_limits.limited(rate_limit)(f)
        if write or idempotent:
            f = _transactional(f, idempotent=idempotent)
        f = requires(*roles, joined=joined)(f)
        if (write or idempotent) and not lock_late:
            f = _write_first(f)
        if autocommit:
            f = _autocommit(f)
        f = blp.doc(security=[{"bearerAuth": []}])(f)
        # Any request may meet the database down (503 with Retry-After, service.api.outage).
        codes = {401, 403, 503, *errors}
        if rate_limit is not None:
            codes.add(429)
        if idempotent:
            codes |= {400, 422}
            f = blp.doc(parameters=[IDEMPOTENCY_PARAM])(f)
        for code in sorted(codes):
            f = blp.alt_response(code, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[code])(f)
        return f  # type: ignore[return-value]

    return decorator


def abort_for(exc: ServiceError) -> None:
    """The JSON error of a service-layer refusal (status, sentence, the field it names)."""
    kwargs: dict[str, Any] = {"message": str(exc)}
    if exc.errors:
        kwargs["errors"] = exc.errors
    if exc.headers:
        kwargs["headers"] = exc.headers
    abort(exc.status, **kwargs)


def _view_call(func: Callable[..., Any]) -> Callable[..., Any]:
    """The view with what its doc-only decorators declared (``Blueprint``): its arguments
    parsed and appended to the positional ones as webargs' ``use_args`` does, its result
    serialized as flask-smorest's ``response`` does, and a service-layer refusal turned into
    its JSON error."""
    declared: tuple[_Arguments, ...] = getattr(func, _ARGUMENTS, ())
    reply: _Reply | None = getattr(func, _REPLY, None)
    parser = Blueprint.ARGUMENTS_PARSER
    # the response schema's dump, compiled on first use (a nested schema named by string
    # resolves only once every schema module is imported); marshmallow's output either way
    dumps: list[Callable[[Any], Any]] = []

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for arguments in declared:
            args = (*args, _parse(parser, arguments))
        try:
            result = func(*args, **kwargs)
        except ServiceError as exc:
            abort_for(exc)
        if reply is None:
            return result
        body, status, headers = unpack_tuple_response(result)
        if isinstance(body, WerkzeugResponse):
            set_status_and_headers_in_response(body, status, headers)
            return body
        if reply.schema is not None:
            if not dumps:
                dumps.append(compile_dump(reply.schema))
            body = dumps[0](body)
        resp = current_app.json.response(body)  # what flask.jsonify does
        set_status_and_headers_in_response(resp, status, headers)
        if status is None:
            resp.status_code = reply.status
        return resp

    return wrapper


def _parse(parser: KgradeParser, arguments: _Arguments) -> Any:
    """What ``parser.parse`` returns for ``arguments``: a JSON body ``arguments.fast`` can load
    skips webargs' and marshmallow's layers (the same result, service.api.fastload); anything
    else, errors included, is webargs' own parse."""
    if arguments.fast is not None:
        body = parser.load_json(request, arguments.schema)  # a 400 for bad JSON, as in parse
        loaded = arguments.fast({} if body is missing else body)  # no body: parse loads {}
        if loaded is not None:
            return loaded
    return parser.parse(arguments.schema, location=arguments.location)


def _request_hash() -> str:
    raw = request.get_data(cache=True)
    try:
        # Same JSON in a different key order or spacing is the same request.
        body = json.dumps(parse_json_body(raw), sort_keys=True, separators=(",", ":")).encode()
    except ValueError:
        body = raw
    h = hashlib.sha256()
    for part in (request.method.encode(), request.path.encode(), request.query_string, body):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def _idempotency_key() -> str | None:
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    if not key or len(key) > MAX_KEY_LENGTH or not key.isascii() or not key.isprintable():
        field_error(
            400,
            "headers",
            IDEMPOTENCY_HEADER,
            f"must be 1 to {MAX_KEY_LENGTH} printable ASCII characters",
        )
    return key


def _replay_after_conflict(
    session: Session, token_id: int, key: str | None, req_hash: str
) -> Response | None:
    """Roll back, then the stored response of a concurrent request with the same key, if any."""
    session.rollback()
    if key is None:
        return None
    replay = _replay(session, token_id, key, req_hash)
    session.rollback()
    return replay


def _replay(session: Session, token_id: int, key: str, req_hash: str) -> Response | None:
    rec = session.execute(
        select(IdempotencyRecord).where(
            IdempotencyRecord.token_id == token_id, IdempotencyRecord.key == key
        )
    ).scalar_one_or_none()
    if rec is None:
        return None
    if rec.request_hash != req_hash:
        field_error(
            422,
            "headers",
            IDEMPOTENCY_HEADER,
            "this key was already used for a different request (other endpoint or body); "
            "use a new key for a new request",
        )
    resp = Response(rec.body, status=rec.status, mimetype="application/json")
    resp.headers.update(rec.headers or {})
    resp.headers["Idempotent-Replayed"] = "true"
    return resp


def _write_first(func: Callable[..., Any]) -> Callable[..., Any]:
    """A write request is one transaction from its token lookup to its commit, begun with the
    intent to write (SQLite's write lock up front, see service.db.write_intent): a read
    transaction for the token, then another for the work, cost a round trip and a BEGIN more
    on every request (the quiz flow is mostly writes)."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        session = db.session
        if session.in_transaction():  # begun without the intent (a hook read something)
            session.rollback()
        with write_intent():
            return func(*args, **kwargs)

    return wrapper


def _autocommit(func: Callable[..., Any]) -> Callable[..., Any]:
    """See ``endpoint(autocommit=True)``: set before the token lookup, the first statement."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        session = db.session
        if is_postgres(session.get_bind()) and IDEMPOTENCY_HEADER not in request.headers:
            session.autocommit()
        return func(*args, **kwargs)

    return wrapper


def _transactional(func: Callable[..., Any], *, idempotent: bool) -> Callable[..., Any]:
    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        session = db.session
        key = _idempotency_key() if idempotent else None
        token_id = current_principal().token_id
        req_hash = _request_hash() if key is not None else ""
        # inside _write_first this transaction began with the write intent (endpoint()); with
        # lock_late the view takes it later, and a key stored meanwhile fails the commit below
        if key is not None:
            replay = _replay(session, token_id, key, req_hash)
            if replay is not None:
                session.rollback()
                return replay
        try:
            resp = make_response(func(*args, **kwargs))
        except HTTPException:
            # A concurrent request with the same key may have committed while this one
            # waited on a lock and then failed (e.g. "already answered"): replay it.
            replay = _replay_after_conflict(session, token_id, key, req_hash)
            if replay is not None:
                return replay
            raise
        except BaseException:
            session.rollback()
            raise
        if resp.status_code >= 400:
            session.rollback()
            return resp
        if key is not None:
            headers = {h: resp.headers[h] for h in ("Location",) if h in resp.headers}
            session.add(
                IdempotencyRecord(
                    token_id=token_id,
                    key=key,
                    request_hash=req_hash,
                    status=resp.status_code,
                    body=resp.get_data(as_text=True),
                    headers=headers,
                )
            )
        try:
            session.commit()
        except IntegrityError:
            # Lost a race with a concurrent request: same idempotency key, or a unique
            # constraint such as one response per item.
            replay = _replay_after_conflict(session, token_id, key, req_hash)
            if replay is not None:
                return replay
            error(409, "a concurrent request changed the same data first; reload and retry")
        return resp

    return wrapper
