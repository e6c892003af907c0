"""``service.KgradeFlask`` remembers which functions are coroutine functions; what
``ensure_sync`` returns stays Flask's."""

from __future__ import annotations

from typing import Any

from flask import Flask

from service import KgradeFlask


def test_ensure_sync_gives_what_flask_gives() -> None:
    app, plain = KgradeFlask(__name__), Flask(__name__)

    def hook() -> None:
        pass

    class View:
        def get(self) -> str:
            return "x"

    for _ in range(3):  # first call and remembered calls alike
        assert app.ensure_sync(hook) is hook
        bound = View().get  # a new bound method each request, as a MethodView's
        assert app.ensure_sync(bound) is bound
    assert len(app._is_async) == 2  # the method is remembered once, by its function

    async def coro() -> str:
        return "y"

    outcomes = []
    for flask_app in (plain, app, app):
        try:
            outcomes.append(("ok", flask_app.ensure_sync(coro)()))
        except Exception as exc:  # noqa: BLE001 - without asgiref both refuse alike
            outcomes.append(("error", type(exc)))
    assert outcomes[0] == outcomes[1] == outcomes[2]


def test_unhashable_callables_are_not_remembered() -> None:
    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

        def __call__(self, *args: Any) -> None:
            pass

    app = KgradeFlask(__name__)
    f = Unhashable()
    assert app.ensure_sync(f) is f
    assert app._is_async == {}


def test_the_memory_is_bounded() -> None:
    app = KgradeFlask(__name__)
    n = KgradeFlask._ASYNC_CACHE_SIZE
    for i in range(n + 10):
        exec(f"def f{i}(): pass", namespace := {})
        app.ensure_sync(namespace[f"f{i}"])
    assert len(app._is_async) == n
