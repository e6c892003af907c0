"""A student takes a quiz in the browser: one item at a time and all on one page, feedback on
each answer at once, the language switch, submit, score and review. No answer key, feedback or
explanation reaches the browser before the item is answered."""

from __future__ import annotations

from typing import Any

import pytest

from item_bank import get_quiz
from tests.service.web.conftest import PHONE, WIDE, Site, check_page, sign_in, watch

QUIZ = "ring-attention-quiz"


def _quiz() -> Any:
    return get_quiz(QUIZ)


def _secrets(item: Any) -> list[str]:
    """Texts only the key shows: the explanation and every option's feedback, both languages."""
    out = []
    for text in [item.explanation, *(o.feedback for o in item.options if o.feedback)]:
        out += [v for v in text.variants().values() if len(v) > 30]
    return out


@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["wide", "phone"])
def test_one_at_a_time_with_feedback_language_and_review(
    chromium: Any, site: Site, viewport: dict[str, int]
) -> None:
    quiz = _quiz()
    name = f"stu-{viewport['width']}"
    context = chromium.new_context(viewport=viewport)
    page = sign_in(context, site, site.token("student", name))
    seen = watch(page)
    wide = viewport is WIDE
    if wide:
        check_page(page, "student-home")
    page.get_by_role("link", name=quiz.title.en).first.click()
    page.wait_for_url("**/quiz/" + QUIZ)
    if wide:
        check_page(page, "student-quiz")
    page.get_by_role("button", name="Start attempt 1").click()
    page.wait_for_url("**/attempts/**")
    first, second = quiz.items[0], quiz.items[1]
    # Before any answer: nothing of the key in any page or request so far.
    for secret in _secrets(first) + _secrets(second):
        assert secret not in seen.text(), f"leaked before answering: {secret[:60]}"
    if wide:
        check_page(page, "student-attempt-question")
    # Answer the first question (wrongly, on purpose) without leaving the page.
    wrong = next(o for o in first.options if not o.correct)
    page.get_by_label(wrong.text.en, exact=True).check()
    page.get_by_role("button", name="Check answer").click()
    feedback = page.locator(".feedback")
    feedback.wait_for()
    assert "Not right" in feedback.inner_text()
    assert first.explanation.en[:40] in feedback.inner_text()
    if wrong.feedback:
        assert wrong.feedback.en[:40] in feedback.inner_text()
    assert page.locator(".answered-count").first.inner_text() == f"1 of {len(quiz.items)}"
    if wide:
        check_page(page, "student-attempt-feedback")
    # The second question's key is still nowhere, even after the first was answered.
    for secret in _secrets(second):
        assert secret not in seen.text(), f"leaked early: {secret[:60]}"
    # The language switch shows the course's own wording.
    page.get_by_role("link", name="Next question").click()
    page.get_by_role("navigation", name="Language").get_by_role("link", name="Shona").click()
    assert second.prompt.source_form(quiz.source_lang)[1][:30] in page.inner_text("main")
    page.get_by_role("navigation", name="Language").get_by_role("link", name="English").click()
    assert second.prompt.en[:30] in page.inner_text("main")
    right = next(o for o in second.options if o.correct)
    page.get_by_label(right.text.en, exact=True).check()
    page.get_by_role("button", name="Check answer").click()
    page.locator(".feedback.right").wait_for()
    # Submit: the score and the review, question by question.
    page.get_by_role("button", name="Submit attempt 1").click()
    page.wait_for_selector("text=Question by question")
    body = page.inner_text("main")
    points = second.points
    assert f"{points:g} / {quiz.points_possible:g}" in body
    if wide:
        check_page(page, "student-attempt-review")
    page.get_by_role("link", name=quiz.title.en).first.click()
    landing = page.inner_text("main")
    allowed = quiz.settings.allowed_attempts
    if allowed:
        assert f"{allowed - 1} left" in landing
    assert not seen.errors, seen.errors
    context.close()


def test_all_on_one_page(chromium: Any, site: Site) -> None:
    quiz = _quiz()
    context = chromium.new_context(viewport=WIDE)
    page = sign_in(context, site, site.token("student", "all-on-one"))
    seen = watch(page)
    page.goto(f"{site.url}/quiz/{QUIZ}")
    page.get_by_label("all on one page").check()
    page.get_by_role("button", name="Start attempt 1").click()
    sections = page.locator("section.item")
    assert sections.count() == len(quiz.items)
    for secret in [s for it in quiz.items for s in _secrets(it)]:
        assert secret not in seen.text()
    # Answer the third question first: only its section changes, in place.
    third = quiz.items[2]
    right = next(o for o in third.options if o.correct)
    section = page.locator(f"#item-{third.id}")
    section.get_by_label(right.text.en, exact=True).check()
    section.get_by_role("button", name="Check answer").click()
    page.locator(f"#item-{third.id} .feedback").wait_for()
    assert third.explanation.en[:40] in page.locator(f"#item-{third.id}").inner_text()
    assert page.url.endswith("view=all")  # no reload
    for secret in _secrets(quiz.items[0]):
        assert secret not in seen.text()
    # Checking with nothing chosen names the problem, in place.
    first = page.locator(f"#item-{quiz.items[0].id}")
    first.get_by_role("button", name="Check answer").click()
    first.locator(".error").wait_for()
    assert "choose an answer" in first.inner_text()
    check_page(page, "student-attempt-all")
    # The refused check is a 422 the page shows; nothing else failed.
    assert [e for e in seen.errors if "422" not in e] == [], seen.errors
    context.close()


def test_without_javascript_the_forms_still_work(chromium: Any, site: Site) -> None:
    quiz = _quiz()
    context = chromium.new_context(viewport=WIDE, java_script_enabled=False)
    page = sign_in(context, site, site.token("student", "no-js"))
    page.goto(f"{site.url}/quiz/{QUIZ}")
    page.get_by_role("button", name="Start attempt 1").click()
    first = quiz.items[0]
    right = next(o for o in first.options if o.correct)
    page.get_by_label(right.text.en, exact=True).check()
    page.get_by_role("button", name="Check answer").click()
    page.locator(".feedback.right").wait_for()
    assert first.explanation.en[:40] in page.inner_text("main")
    context.close()
