"""``service.api.fastload.compile_load`` loads what marshmallow's ``Schema.load`` loads, or
leaves the input to marshmallow: never a different result, never a load marshmallow refuses."""

from __future__ import annotations

import random
from typing import Any

import pytest
from marshmallow import Schema, ValidationError, fields, post_load, validate, validates

from service.api.attempts import AnswerSchema, AttemptStartSchema
from service.api.fastload import compile_load
from service.api.grades import RegradeArgsSchema
from service.api.schemas import LANG_CHOICES


class _Mixed(Schema):
    """Every option the compiled load models: data keys, attributes, callable defaults, None."""

    name = fields.String(data_key="n", validate=validate.Length(max=3))
    tags = fields.List(
        fields.String(validate=validate.OneOf(["a", "b"])),
        allow_none=True,
        load_default=list,
        validate=lambda v: len(v) != 2,  # a plain function refusing with False
    )
    note = fields.String(allow_none=True, attribute="remark", required=True)


#: The request schemas of the API with a JSON body (location "json"), and one of each option.
SCHEMAS: list[type[Schema]] = [AttemptStartSchema, AnswerSchema, _Mixed]


def _value(rng: random.Random) -> Any:
    kind = rng.randrange(9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([7, 2.5, True, {}, {"a": 1}, b"q1"])
    if kind <= 5:
        return rng.choice(["", "a", "b", "q1", "en", "el", "x" * 65, "ab\x00", *LANG_CHOICES])
    return [
        _value(rng) if rng.random() < 0.2 else rng.choice(["a", "b", "q"])
        for _ in range(rng.randrange(4))
    ]


def _body(schema: Schema, rng: random.Random) -> Any:
    if rng.random() < 0.05:
        return rng.choice([[], "x", None, 3])
    keys = [f.data_key or name for name, f in schema.load_fields.items()]
    body = {k: _value(rng) for k in keys if rng.random() < 0.8}
    if rng.random() < 0.1:
        body["unknown"] = 1
    return body


def _marshmallow(schema: Schema, body: Any) -> dict[str, Any] | None:
    try:
        return schema.load(body)
    except ValidationError:
        return None


@pytest.mark.parametrize("schema_class", SCHEMAS, ids=lambda s: s.__name__)
def test_same_as_marshmallow(schema_class: type[Schema]) -> None:
    schema = schema_class()
    load = compile_load(schema)
    assert load is not None
    rng = random.Random(16)
    fast = 0
    for _ in range(3000):
        body = _body(schema, rng)
        got = load(body)
        if got is None:
            continue  # marshmallow decides
        fast += 1
        expected = _marshmallow(schema, body)
        assert expected is not None, f"loaded what marshmallow refuses: {body!r}"
        assert got == expected and list(got) == list(expected), body
    assert fast > 100  # the fast path is taken, not only ever declined


@pytest.mark.parametrize(
    ("schema", "body", "loaded"),
    [
        (AnswerSchema(), {"item_id": "q1", "answer": ["b"]}, {"item_id": "q1", "answer": ["b"]}),
        (AttemptStartSchema(), {}, {"lang": "en", "assignment_id": None}),
        (AttemptStartSchema(), {"lang": "source"}, {"lang": "source", "assignment_id": None}),
    ],
)
def test_the_quiz_bodies_take_the_fast_path(
    schema: Schema, body: dict[str, Any], loaded: dict[str, Any]
) -> None:
    load = compile_load(schema)
    assert load is not None
    assert load(body) == loaded == schema.load(body)


class _Hooked(Schema):
    x = fields.String()

    @post_load
    def wrap(self, data: dict[str, Any], **_: Any) -> dict[str, Any]:
        return {"wrapped": data}


class _Validated(Schema):
    x = fields.String()

    @validates("x")
    def check(self, value: str, **_: Any) -> None:
        raise ValidationError("no")


@pytest.mark.parametrize(
    "schema",
    [
        _Hooked(),
        _Validated(),
        RegradeArgsSchema(),  # a Boolean: not modelled
        AnswerSchema(unknown="exclude"),
        AnswerSchema(partial=True),
        AnswerSchema(many=True),
    ],
    ids=["post_load", "validates", "boolean", "unknown", "partial", "many"],
)
def test_what_it_does_not_model_goes_to_marshmallow(schema: Schema) -> None:
    assert compile_load(schema) is None


def test_a_bad_body_gets_marshmallows_error(client: Any, world: Any) -> None:
    """Through the API: what the fast path declines is refused by webargs as before."""
    attempt = world.start("quiz-a")
    url = f"/api/v1/attempts/{attempt['id']}/responses"
    r = world.post(url, "alice", json={"item_id": "q1", "answer": [7], "x": 1})
    assert r.status_code == 422
    assert r.get_json()["errors"] == {
        "json": {"answer": {"0": ["Not a valid string."]}, "x": ["Unknown field."]}
    }
    r = world.post(url, "alice", json={"item_id": "q1", "answer": ["b"]})
    assert r.status_code == 201
