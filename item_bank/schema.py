"""Marshmallow schemas for quiz data files and API bodies, and the error format they share.

Every problem is reported as ``<file>: <item id>: <field path>: <message>`` so an instructor can
find it without reading a traceback; the API returns the same messages keyed by field.
"""

from __future__ import annotations

import re
from typing import Any

from marshmallow import (
    RAISE,
    Schema,
    ValidationError,
    fields,
    pre_load,
    validate,
)

from item_bank.model import ITEM_TYPES, LANGUAGES, Item, Option, Quiz, Settings, Text

ID_RE = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
TOPIC_RE = r"^[a-z0-9][a-z0-9-]{0,63}$"
MAX_TEXT = 20_000


class BankError(ValueError):
    """Invalid quiz data; ``messages`` are one-line reasons, ``fields`` the same keyed by path."""

    def __init__(self, messages: list[str], fields: dict[str, list[str]] | None = None) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages
        self.fields = fields or {}


class TextSchema(Schema):
    """``{lang: sn, text: "...", en: "...", el: "..."}``: a string, its language, translations."""

    class Meta:
        unknown = RAISE

    lang = fields.String(required=True, validate=validate.OneOf(sorted(LANGUAGES)))
    text = fields.String(required=True, validate=validate.Length(min=1, max=MAX_TEXT))

    @pre_load
    def _split_translations(self, data: Any, **_: Any) -> Any:
        if isinstance(data, str):
            raise ValidationError(
                "a text needs its language: write {lang: en, text: ...} instead of a bare string"
            )
        if not isinstance(data, dict):
            return data
        data = dict(data)
        tr: dict[str, Any] = {}
        for key in list(data):
            if key in ("lang", "text"):
                continue
            if key not in LANGUAGES:
                raise ValidationError(
                    f"unknown language tag {key!r}; use one of {', '.join(sorted(LANGUAGES))}",
                    field_name=str(key),
                )
            value = data.pop(key)
            if not isinstance(value, str) or not value.strip():
                raise ValidationError("translation must be a non-empty string", field_name=key)
            if key == data.get("lang"):
                raise ValidationError(
                    f"translation into {key!r} repeats the text's own language", field_name=key
                )
            tr[key] = value
        self.context_translations = tr
        return data

    def load_text(self, data: Any, *, seed: bool) -> Text:
        loaded = self.load(data)
        tr = getattr(self, "context_translations", {})
        if loaded["lang"] != "en" and "en" not in tr:
            raise ValidationError("missing translation: add an 'en' version", field_name="en")
        return Text(lang=loaded["lang"], text=loaded["text"], translations=dict(tr), seed=seed)


def dump_text(t: Text) -> dict[str, str]:
    return {"lang": t.lang, "text": t.text, **t.translations}


class _Raw(Schema):
    class Meta:
        unknown = RAISE


class OptionSchema(_Raw):
    id = fields.String(required=True, validate=validate.Regexp(ID_RE))
    text = fields.Raw(required=True)
    correct = fields.Boolean(required=True)
    feedback = fields.Raw(load_default=None)


class ItemSchema(_Raw):
    id = fields.String(required=True, validate=validate.Regexp(ID_RE))
    type = fields.String(load_default="multiple_choice", validate=validate.OneOf(ITEM_TYPES))
    points = fields.Float(
        load_default=1.0, validate=validate.Range(min=0, min_inclusive=False, max=1000)
    )
    revision = fields.Integer(load_default=1, validate=validate.Range(min=1))
    topics = fields.List(
        fields.String(validate=validate.Regexp(TOPIC_RE)),
        required=True,
        validate=validate.Length(min=1, max=16),
    )
    prompt = fields.Raw(required=True)
    options = fields.List(
        fields.Nested(OptionSchema), required=True, validate=validate.Length(min=2, max=26)
    )
    explanation = fields.Raw(required=True)
    shuffle = fields.Boolean(load_default=True)


