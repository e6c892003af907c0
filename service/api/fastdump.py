"""``Schema.dump`` without marshmallow's per-field call layers, for the API's responses.

marshmallow serializes each field through ``Field.serialize`` -> ``Field.get_value`` ->
``Schema.get_attribute`` -> ``utils.get_value`` -> ``_get_value_for_key`` -> ``_serialize``: six
calls for one string. A started attempt's response has about 70 fields, so its dump was a
tenth of a quiz request's CPU. ``compile_dump(schema)`` reads the schema's fields once and
returns a function that does the same work in one loop: the value read exactly as
``utils.get_value`` reads it, the field's default when it is missing, and the field's own
``_serialize`` for the conversion, except where that conversion returns the value unchanged
(a ``str`` in a ``String``, an ``int`` in an ``Integer``, a ``float`` in a ``Float``, a
``bool`` in a ``Boolean``), which is then skipped. Anything it does not know to be the same
(hooks, a custom ``get_attribute`` or ``serialize``, dotted attributes, ``many``, another
``dict_class``) keeps marshmallow's own ``dump``, so the output is marshmallow's in every case
(tests/service/test_fastdump.py compares them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from marshmallow import Schema, fields
from marshmallow.decorators import POST_DUMP, PRE_DUMP
from marshmallow.utils import get_value, missing

Dump = Callable[[Any], Any]
#: (output key, attribute read, field, conversion of a present value)
_Step = tuple[str, str, fields.Field, Callable[[Any, Any], Any]]

#: Field classes whose ``_serialize`` returns a value of this exact type unchanged (with their
#: default options, checked in ``_converter``).
_IDENTITY: dict[type[fields.Field], type] = {
    fields.String: str,
    fields.Integer: int,
    fields.Float: float,
    fields.Boolean: bool,
}


def compile_dump(schema: Schema) -> Dump:
    """A function equal to ``schema.dump`` (one object, not ``many``), faster where it can."""
    if (
        schema.many
        or schema._hooks[PRE_DUMP]
        or schema._hooks[POST_DUMP]
        or type(schema).get_attribute is not Schema.get_attribute
        or type(schema)._serialize is not Schema._serialize
        or schema.dict_class is not dict
    ):
        return schema.dump
    steps: list[_Step] = []
    for name, field in schema.dump_fields.items():
        attr = name if field.attribute is None else field.attribute
        if (
            "." in attr
            or not field._CHECK_ATTRIBUTE
            or type(field).serialize is not fields.Field.serialize
            or type(field).get_value is not fields.Field.get_value
        ):
            return schema.dump
        key = name if field.data_key is None else field.data_key
        steps.append((key, attr, field, _converter(field, name)))
    return _make_dump(tuple(steps))


def _make_dump(steps: tuple[_Step, ...]) -> Dump:
    def dump(obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        is_dict = type(obj) is dict
        for key, attr, field, convert in steps:
            # utils.get_value(obj, attr, missing), whose first branch is a dict's lookup
            if is_dict:
                try:
                    value = obj[attr]
                except KeyError:
                    value = getattr(obj, attr, missing)
            else:
                value = get_value(obj, attr, missing)
            if value is missing:  # Field.serialize: the dump default, else no key at all
                default = field.dump_default
                value = default() if callable(default) else default
                if value is missing:
                    continue
            out[key] = convert(value, obj)
        return out

    return dump


def _converter(field: fields.Field, name: str) -> Callable[[Any, Any], Any]:
    """``field._serialize(value, name, obj)``, skipped where it would return ``value``."""
    serialize = field._serialize
    if type(field) is fields.Nested:
        nested = field.schema  # what Nested._serialize dumps with (built once, kept)
        if nested.many or field.many:
            return lambda value, obj: serialize(value, name, obj)
        dump = compile_dump(nested)
        return lambda value, obj: None if value is None else dump(value)
    if type(field) is fields.List:
        inner = field.inner
        convert_each = _converter(inner, name)
        return lambda value, obj: (
            None if value is None else [convert_each(each, obj) for each in value]
        )
    same = _IDENTITY.get(type(field))
    if same is None or getattr(field, "as_string", False):
        return lambda value, obj: serialize(value, name, obj)
    if isinstance(field, fields.Boolean) and (
        field.truthy is not fields.Boolean.truthy or field.falsy is not fields.Boolean.falsy
    ):
        return lambda value, obj: serialize(value, name, obj)
    return lambda value, obj: value if type(value) is same else serialize(value, name, obj)
