"""``service.api.fastdump.compile_dump`` gives what marshmallow's ``Schema.dump`` gives, for
every schema of the API and for values of every kind a field may meet (missing, None, its own
type, another type its ``_serialize`` converts)."""

from __future__ import annotations

import datetime as dt
import importlib
import inspect
import pkgutil
import random
from typing import Any

import pytest
from marshmallow import Schema, fields, post_dump

import service.api
from service.api.fastdump import compile_dump


def _api_schemas() -> list[type[Schema]]:
    found: dict[str, type[Schema]] = {}
    for info in pkgutil.iter_modules(service.api.__path__):
        module = importlib.import_module(f"service.api.{info.name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Schema) and obj.__module__.startswith("service."):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


SCHEMAS = _api_schemas()


class _Obj:
    """An object read by attribute, as views sometimes return."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def _value(field: fields.Field, rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(6)
    if kind == 0:
        return None
    if isinstance(field, fields.Nested):
        if depth > 3:
            return None
        return _sample(field.schema, rng, depth + 1)
    if isinstance(field, fields.List):
        return [_value(field.inner, rng, depth + 1) for _ in range(rng.randrange(4))]
    if isinstance(field, fields.Dict):
        return {f"k{i}": rng.randrange(5) for i in range(rng.randrange(3))}
    if isinstance(field, fields.DateTime):
        return dt.datetime(2026, 12, 1, 20, rng.randrange(60), tzinfo=dt.UTC)
    odd = [7, 2.5, True, False, "3", "x", 0]
    if kind == 1:
        return rng.choice(odd)
    natural = {
        fields.String: lambda: rng.choice(["", "a", "ü", "q1"]),
        fields.Integer: lambda: rng.randrange(-3, 10**12),
        fields.Float: lambda: rng.choice([0.0, 0.5, 1e300, -2.25]),
        fields.Boolean: lambda: rng.choice([True, False]),
    }
    for cls, make in natural.items():
        if isinstance(field, cls):
            return make()
    return rng.choice(odd)


def _sample(schema: Schema, rng: random.Random, depth: int = 0) -> Any:
    values = {
        name: _value(field, rng, depth)
        for name, field in schema.dump_fields.items()
        if rng.random() > 0.15  # sometimes missing
    }
    return values if rng.random() < 0.8 else _Obj(**values)


def _outcome(dump: Any, obj: Any) -> tuple[str, Any]:
    try:
        return "ok", dump(obj)
    except Exception as exc:  # noqa: BLE001 - both sides must fail alike
        return "error", type(exc)


@pytest.mark.parametrize("schema_cls", SCHEMAS, ids=lambda c: c.__qualname__)
def test_same_as_marshmallow(schema_cls: type[Schema]) -> None:
    schema = schema_cls()
    fast = compile_dump(schema)
    rng = random.Random(schema_cls.__qualname__)
    for _ in range(300):
        obj = _sample(schema, rng)
        want, got = _outcome(schema.dump, obj), _outcome(fast, obj)
        assert got == want, obj
        if want[0] == "ok":  # same key order, same types (1 is not 1.0 in JSON)
            assert list(got[1]) == list(want[1])
            assert repr(got[1]) == repr(want[1])


def test_compiles_the_quiz_schemas() -> None:
    from service.api.attempts import AttemptSchema, SubmitResultSchema
    from service.api.schemas import FeedbackSchema

    for cls in (AttemptSchema, SubmitResultSchema, FeedbackSchema):
        schema = cls()
        assert compile_dump(schema) != schema.dump  # the fast path, not the fallback


def test_falls_back_to_marshmallow_for_hooks() -> None:
    class Hooked(Schema):
        a = fields.String()

        @post_dump
        def upper(self, data: dict[str, Any], **_: Any) -> dict[str, Any]:
            return {k: v.upper() for k, v in data.items()}

    schema = Hooked()
    assert compile_dump(schema)({"a": "x"}) == {"a": "X"}


def test_data_key_attribute_and_defaults() -> None:
    class Keys(Schema):
        a = fields.String(data_key="A")
        b = fields.Integer(attribute="bee", dump_default=5)
        c = fields.Float(dump_default=lambda: 1)
        d = fields.Boolean(truthy={"yes"})
        e = fields.Integer(as_string=True)
        f = fields.List(fields.Nested("Inner"))

    class Inner(Schema):
        x = fields.String()

    schema = Keys()
    for obj in (
        {"a": 1, "bee": True, "d": "yes", "e": 3, "f": [{"x": 1}, None]},
        {"b": 9, "d": "no", "e": "4"},
        {},
    ):
        assert repr(compile_dump(schema)(obj)) == repr(schema.dump(obj))
