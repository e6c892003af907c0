"""The access logger writes the lines gunicorn's own logger writes, for any format."""

from __future__ import annotations

import datetime
import logging
from typing import Any

import pytest
from gunicorn.config import Config
from gunicorn.glogging import Logger

from service.cli import gunicorn_conf
from service.cli.gunicorn_logger import AccessLogger
from service.cli.serve import gunicorn_argv


class _Resp:
    status = "201 CREATED"
    sent = 412
    headers = [
        ("Content-Type", "application/json"),
        ("Content-Length", "412"),
        ("X-Request-ID", "0123456789abcdef0123456789abcdef"),
        ("Location", '/api/v1/attempts/"quoted"'),
    ]


class _Req:
    headers = [
        ("HOST", "127.0.0.1:8000"),
        ("USER-AGENT", 'locust "fast"'),
        ("AUTHORIZATION", "Bearer kg_secret"),
        ("X-REQUEST-ID", "from-the-proxy"),
    ]


def _environ(**extra: str) -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST",
        "RAW_URI": '/api/v1/attempts/abc/responses?x="1"',
        "PATH_INFO": "/api/v1/attempts/abc/responses",
        "QUERY_STRING": 'x="1"',
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "10.0.0.7",
        "HTTP_USER_AGENT": 'locust "fast"',
        "HTTP_AUTHORIZATION": "Bearer kg_secret",
        "HTTP_X_REQUEST_ID": "from-the-proxy",
        "wsgi.url_scheme": "http",
        **extra,
    }


_SERVE_ARGV = gunicorn_argv("127.0.0.1", 8000, 1, 1, 60)
SERVE_FORMAT = _SERVE_ARGV[_SERVE_ARGV.index("--access-logformat") + 1]
FORMATS = [
    SERVE_FORMAT,
    'pid=%(p)s %(s)s "%(r)s"',  # tests/service/test_gunicorn_worker_kill.py's
    Config().access_log_format,  # gunicorn's default (the combined log format)
    "%(h)s %(l)s %(u)s %(t)s %(m)s %(U)s %(q)s %(H)s %(b)s %(B)s %(f)s %(a)s %(T)s %(D)s %(M)s "
    "%(L)s %(p)s %(nonexistent)s",
    '%(s)s %({x-request-id}o)s %({x-request-id}i)s %({wsgi.url_scheme}e)s "%(a)s"',
]


def _line(logger_class: type[Logger], fmt: str, environ: dict[str, Any]) -> str:
    cfg = Config()
    cfg.set("access_log_format", fmt)
    cfg.set("accesslog", "-")
    logger = logger_class(cfg)
    logger.now = lambda: "[02/Dec/2026:00:10:00 +0000]"  # type: ignore[method-assign]
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.access_log.handlers = [handler]
    logger.access(_Resp(), _Req(), environ, datetime.timedelta(seconds=1, microseconds=2345))
    (record,) = records
    return record.getMessage()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "environ",
    [
        _environ(),
        _environ(HTTP_AUTHORIZATION="Basic dXNlcjpwYXNz", HTTP_REFERER="http://lms/"),
        {k: v for k, v in _environ().items() if k not in ("REMOTE_ADDR", "QUERY_STRING")},
    ],
    ids=["bearer", "basic-auth", "sparse"],
)
def test_same_line_as_gunicorns_logger(fmt: str, environ: dict[str, Any]) -> None:
    assert _line(AccessLogger, fmt, environ) == _line(Logger, fmt, environ)


def test_serve_uses_it() -> None:
    assert gunicorn_conf.logger_class == "service.cli.gunicorn_logger.AccessLogger"


def test_reload_reads_the_new_format() -> None:
    cfg = Config()
    cfg.set("access_log_format", SERVE_FORMAT)
    logger = AccessLogger(cfg)
    assert logger._fixed_atoms_only
    cfg.set("access_log_format", "%({x-request-id}o)s")
    logger.setup(cfg)
    assert not logger._fixed_atoms_only
