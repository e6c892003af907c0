"""Marshmallow schemas shared by several blueprints (quiz and item views, feedback, quiz data).

Schemas used by a single blueprint live in that blueprint's module.
"""

from __future__ import annotations

from marshmallow import Schema, fields, validate

from item_bank.model import ITEM_TYPES, LANGUAGES

LANG_CHOICES = ("en", "source")
LANG_DESCRIPTION = (
    "Delivery language: `en` (English) or `source` (the quiz's source language, with seed "
    "strings verbatim)."
)


class LangQuerySchema(Schema):
    lang = fields.String(
        load_default="en",
        validate=validate.OneOf(LANG_CHOICES),
        metadata={"description": LANG_DESCRIPTION},
    )


class SettingsSchema(Schema):
    allowed_attempts = fields.Integer(allow_none=True, metadata={"description": "null: unlimited"})
    allow_reanswer = fields.Boolean()
    shuffle_answers = fields.Boolean()
    time_limit_minutes = fields.Integer(allow_none=True)
    scoring_policy = fields.String()


class OptionViewSchema(Schema):
    id = fields.String(required=True)
    text = fields.String(required=True)
    correct = fields.Boolean(metadata={"description": "instructors only"})
    feedback = fields.String(allow_none=True, metadata={"description": "instructors only"})


class ItemViewSchema(Schema):
    id = fields.String(required=True)
    type = fields.String(required=True, metadata={"enum": list(ITEM_TYPES)})
    points = fields.Float(required=True)
    revision = fields.Integer(required=True)
    topics = fields.List(fields.String())
    prompt = fields.String(required=True)
    options = fields.List(fields.Nested(OptionViewSchema), required=True)
    correct_options = fields.List(fields.String(), metadata={"description": "instructors only"})
    explanation = fields.String(metadata={"description": "instructors only"})


class QuizSummarySchema(Schema):
    id = fields.String(required=True)
    title = fields.String(required=True)
    description = fields.String(required=True)
    source_lang = fields.String(required=True)
    revision = fields.Integer(required=True)
    item_count = fields.Integer(required=True)
    points_possible = fields.Float(required=True)
    settings = fields.Nested(SettingsSchema)
    attempts_used = fields.Integer(metadata={"description": "students: your attempts so far"})


class QuizViewSchema(QuizSummarySchema):
    lang = fields.String(required=True, metadata={"enum": list(LANG_CHOICES)})
    items = fields.List(fields.Nested(ItemViewSchema), required=True)


class OptionFeedbackSchema(Schema):
    option_id = fields.String(required=True)
    correct = fields.Boolean(required=True)
    feedback = fields.String(allow_none=True)


class FeedbackSchema(Schema):
    """Immediate feedback on one answered item, in the attempt's language."""

    attempt_id = fields.String(required=True)
    item_id = fields.String(required=True)
    item_revision = fields.Integer(required=True, metadata={"description": "key graded against"})
    answer = fields.List(fields.String(), required=True)
    correct = fields.Boolean(required=True)
    points = fields.Float(required=True)
    max_points = fields.Float(required=True)
    correct_options = fields.List(fields.String(), required=True)
    explanation = fields.String(required=True)
    option_feedback = fields.List(
        fields.Nested(OptionFeedbackSchema),
        required=True,
        metadata={"description": "feedback for each chosen option"},
    )
    times_answered = fields.Integer(required=True)
    answered_at = fields.DateTime(required=True)
    can_reanswer = fields.Boolean(
        required=True, metadata={"description": "whether this item may be answered again"}
    )


# ---- The item bank's data-file schema, for documentation and for dumping quiz data. --------
# Validation of incoming quiz data is item_bank.load_quiz (the bank's own rules); these schemas
# describe the same shape in the OpenAPI document.


class TextDataSchema(Schema):
    lang = fields.String(required=True, metadata={"enum": sorted(LANGUAGES)})
    text = fields.String(required=True)
    en = fields.String(metadata={"description": "English translation (required unless lang=en)"})
    sn = fields.String(metadata={"description": "Shona translation"})
    el = fields.String(metadata={"description": "Greek translation"})


class OptionDataSchema(Schema):
    id = fields.String(required=True)
    text = fields.Nested(TextDataSchema, required=True)
    correct = fields.Boolean(required=True)
    feedback = fields.Nested(TextDataSchema, metadata={"description": "required for wrong options"})


class ItemDataSchema(Schema):
    id = fields.String(required=True)
    type = fields.String(dump_default="multiple_choice", metadata={"enum": list(ITEM_TYPES)})
    points = fields.Float(dump_default=1.0)
    revision = fields.Integer(
        metadata={"description": "set by the server: bumped whenever the item's content changes"}
    )
    topics = fields.List(fields.String(), required=True)
    prompt = fields.Nested(TextDataSchema, required=True)
    options = fields.List(fields.Nested(OptionDataSchema), required=True)
    explanation = fields.Nested(TextDataSchema, required=True)
    shuffle = fields.Boolean(
        dump_default=True,
        metadata={"description": "false keeps the written option order in a shuffled quiz"},
    )


class SettingsDataSchema(Schema):
    allowed_attempts = fields.Integer(allow_none=True)
    allow_reanswer = fields.Boolean()
    shuffle_answers = fields.Boolean()
    time_limit_minutes = fields.Integer(allow_none=True)
    scoring_policy = fields.String(metadata={"enum": ["keep_highest", "keep_latest"]})


class QuizDataSchema(Schema):
    """A quiz in the item bank's data-file form (item_bank/quizzes/*.yaml, as JSON)."""

    id = fields.String(required=True)
    title = fields.Nested(TextDataSchema, required=True)
    description = fields.Nested(TextDataSchema, required=True)
    source_lang = fields.String(required=True, metadata={"enum": sorted(LANGUAGES)})
    source_file = fields.String(allow_none=True)
    revision = fields.Integer(metadata={"description": "set by the server"})
    settings = fields.Nested(SettingsDataSchema)
    items = fields.List(fields.Nested(ItemDataSchema), required=True)
