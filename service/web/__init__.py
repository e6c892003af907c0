"""The pages students and instructors see, inside an LMS iframe or on their own.

Server-rendered Jinja templates (``service/templates/web``) over the service layer
(``service.core``), with a little JavaScript (``service/static``). Views stay thin: they parse a
form, call the service layer and render. ``register_web(app)`` adds the blueprints, the session
and CSRF handling and the security headers.
"""

from __future__ import annotations

from typing import Any

from flask import Flask
from werkzeug.exceptions import HTTPException
from werkzeug.routing import IntegerConverter, ValidationError


class RowIdConverter(IntegerConverter):
    """``<row_id:name>``: a page's stored row id. A number no 32-bit column holds matches no
    route (the page's 404), instead of reaching the database as an overflow (a 500)."""

    def to_python(self, value: str) -> int:
        from service.api.common import MAX_DB_ID

        n = int(value)
        if not 1 <= n <= MAX_DB_ID:
            raise ValidationError()
        return n


def register_web(app: Flask) -> None:
    from service.web import pages, security, session

    session.init_app(app)
    security.init_app(app)
    # before the blueprints: their rules look the converter up when they are added
    app.url_map.converters["row_id"] = RowIdConverter
    for bp in pages.blueprints():
        app.register_blueprint(bp)
    for code in (404, 405):
        app.register_error_handler(code, _not_found)


def _not_found(error: HTTPException) -> Any:
    """A page for people, the API's JSON error for programs (and anything under /api)."""
    from flask import request

    from service.extensions import current_api
    from service.web.guard import error_page, load_actor

    if request.path.startswith("/api") or request.accept_mimetypes.best == "application/json":
        return current_api().handle_http_exception(error)
    load_actor()
    message = "There is no such page." if error.code == 404 else "That does not work on this page."
    return error_page(error.code or 404, message)
