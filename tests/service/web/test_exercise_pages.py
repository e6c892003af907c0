"""A student's kernel exercise in the browser, graded by a real Celery worker: the statement
(Markdown, math, highlighted code), the starter download, the editor and file upload, the
grading's progress seen live, then the verdict explained, tests, timings with their chart, the
leaderboard and past submissions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.service.web.conftest import WIDE, Site, check_page, sign_in, watch, watch_progress
from workers.exercises import load_exercise
from workers.verdicts import Verdict

pytestmark = [pytest.mark.redis, pytest.mark.slow]
EXERCISE = "attention-merge"


def test_statement_editor_upload_live_progress_and_result(
    chromium: Any, site: Site, grading: Path, tmp_path: Path
) -> None:
    ex = load_exercise(EXERCISE)
    context = chromium.new_context(viewport=WIDE, accept_downloads=True)
    page = sign_in(context, site, site.token("student", "kernel-student"))
    seen = watch(page)
    page.get_by_role("link", name=ex.title).first.click()
    page.wait_for_url(f"**/exercise/{EXERCISE}")
    assert page.locator("h1").inner_text() == ex.title
    assert page.locator(".statement h1").count() == 0  # the statement's own title is the page's
    page.locator(".statement .katex").first.wait_for()  # math rendered by KaTeX
    assert page.locator(".statement pre code .k").count() > 0  # code highlighted
    page.locator(".cm-editor").wait_for()  # the editor replaced the textarea
    assert page.locator("#source").is_hidden()
    check_page(page, "student-exercise")

    with page.expect_download() as download:
        page.get_by_role("link", name="Download the starter file").click()
    saved = tmp_path / "starter.py"
    download.value.save_as(saved)
    assert download.value.suggested_filename == "attention_merge.py"
    assert saved.read_text() == ex.starter.read_text()

    # Upload a correct solution: it lands in the editor, which is what gets graded.
    correct = next(s for s in ex.solutions() if s.expected is Verdict.PASS)
    page.set_input_files("#file", str(correct.path))
    page.wait_for_function(
        "src => document.getElementById('source').value === src", arg=correct.path.read_text()
    )
    page.get_by_role("button", name="Submit for grading").click()
    page.wait_for_url("**/submissions/*")
    assert page.locator("#grading-status").is_visible()
    check_page(page, "student-submission-grading")
    phases = watch_progress(page, 300)
    assert phases, "the page never showed a progress line"
    assert len(set(phases)) >= 2, phases  # it moved while we watched
    # on failure the page's text and the worker's log: what tells a flake from a bug in CI
    verdict = page.locator("#verdict-h").inner_text()
    assert "Passed" in verdict, (page.locator("main").inner_text(), grading.read_text()[-4000:])
    main = page.inner_text("main")
    assert "What to try" in main and "Tests" in main and "Timings per shape" in main
    assert page.evaluate(
        "() => !!(window.Chart && Chart.getChart(document.getElementById('timings-chart')))"
    )
    check_page(page, "student-submission-result")

    # Now a wrong answer typed in the editor: its verdict in plain language.
    page.get_by_role("link", name="Back to the exercise and its leaderboard").click()
    page.locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.type(
        "import torch\n\ndef merge_attention(out_a, lse_a, out_b, lse_b):\n"
        "return out_a.clone(), lse_a.clone()\n"
    )
    page.get_by_role("button", name="Submit for grading").click()
    page.wait_for_url("**/submissions/*")
    watch_progress(page, 300)
    verdict = page.locator("#verdict-h").inner_text()
    assert "Wrong answer" in verdict, verdict
    assert "differ from the reference" in page.inner_text("main")
    # Both submissions in the history; the leaderboard has this student's passing run.
    page.get_by_role("link", name="Back to the exercise and its leaderboard").click()
    history = page.locator("section[aria-labelledby=history-h]").inner_text()
    assert "PASS" in history and "WRONG_ANSWER" in history
    board = page.locator("aside").inner_text()
    assert "kernel-student (you)" in board or "No passing, timed submission yet" in board
    assert not seen.errors, seen.errors
    context.close()
