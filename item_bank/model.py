"""The item bank's domain objects: quizzes, items, options and language-tagged texts.

These are plain frozen dataclasses so that the exporters, the API and the grader can share them
without importing marshmallow or Flask; ``item_bank.schema`` builds them from data files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

#: Languages the course material is written in. A tag outside this set is a data error, since
#: nobody could review a translation into it.
LANGUAGES: dict[str, str] = {"en": "English", "sn": "Shona", "el": "Greek"}

LangMode = Literal["en", "source", "all"]
LANG_MODES: tuple[str, ...] = ("en", "source", "all")

ItemType = Literal["multiple_choice", "multiple_answers", "true_false"]
ITEM_TYPES: tuple[str, ...] = ("multiple_choice", "multiple_answers", "true_false")


@dataclass(frozen=True)
class Text:
    """One string in the language it was written in, with its translations.

    ``seed`` texts come verbatim from the course's source quiz; the others (explanations,
    feedback) were authored for kgrade in English and translated into the quiz's source
    language so that a quiz can be delivered wholly in that language.
    """

    lang: str
    text: str
    translations: dict[str, str] = field(default_factory=dict)
    seed: bool = False

    def get(self, lang: str) -> str | None:
        if lang == self.lang:
            return self.text
        return self.translations.get(lang)

    @property
    def en(self) -> str:
        value = self.get("en")
        if value is None:  # the schema makes this unreachable for loaded data
            raise KeyError(f"text {self.text[:40]!r} has no English version")
        return value

    def source_form(self, source_lang: str) -> tuple[str, str]:
        """(language, text) as the quiz's source form shows it.

        A seed string is shown verbatim; an authored one in the quiz's source language when a
        translation exists, else as written.
        """
        if self.seed:
            return self.lang, self.text
        value = self.get(source_lang)
        return (source_lang, value) if value is not None else (self.lang, self.text)

    def variants(self, source_lang: str | None = None) -> dict[str, str]:
        """Every language version, the source form first and English next."""
        first = self.source_form(source_lang)[0] if source_lang else self.lang
        out = {first: self.get(first) or self.text}
        out.setdefault("en", self.en)
        for lang in (self.lang, *sorted(self.translations)):
            out.setdefault(lang, self.get(lang) or "")
        return out

    def render(self, mode: str, source_lang: str) -> tuple[str, str]:
        """(language, text) for a single-language delivery mode (``en`` or ``source``)."""
        if mode == "en":
            return "en", self.en
        if mode == "source":
            return self.source_form(source_lang)
        raise ValueError(f"render() takes 'en' or 'source', got {mode!r}; use variants() for 'all'")


@dataclass(frozen=True)
class Option:
    id: str
    text: Text
    correct: bool
    feedback: Text | None = None


@dataclass(frozen=True)
class Item:
    id: str
    type: str
    points: float
    revision: int
    topics: tuple[str, ...]
    prompt: Text
    options: tuple[Option, ...]
    explanation: Text
    #: False keeps the options in their written order even in a shuffled quiz (an item whose
    #: options refer to each other: "all of the above", "both a and b").
    shuffle: bool = True

    @property
    def correct_ids(self) -> tuple[str, ...]:
        return tuple(o.id for o in self.options if o.correct)

    def option(self, option_id: str) -> Option:
        for o in self.options:
            if o.id == option_id:
                return o
        raise KeyError(option_id)

    @property
    def source_lang(self) -> str:
        return self.prompt.lang

    def texts(self) -> Iterator[Text]:
        yield self.prompt
        for o in self.options:
            yield o.text
            if o.feedback is not None:
                yield o.feedback
        yield self.explanation


@dataclass(frozen=True)
class Settings:
    allowed_attempts: int | None = None  # None: unlimited
    allow_reanswer: bool = False
    #: Options in a per-attempt random order (each item may opt out): the written order gives
    #: away answers (the longest option, an a-b-c-d cycle).
    shuffle_answers: bool = True
    time_limit_minutes: int | None = None
    scoring_policy: str = "keep_highest"


@dataclass(frozen=True)
class Quiz:
    id: str
    title: Text
    description: Text
    source_lang: str
    revision: int
    settings: Settings
    items: tuple[Item, ...]
    source_file: str | None = None

    def item(self, item_id: str) -> Item:
        for it in self.items:
            if it.id == item_id:
                return it
        raise KeyError(item_id)

    @property
    def points_possible(self) -> float:
        return float(sum(it.points for it in self.items))

    def texts(self) -> Iterator[Text]:
        yield self.title
        yield self.description
        for it in self.items:
            yield from it.texts()
