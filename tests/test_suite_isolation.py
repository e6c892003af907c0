"""The suite leaves the checkout's server-less state alone (``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT, SESSION_VAR
from workers import celery_app


def test_the_suites_celery_state_is_not_the_checkouts() -> None:
    """Before the session folder, the LTI tests queued messages under ./var/celery/queue, and
    `make run`'s worker then ran them (grade submission 1, passback 3, ...) on its own data.
    The app's own settings are checked: it reads the folder once, when first imported."""
    assert celery_app.var_dir() == SESSION_VAR.resolve()
    assert not SESSION_VAR.resolve().is_relative_to(ROOT)
    conf = celery_app.app.conf
    if conf.broker_url.startswith("filesystem"):
        opts = conf.broker_transport_options
        for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
            assert Path(opts[key]).is_relative_to(SESSION_VAR.resolve()), (key, opts[key])
    assert str(ROOT) not in str(conf.result_backend), conf.result_backend