class SettingsSchema(_Raw):
    allowed_attempts = fields.Integer(
        load_default=None, allow_none=True, validate=validate.Range(min=1, max=1000)
    )
    allow_reanswer = fields.Boolean(load_default=False)
    shuffle_answers = fields.Boolean(load_default=True)
    time_limit_minutes = fields.Integer(
        load_default=None, allow_none=True, validate=validate.Range(min=1, max=24 * 60)
    )
    scoring_policy = fields.String(
        load_default="keep_highest", validate=validate.OneOf(["keep_highest", "keep_latest"])
    )


class QuizSchema(_Raw):
    id = fields.String(required=True, validate=validate.Regexp(ID_RE))
    title = fields.Raw(required=True)
    description = fields.Raw(required=True)
    source_lang = fields.String(required=True, validate=validate.OneOf(sorted(LANGUAGES)))
    source_file = fields.String(load_default=None, allow_none=True)
    revision = fields.Integer(load_default=1, validate=validate.Range(min=1))
    settings = fields.Nested(SettingsSchema, load_default=dict)
    items = fields.List(
        fields.Nested(ItemSchema), required=True, validate=validate.Length(min=1, max=500)
    )


def _flatten(errors: Any, prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if isinstance(errors, dict):
        for key, value in errors.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.extend(_flatten(value, path))
    elif isinstance(errors, list):
        if all(isinstance(e, str) for e in errors):
            out.extend((prefix or "_schema", e) for e in errors)
        else:
            for e in errors:
                out.extend(_flatten(e, prefix))
    else:
        out.append((prefix or "_schema", str(errors)))
    return out


def _item_label(data: Any, path: str) -> str:
    """Turn ``items.2.options.1.text`` into ``item q3: options.1.text`` for readable errors."""
    m = re.match(r"^items\.(\d+)(?:\.(.*))?$", path)
    if not m or not isinstance(data, dict) or not isinstance(data.get("items"), list):
        return path
    idx = int(m.group(1))
    items = data["items"]
    ident = items[idx].get("id") if idx < len(items) and isinstance(items[idx], dict) else None
    label = f"item {ident}" if ident else f"item #{idx + 1}"
    return f"{label}: {m.group(2) or '(item)'}"


class _Collector:
    def __init__(self) -> None:
        self.errors: dict[str, list[str]] = {}

    def add(self, path: str, message: str) -> None:
        self.errors.setdefault(path, []).append(message)

    def text(self, raw: Any, path: str, *, seed: bool, need: str | None = None) -> Text | None:
        try:
            t = TextSchema().load_text(raw, seed=seed)
        except ValidationError as exc:
            messages = exc.messages
            if isinstance(messages, list) and exc.field_name != "_schema":
                messages = {exc.field_name: messages}
            for sub, msg in _flatten(messages):
                self.add(f"{path}.{sub}" if sub != "_schema" else path, msg)
            return None
        if need and need != t.lang and need not in t.translations:
            self.add(f"{path}.{need}", f"missing translation: add a {need!r} version")
        return t


def load_quiz(data: Any, *, source: str = "<data>") -> Quiz:
    """Validate raw quiz data (a parsed YAML/JSON mapping) and build a ``Quiz``.

    Raises ``BankError`` listing every problem, each naming the source, the item and the field.
    """
    if not isinstance(data, dict):
        raise BankError([f"{source}: the quiz must be a mapping, got {type(data).__name__}"])
    try:
        raw = QuizSchema().load(data)
    except ValidationError as exc:
        pairs = _flatten(exc.messages)
        raise BankError(
            [f"{source}: {_item_label(data, p)}: {m}" for p, m in pairs],
            {p: [m for q, m in pairs if q == p] for p, _ in pairs},
        ) from None

    c = _Collector()
    src_lang = raw["source_lang"]
    title = c.text(raw["title"], "title", seed=True)
    description = c.text(raw["description"], "description", seed=True)
    items: list[Item] = []
    seen_items: set[str] = set()
    for i, it in enumerate(raw["items"]):
        base = f"items.{i}"
        if it["id"] in seen_items:
            c.add(f"{base}.id", f"duplicate item id {it['id']!r}")
        seen_items.add(it["id"])
        prompt = c.text(it["prompt"], f"{base}.prompt", seed=True)
        explanation = c.text(it["explanation"], f"{base}.explanation", seed=False, need=src_lang)
        options: list[Option] = []
        seen_opts: set[str] = set()
        for j, op in enumerate(it["options"]):
            obase = f"{base}.options.{j}"
            if op["id"] in seen_opts:
                c.add(f"{obase}.id", f"duplicate option id {op['id']!r}")
            seen_opts.add(op["id"])
            text = c.text(op["text"], f"{obase}.text", seed=True)
            feedback = None
            if op["feedback"] is not None:
                feedback = c.text(op["feedback"], f"{obase}.feedback", seed=False, need=src_lang)
            elif not op["correct"]:
                c.add(f"{obase}.feedback", "a wrong option needs feedback saying what is wrong")
            if text is not None:
                options.append(Option(op["id"], text, op["correct"], feedback))
        n_correct = sum(1 for op in it["options"] if op["correct"])
        if n_correct == 0:
            c.add(f"{base}.options", "no option is marked correct")
        elif n_correct > 1 and it["type"] != "multiple_answers":
            c.add(
                f"{base}.type",
                f"{n_correct} correct options need type 'multiple_answers', not {it['type']!r}",
            )
        if it["type"] == "true_false" and len(it["options"]) != 2:
            c.add(f"{base}.options", "a true_false item has exactly two options")
        if prompt and explanation and len(options) == len(it["options"]):
            items.append(
                Item(
                    id=it["id"],
                    type=it["type"],
                    points=float(it["points"]),
                    revision=it["revision"],
                    topics=tuple(it["topics"]),
                    prompt=prompt,
                    options=tuple(options),
                    explanation=explanation,
                    shuffle=it["shuffle"],
                )
            )
    if c.errors:
        raise BankError(
            [f"{source}: {_item_label(data, p)}: {m}" for p, ms in c.errors.items() for m in ms],
            c.errors,
        )
    assert title is not None and description is not None
    return Quiz(
        id=raw["id"],
        title=title,
        description=description,
        source_lang=src_lang,
        revision=raw["revision"],
        settings=Settings(**raw["settings"]),
        items=tuple(items),
        source_file=raw["source_file"],
    )


def dump_quiz(quiz: Quiz) -> dict[str, Any]:
    """The inverse of ``load_quiz``: the data-file form of a quiz (``load_quiz(dump_quiz(q)) == q``)."""
    s = quiz.settings
    return {
        "id": quiz.id,
        "title": dump_text(quiz.title),
        "description": dump_text(quiz.description),
        "source_lang": quiz.source_lang,
        "source_file": quiz.source_file,
        "revision": quiz.revision,
        "settings": {
            "allowed_attempts": s.allowed_attempts,
            "allow_reanswer": s.allow_reanswer,
            "shuffle_answers": s.shuffle_answers,
            "time_limit_minutes": s.time_limit_minutes,
            "scoring_policy": s.scoring_policy,
        },
        "items": [
            {
                "id": it.id,
                "type": it.type,
                "points": it.points,
                "revision": it.revision,
                "topics": list(it.topics),
                "prompt": dump_text(it.prompt),
                "options": [
                    {
                        "id": o.id,
                        "text": dump_text(o.text),
                        "correct": o.correct,
                        **({"feedback": dump_text(o.feedback)} if o.feedback else {}),
                    }
                    for o in it.options
                ],
                "explanation": dump_text(it.explanation),
                "shuffle": it.shuffle,
            }
            for it in quiz.items
        ],
    }


__all__ = ["BankError", "load_quiz", "dump_quiz", "dump_text"]
