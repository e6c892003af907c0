"""What a request costs in layers: ``endpoint()`` runs a view's declared arguments and response
itself, once per request, with no flask-smorest or webargs call layer around the view."""

from __future__ import annotations

from typing import Any

import pytest
from marshmallow import Schema, fields

from service.api import attempts as attempts_api
from service.api.common import Blueprint
from tests.service.conftest import World


def _layers(view: Any) -> list[str]:
    """The source files of the functions a call goes through, outermost first (a wrapper's
    ``__module__`` is the wrapped function's, its code is its own)."""
    out = []
    while view is not None:
        out.append(view.__code__.co_filename)
        view = getattr(view, "__wrapped__", None)
    return out


def test_api_views_run_in_no_flask_smorest_or_webargs_layer(world: World) -> None:
    for name, view in world.app.view_functions.items():
        view_class = getattr(view, "view_class", None)
        if not name.startswith(attempts_api.blp.name + ".") or view_class is None:
            continue
        for method in view_class.methods:
            layers = _layers(getattr(view_class, method.lower()))
            assert not [f for f in layers if "/flask_smorest/" in f or "/webargs/" in f], (
                name,
                method,
                layers,
            )


def test_argument_schemas_are_built_once_not_per_request(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempt = world.start("quiz-a")
    built = []
    original = attempts_api.AnswerSchema.__init__

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(attempts_api.AnswerSchema, "__init__", counting_init)
    assert world.answer(attempt["id"], "q1", ["b"]).status_code == 201
    r = world.answer(attempt["id"], "q2", [])
    assert r.status_code == 422 and "answer" in r.get_json()["errors"]["json"]
    assert built == []


def test_webargs_options_endpoint_does_not_run_are_refused() -> None:
    blp = Blueprint("layers-test", __name__)

    class Args(Schema):
        n = fields.Integer()

    with pytest.raises(TypeError, match="unknown"):
        blp.arguments(Args, unknown="include")
    blp.response(200, Args)(view := lambda: None)
    with pytest.raises(TypeError, match="one @blp.response"):
        blp.response(201, Args)(view)
