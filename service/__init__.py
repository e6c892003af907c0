"""kgrade's web service: quiz delivery and grading over a REST API, pages, and LTI 1.3.

``create_app(config)`` builds the Flask app: configuration (``service.config``), the database
(``service.extensions.db``, models in ``service.db``), the flask-smorest API with its blueprints
(``service.api.BLUEPRINTS``) and the docs page, the pages (``service.web``) and the LTI tool
(``service.lti``), all over one service layer (``service.core``). In production it runs under
gunicorn via ``kgrade serve`` (``service:create_app()``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from inspect import iscoroutinefunction
from typing import Any

from flask import Flask

from service.config import load_config
from service.health import register_health


class KgradeFlask(Flask):
    """Flask, remembering which functions are coroutine functions.

    Flask asks ``inspect.iscoroutinefunction`` of every hook and view on every request
    (``ensure_sync``, a dozen times a request here): about 2 % of a quiz request's CPU, for an
    answer that never changes for a given function.
    """

    #: Functions remembered at most: enough for every hook and view, a bound for anything odd.
    _ASYNC_CACHE_SIZE = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._is_async: dict[Any, bool] = {}

    def ensure_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        # A method bound anew on each request (a MethodView's) is keyed by its function:
        # iscoroutinefunction reads the same code object through the bound method.
        key = getattr(func, "__func__", func)
        try:
            is_async = self._is_async[key]
        except (KeyError, TypeError):  # TypeError: an unhashable callable
            is_async = iscoroutinefunction(func)
            if len(self._is_async) < self._ASYNC_CACHE_SIZE:
                with contextlib.suppress(TypeError):
                    self._is_async[key] = is_async
        return self.async_to_sync(func) if is_async else func


def create_app(config: dict[str, Any] | None = None) -> Flask:
    from service.api import register_api
    from service.extensions import db, rate_limits
    from service.logs import register_logs
    from service.lti import register_lti
    from service.metrics import register_metrics
    from service.web import register_web

    app = KgradeFlask(__name__, instance_relative_config=False)
    app.config.update(load_config(config))
    register_logs(app)  # X-Request-ID, KGRADE_LOG_FORMAT=json
    register_metrics(app)  # /metrics (KGRADE_METRICS_TOKEN), request counts and latency
    app.json.sort_keys = False  # keep the schemas' field order in responses
    db.init_app(app)
    rate_limits.init_app(app)  # flask-limiter: submissions per student, sign-ins per address
    register_api(app)
    register_web(app)
    register_lti(app)
    register_health(app)  # /healthz, /readyz: no auth, for the probes
    if app.config["TASKS_EAGER"]:
        import service.lti.tasks  # noqa: F401 - registers the tasks run in-process
    if app.config["IMPORT_BANK"]:
        _import_bank(app)
    return app


def _import_bank(app: Flask) -> None:
    """Bring new or changed bank quizzes into the database at start-up (after migrations).

    Skipped quietly when the schema is not there yet: ``kgrade db upgrade`` imports then.
    """
    from sqlalchemy import inspect

    from service.db import write_intent
    from service.extensions import db
    from service.quizzes_store import sync_bank

    log = logging.getLogger("kgrade")
    with app.app_context():
        if not inspect(db.engine).has_table("quizzes"):
            log.warning("database has no tables yet; run `kgrade db upgrade`")
            return
        with write_intent():
            result = sync_bank(db.session)
            db.session.commit()
        for line in result.errors:
            log.warning("item bank: %s", line)
        if result.created or result.updated:
            log.info("item bank: created %s, updated %s", result.created, result.updated)
