"""The pages' blueprint. Views live in one module per area and register on ``bp``:
``home`` (sign-in, entry from a launch, the course page), ``quiz`` (taking quizzes),
``exercise`` (kernel exercises and their gradings), ``instructor`` (grades, detail, exports)."""

from __future__ import annotations

import importlib

from flask import Blueprint

from service.web.guard import load_actor

bp = Blueprint("web", __name__)
bp.before_request(load_actor)

VIEW_MODULES = ("home", "quiz", "exercise", "instructor")


def blueprints() -> list[Blueprint]:
    for name in VIEW_MODULES:
        importlib.import_module(f"service.web.{name}")
    return [bp]
