"""The suite leaves the checkout's server-less state alone (``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT, SESSION_VAR
from workers.celery_app import broker_settings, var_dir


def test_the_suites_celery_state_is_not_the_checkouts() -> None:
    """Before the session folder, the LTI tests queued messages under ./var/celery/queue, and
    `make run`'s worker then ran them (grade submission 1, passback 3, ...) on its own data."""
    assert var_dir() == SESSION_VAR.resolve()
    opts = broker_settings(None)["broker_transport_options"]
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        assert not Path(opts[key]).is_relative_to(ROOT), (key, opts[key])
