"""An instructor in the browser: the course's assignments, adding one, the grade table (roster,
best and last, submitted or not) with CSV, one student's attempt in detail, regrading, the LMS
export buttons, and the exercise's known solutions graded by a real worker."""

from __future__ import annotations

import csv
import io
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest

from item_bank import get_quiz
from tests.service.web.conftest import PHONE, WIDE, Site, check_page, sign_in, watch, watch_progress

QUIZ = "sparse-attention-quiz"


def _take(context: Any, site: Site, token: str, title: str, right: bool) -> None:
    quiz = get_quiz(QUIZ)
    page = sign_in(context, site, token)
    page.get_by_role("link", name=title).click()
    page.get_by_role("button", name="Start attempt 1").click()
    for n, item in enumerate(quiz.items[:3]):
        pick = [o for o in item.options if o.correct == right][:1]
        page.goto(re.sub(r"item=\d+", "", page.url) + f"&item={n}")
        page.get_by_label(pick[0].text.en, exact=True).check()
        page.get_by_role("button", name="Check answer").click()
        page.locator(".feedback").wait_for()
    page.get_by_role("button", name="Submit attempt 1").click()
    page.wait_for_selector("text=Question by question")
    page.close()


@pytest.mark.redis
@pytest.mark.slow
def test_course_grades_detail_exports_and_known_solutions(
    chromium: Any, site: Site, grading: Path, tmp_path: Path
) -> None:
    quiz = get_quiz(QUIZ)
    ctx = chromium.new_context(viewport=WIDE, accept_downloads=True)
    page = sign_in(ctx, site, site.token("instructor", "prof-web"))
    seen = watch(page)
    check_page(page, "instructor-home")
    page.get_by_role("link", name="Course", exact=True).click()
    check_page(page, "instructor-course")
    # Add an assignment on the stand-alone course page.
    page.get_by_label("Quiz or kernel exercise").select_option(f"quiz:{QUIZ}")
    page.get_by_label("Title in the course").fill("Week 4: sparse attention")
    page.get_by_label("Attempts allowed").fill("2")
    page.get_by_label("the last one").check()
    page.get_by_role("button", name="Add the assignment").click()
    page.wait_for_url("**/a/*")
    assignment_url = page.url
    assert "Week 4: sparse attention" in page.inner_text("h1")
    # Two students: one submits, one does not (yet).
    students = [("ana", True), ("ben", None)]
    tokens = {name: site.token("student", name) for name, _ in students}
    stu_ctx = chromium.new_context(viewport=WIDE)
    _take(stu_ctx, site, tokens["ana"], "Week 4: sparse attention", right=True)
    stu_ctx.close()
    page.goto(assignment_url)
    table = page.locator("section[aria-labelledby=grades-h] table").inner_text()
    assert "ana" in table and "ben" in table and "not yet" in table
    assert "3 / 8" in table or "/ " in table
    check_page(page, "instructor-grades")
    # CSV download.
    with page.expect_download() as d:
        page.get_by_role("link", name="Download CSV").click()
    rows = list(csv.DictReader(io.StringIO(Path(d.value.path()).read_text())))
    by_name = {r["student"]: r for r in rows}
    assert by_name["ana"]["submitted"] == "yes" and by_name["ben"]["submitted"] == "no"
    points = sum(it.points for it in quiz.items[:3])
    assert float(by_name["ana"]["grade"]) == points
    # One student's work, then the attempt in detail (answers with the key).
    page.get_by_role("link", name="ana").click()
    check_page(page, "instructor-student-work")
    page.get_by_role("link", name="1", exact=True).click()
    page.wait_for_selector("text=Question by question")
    assert "by ana" in page.inner_text("h1")
    check_page(page, "instructor-attempt-detail")
    # Regrade against the current key: nothing changed, and it says so.
    page.goto(assignment_url)
    page.get_by_role("button", name="Regrade against the current key").click()
    assert "Regraded 1 attempt(s): 0 changed." in page.inner_text("main")
    # The LMS export buttons give the files kgrade export gives.
    with page.expect_download() as d:
        page.get_by_role("link", name="Canvas (QTI 1.2)").click()
    assert zipfile.is_zipfile(d.value.path())
    with page.expect_download() as d:
        page.get_by_role("link", name="Moodle question bank (Moodle XML)").click()
    assert Path(d.value.path()).read_text().lstrip().startswith("<?xml")
    # The phone-sized frame: the table scrolls inside its box, the page does not.
    phone = ctx.new_page()
    phone.set_viewport_size(PHONE)
    phone.goto(assignment_url)
    check_page(phone, "instructor-grades-phone")
    phone.close()
    # Known solutions: grade one, see the verdict it should have.
    page.goto(site.url + "/exercise/attention-merge/solutions")
    check_page(page, "instructor-solutions")
    row = page.locator("tr", has=page.locator("code", has_text="wrong/zeros"))
    row.get_by_role("button").click()
    page.wait_for_url("**/submissions/*")
    watch_progress(page, 300)
    assert "WRONG_ANSWER" in page.inner_text("#verdict-h")
    assert "Source" in page.inner_text("main") and "Regrade this source" in page.inner_text("main")
    check_page(page, "instructor-submission-detail")
    page.goto(site.url + "/exercise/attention-merge/solutions")
    graded = page.locator("tr", has=page.locator("code", has_text="wrong/zeros")).inner_text()
    assert "WRONG_ANSWER" in graded and "yes" in graded
    assert not seen.errors, seen.errors
    ctx.close()
