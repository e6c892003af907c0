"""What the course quizzes teach (issue 17 §1): feedback that names its option, and the facts
that were once wrong stay right.

Option texts in Shona and Greek are verbatim machine-translated seeds, often far from the
English ("Optimizer inoti", "κουπονιών" for tokens), so each per-option feedback quotes the
option's own words, as that option shows them, before explaining them: otherwise a student
reading Shona or Greek cannot tell which option the feedback is about.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from item_bank import Item, Option, Quiz, Text, get_quiz

QUIZ_IDS = ("ring-attention-quiz", "sparse-attention-quiz")

#: A phrase in curly, angle (Greek) or straight double quotes.
QUOTED = re.compile(r"[“«\"]([^”»\"]+)[”»\"]")


def quoted_phrases(text: str) -> list[str]:
    return [m.strip() for m in QUOTED.findall(text) if m.strip()]


def option_wording(option: Option, lang: str, quiz: Quiz) -> str:
    """The option as a student reading feedback in ``lang`` sees it next to that feedback."""
    if lang == "en":
        return option.text.en
    # The source delivery shows a seed verbatim, in whatever language the course wrote it.
    return option.text.source_form(quiz.source_lang)[1]


def names_its_option(item: Item, option: Option, lang: str, quiz: Quiz) -> bool:
    """True when some quoted phrase of the feedback is in this option's wording and in no
    other option's, so it points at this option alone (case aside: a quote may start
    mid-sentence)."""
    assert option.feedback is not None
    feedback = option.feedback.get(lang)
    assert feedback, f"{quiz.id} {item.id}{option.id}: no {lang} feedback"
    own = option_wording(option, lang, quiz).casefold()
    others = [option_wording(o, lang, quiz).casefold() for o in item.options if o is not option]
    return any(
        p.casefold() in own and not any(p.casefold() in other for other in others)
        for p in quoted_phrases(feedback)
    )


def feedback_cases() -> list[tuple[str, str, str, str]]:
    cases = []
    for quiz_id in QUIZ_IDS:
        quiz = get_quiz(quiz_id)
        for item in quiz.items:
            for option in item.options:
                if option.feedback is None:
                    continue
                for lang in (quiz.source_lang, "en"):
                    cases.append((quiz_id, item.id, option.id, lang))
    return cases


@pytest.mark.parametrize(("quiz_id", "item_id", "option_id", "lang"), feedback_cases())
def test_option_feedback_quotes_its_option(
    quiz_id: str, item_id: str, option_id: str, lang: str
) -> None:
    quiz = get_quiz(quiz_id)
    item = quiz.item(item_id)
    option = item.option(option_id)
    assert names_its_option(item, option, lang, quiz), (
        f"{quiz_id} {item_id}{option_id} [{lang}] feedback quotes none of its option's own words "
        f"{option_wording(option, lang, quiz)!r}: {option.feedback.get(lang)!r}"  # type: ignore[union-attr]
    )


def test_quote_check_rejects_unquoted_and_foreign_quotes() -> None:
    # The check itself must be able to fail: an unquoted paraphrase, and a quote of a
    # neighbouring option, both count as not naming the option.
    quiz = get_quiz("sparse-attention-quiz")
    item = quiz.item("q4")
    a = item.option("a")
    assert a.feedback is not None
    for text in (
        "Κωδικοποιητής και αποκωδικοποιητής δεν είναι κλάδοι.",
        "«Συμπίεση, επιλογή και συρόμενο παράθυρο» είναι οι κλάδοι.",
    ):
        fake = replace(a, feedback=Text("en", "x", {"el": text}))
        forged = replace(item, options=(fake, *item.options[1:]))
        assert not names_its_option(forged, fake, "el", quiz), text


def test_nsa_branches_have_independent_keys_and_values() -> None:
    # NSA paper (Yuan et al. 2025, §3.3.3): independent K/V per branch against shortcut
    # learning; shared K/V is what open implementations (and kernels/nsa) do.
    item = get_quiz("sparse-attention-quiz").item("q4")
    feedback = item.option("a").feedback
    assert feedback is not None
    en, el = feedback.get("en") or "", feedback.get("el") or ""
    assert "independent keys and values" in en and "shortcut" in en
    assert "same keys and values" not in en
    assert "ανεξάρτητα κλειδιά και τιμές" in el and "κοινό σύνολο" in el
    assert "ίδιων κλειδιών" not in el
    assert "independent keys and values" in item.explanation.en
    assert "ανεξάρτητα κλειδιά και τιμές" in (item.explanation.get("el") or "")


def test_ring_step_overlaps_compute_and_transfer() -> None:
    # q5 teaches that the next block's send/receive overlaps the current block's compute, so
    # q2 must not describe a compute-then-send step.
    quiz = get_quiz("ring-attention-quiz")
    q2, q5 = quiz.item("q2").explanation, quiz.item("q5").explanation
    assert "then sends" not in q2.en and "yobva yaritumira" not in (q2.get("sn") or "")
    assert "at the same time" in q2.en and "overlaps" in q2.en
    assert "panguva imwe chete" in (q2.get("sn") or "")
    assert "while it is still computing" in q5.en


def test_ring_causal_attention_includes_the_position_itself() -> None:
    item = get_quiz("ring-attention-quiz").item("q6")
    b = item.option("b").feedback
    assert b is not None
    assert "only to earlier positions" not in b.en
    assert "its own position" in b.en and "pachayo" in (b.get("sn") or "")
    assert "0…i" in item.explanation.en and "itself included" in item.explanation.en


def test_ring_zigzag_cuts_the_sequence_into_2n_chunks() -> None:
    explanation = get_quiz("ring-attention-quiz").item("q6").explanation
    assert "2N chunks" in explanation.en and "2N−1−i" in explanation.en
    assert "zvikamu 2N" in (explanation.get("sn") or "")


#: Items whose authored texts issue 17 changed; each change bumps the revision.
REVISED = {
    "ring-attention-quiz": ("q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8"),
    "sparse-attention-quiz": ("q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8"),
}


@pytest.mark.parametrize("quiz_id", sorted(REVISED))
def test_changed_items_have_new_revisions(quiz_id: str) -> None:
    quiz = get_quiz(quiz_id)
    assert quiz.revision >= 2
    for item_id in REVISED[quiz_id]:
        assert quiz.item(item_id).revision >= 2, f"{quiz_id} {item_id}: revision not bumped"
