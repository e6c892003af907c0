"""``Schema.load`` for plainly valid JSON bodies, without marshmallow's per-field layers.

An answer's body is two strings and a list of strings; webargs and marshmallow took about 50 us
of CPU to load it in a fresh request (``Schema.load`` -> ``_do_load`` -> ``_deserialize`` ->
``_call_and_store`` -> ``Field.deserialize`` -> ``_deserialize`` -> ``And`` of validators, per
field), several times what reading and decoding the body cost. ``compile_load(schema)``
reads the schema's fields once and returns a function that either returns exactly what
``schema.load`` returns for the input, or None when it cannot be sure of that: the input is
not a dict, names a key the schema does not load, a value is of another type than the field
takes as it is, a validator refuses it, or the schema or a field has anything this module
does not model (hooks, ``partial``, another ``unknown``, field types beyond ``String`` and
``List(String)``). The caller then runs marshmallow itself, for its result or for its errors,
so every refusal is marshmallow's own message (tests/service/test_fastload.py compares them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields
from marshmallow.decorators import POST_LOAD, PRE_LOAD, VALIDATES, VALIDATES_SCHEMA
from marshmallow.utils import missing

#: The loaded dict, or None: ask marshmallow.
Load = Callable[[Any], dict[str, Any] | None]
#: A value's check and conversion: (True, the loaded value) or (False, None) when not sure.
_Convert = Callable[[Any], tuple[bool, Any]]
#: (input key, output key, required, the field's load default, conversion of a present value)
_Step = tuple[str, str, bool, Any, _Convert]


def compile_load(schema: Schema) -> Load | None:
    """A function that loads what ``schema.load`` would load, or None for a schema it does
    not model (every input then goes to marshmallow)."""
    if (
        schema.many
        or schema.partial
        or schema.unknown != RAISE
        or schema.dict_class is not dict
        or any(schema._hooks[h] for h in (PRE_LOAD, POST_LOAD, VALIDATES, VALIDATES_SCHEMA))
        or type(schema)._deserialize is not Schema._deserialize
    ):
        return None
    steps: list[_Step] = []
    for name, field in schema.load_fields.items():
        convert = _converter(field)
        out_key = field.attribute or name
        if convert is None or "." in out_key:
            return None
        in_key = name if field.data_key is None else field.data_key
        steps.append((in_key, out_key, field.required, field.load_default, convert))
    known = frozenset(step[0] for step in steps)
    return _make_load(tuple(steps), known)


def _make_load(steps: tuple[_Step, ...], known: frozenset[str]) -> Load:
    def load(data: Any) -> dict[str, Any] | None:
        if type(data) is not dict or not known.issuperset(data):
            return None  # not an object, or a key RAISE refuses
        out: dict[str, Any] = {}
        for in_key, out_key, required, default, convert in steps:
            value = data.get(in_key, missing)
            if value is missing:  # Field.deserialize of a missing value
                if required:
                    return None
                value = default() if callable(default) else default
                if value is not missing:
                    out[out_key] = value
                continue
            ok, value = convert(value)
            if not ok:
                return None
            out[out_key] = value
        return out

    return load


def _plain(field: fields.Field) -> bool:
    """Whether ``field.deserialize`` is the base one, with no per-field hooks."""
    return (
        type(field).deserialize is fields.Field.deserialize
        and type(field)._validate is fields.Field._validate
        and not field.pre_load
        and not field.post_load
    )


def _validated(field: fields.Field, check: Callable[[Any], bool]) -> _Convert:
    """``field``'s conversion of a value that passes ``check`` (its type, as ``_deserialize``
    returns it unchanged), then its validators, as ``Field.deserialize`` runs them."""
    validators = tuple(field.validators)
    allow_none = field.allow_none

    def convert(value: Any) -> tuple[bool, Any]:
        if value is None:
            return allow_none, None
        if not check(value):
            return False, None
        try:
            refused = any(v(value) is False for v in validators)
        except ValidationError:
            return False, None
        return (False, None) if refused else (True, value)

    return convert


def _converter(field: fields.Field) -> _Convert | None:
    if not _plain(field):
        return None
    if type(field) is fields.String:
        # String._deserialize returns a str unchanged (bytes never come from JSON)
        return _validated(field, lambda v: type(v) is str)
    if type(field) is fields.List:
        inner = _converter(field.inner)
        if inner is None:
            return None
        validate = _validated(field, lambda v: type(v) is list)

        def convert(value: Any) -> tuple[bool, Any]:
            if type(value) is not list:
                return validate(value)  # None where allowed; anything else is refused
            items = []
            for item in value:  # List._deserialize: each through the inner field, a new list
                ok, loaded = inner(item)
                if not ok:
                    return False, None
                items.append(loaded)
            return validate(items)

        return convert
    return None
