"""kgrade inside an LMS iframe in Chromium: a platform page on another site embeds the tool
(served over TLS) and launches it by OIDC login initiation. With the tool's cookies allowed;
with them blocked in the frame (the platform keeps state and nonce by postMessage, the session
rides in the URL); and blocked with no platform storage (the new-window fallback)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from item_bank import get_quiz
from service.core import assignments
from service.db import write_intent
from service.extensions import db
from tests.service.lti.conftest import register_platform
from tests.service.lti.platform import DL, INSTRUCTOR, LEARNER, FakePlatform
from tests.service.web.conftest import CHROMIUM_ARGS, Server, check_page, make_site_app, watch

QUIZ = "ring-attention-quiz"


class Lms:
    def __init__(self, tmp: Path) -> None:
        self.app = make_site_app(tmp)
        self.tool = Server(self.app, ssl=True)
        self.platform = FakePlatform(tool_jwks_url=f"{self.tool.url}/lti/jwks")
        register_platform(self.app, self.platform)

    def stop(self) -> None:
        self.platform.stop()
        self.tool.stop()

    def assignment(self, resource: str) -> str:
        """An assignment made as deep linking would (its id goes in the link's custom)."""
        from service.core import people

        with self.app.app_context(), write_intent():
            course = people.lti_course(
                db.session, issuer=self.platform.issuer, context_id="ctx-1", title=None, label=None
            )
            spec = assignments.parse_spec(db.session, {"resource": resource, "attempts": "3"})
            a = assignments.create(db.session, course.id, spec, None)
            db.session.commit()
            return a.id

    def course_url(self, storage: bool = False, frame: str = "900x700", **hint: Any) -> str:
        """The LMS course page embedding the tool in a ``frame``-sized iframe; ``hint`` becomes
        the launch's claims (the fake platform's login hint). Each assignment gets a link of
        its own (a link, once launched, stays bound to its assignment)."""
        aid = (hint.get("custom") or {}).get("kgrade_assignment")
        if aid:
            hint.setdefault("resource_link", f"rl-{aid}")
        page = (
            f"{self.platform.url}/course?tool={quote(self.tool.url)}&hint={quote(json.dumps(hint))}"
        )
        return page + f"&frame={frame}" + ("&storage=1" if storage else "")


@pytest.fixture(scope="module")
def lms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lms]:
    world = Lms(tmp_path_factory.mktemp("lms"))
    try:
        yield world
    finally:
        world.stop()


@contextmanager
def _browser(
    playwright: Any,
    chromium_path: str,
    lms: Lms,
    cookies: str,
    tmp: Path,
    viewport: dict[str, int] | None = None,
) -> Iterator[Any]:
    """A browser whose cookie settings are ``cookies``: ``allowed``; ``third-party-blocked``
    (Chromium's own setting: partitioned cookies are still kept); ``tool-blocked`` (a
    site exception refusing the tool's cookies when embedded in the LMS: partitioned ones too,
    as some browsers do). Set as a user would, in the profile's preferences."""
    profile: dict[str, Any] = {}
    if cookies != "allowed":
        profile = {"block_third_party_cookies": True, "cookie_controls_mode": 1}
    if cookies == "tool-blocked":
        tool, lms_site = lms.tool.url, lms.platform.url
        profile["content_settings"] = {
            "exceptions": {"cookies": {f"{tool},{lms_site}": {"setting": 2}}}
        }
    folder = tmp / f"profile-{cookies}"
    (folder / "Default").mkdir(parents=True, exist_ok=True)
    (folder / "Default" / "Preferences").write_text(json.dumps({"profile": profile}))
    ctx = playwright.chromium.launch_persistent_context(
        str(folder),
        executable_path=chromium_path,
        headless=True,
        ignore_https_errors=True,
        viewport=viewport or {"width": 1100, "height": 900},
        args=CHROMIUM_ARGS,
    )
    try:
        yield ctx
    finally:
        ctx.close()


def _take_quiz_in(frame: Any) -> None:
    quiz = get_quiz(QUIZ)
    frame.get_by_role("button", name="Start attempt 1").click()
    item = quiz.items[0]
    right = next(o for o in item.options if o.correct)
    frame.get_by_label(right.text.en, exact=True).check()
    frame.get_by_role("button", name="Check answer").click()
    frame.locator(".feedback.right").wait_for()
    frame.get_by_role("button", name="Submit attempt 1").click()
    frame.locator("text=Question by question").wait_for()


@pytest.mark.parametrize(
    ("cookies", "in_url"),
    [("allowed", False), ("third-party-blocked", False), ("tool-blocked", True)],
)
def test_student_launch_quiz_and_grade_inside_the_lms_frame(
    playwright: Any, chromium_path: str, lms: Lms, tmp_path: Path, cookies: str, in_url: bool
) -> None:
    aid = lms.assignment(f"quiz:{QUIZ}")
    sub = f"frame-{cookies}"
    before = len(lms.platform.scores)
    with _browser(playwright, chromium_path, lms, cookies, tmp_path) as ctx:
        page = ctx.new_page()
        seen = watch(page)
        page.goto(
            lms.course_url(
                storage=True,
                sub=sub,
                roles=[LEARNER],
                custom={"kgrade_assignment": aid},
                lineitem=f"{lms.platform.url}/lineitems/1",
            )
        )
        frame = page.frame_locator("#tool")
        frame.get_by_role("button", name="Start attempt 1").wait_for()
        tool_frame = next(f for f in page.frames if f.url.startswith(lms.tool.url))
        # Only when the browser refuses even partitioned cookies does the session ride in the
        # URL (the platform kept state and nonce by postMessage).
        assert ("kgs=" in tool_frame.url) == in_url, tool_frame.url
        check_page(tool_frame, f"lti-frame-quiz-{cookies}", width_of=page)
        _take_quiz_in(frame)
        assert not seen.errors, seen.errors
    assert len(lms.platform.scores) == before + 1
    score = lms.platform.scores[-1]
    assert score["userId"] == sub and score["gradingProgress"] == "FullyGraded"
    assert score["scoreGiven"] == get_quiz(QUIZ).items[0].points


def test_refused_cookies_without_platform_storage_offer_a_new_window(
    playwright: Any, chromium_path: str, lms: Lms, tmp_path: Path
) -> None:
    aid = lms.assignment(f"quiz:{QUIZ}")
    with _browser(playwright, chromium_path, lms, "tool-blocked", tmp_path) as ctx:
        page = ctx.new_page()
        page.goto(
            lms.course_url(sub="frame-nw", roles=[LEARNER], custom={"kgrade_assignment": aid})
        )
        frame = page.frame_locator("#tool")
        link = frame.get_by_role("link", name="Open kgrade in a new window")
        link.wait_for()
        tool_frame = next(f for f in page.frames if f.url.startswith(lms.tool.url))
        check_page(tool_frame, "lti-frame-new-window", width_of=page)
        with ctx.expect_page() as popup_info:
            link.click()
        popup = popup_info.value
        popup.get_by_role("button", name="Start attempt 1").wait_for()
        assert "kgs=" not in popup.url  # first-party: the cookie carries the session


def test_instructor_deep_links_from_the_lms_frame(
    playwright: Any, chromium_path: str, lms: Lms, tmp_path: Path
) -> None:
    before = len(lms.platform.deep_link_returns)
    with _browser(playwright, chromium_path, lms, "allowed", tmp_path) as ctx:
        page = ctx.new_page()
        page.goto(
            lms.course_url(
                sub="teacher-1", roles=[INSTRUCTOR], message_type="LtiDeepLinkingRequest"
            )
        )
        frame = page.frame_locator("#tool")
        frame.get_by_label("Quiz or kernel exercise").select_option("exercise:nsa-attention")
        tool_frame = next(f for f in page.frames if f.url.startswith(lms.tool.url))
        check_page(tool_frame, "lti-frame-deep-link-picker", width_of=page)
        frame.get_by_label("Title in the course").fill("NSA forward kernel")
        frame.get_by_role("button", name="Add to the course").click()
        frame.locator("text=content added").wait_for()
    assert len(lms.platform.deep_link_returns) == before + 1
    claims = lms.platform.verify_tool_jwt(lms.platform.deep_link_returns[-1], lms.platform.issuer)
    (item,) = claims[DL + "content_items"]
    assert item["title"] == "NSA forward kernel" and item["lineItem"]["scoreMaximum"] == 100.0


def test_phone_sized_frame(playwright: Any, chromium_path: str, lms: Lms, tmp_path: Path) -> None:
    aid = lms.assignment("exercise:attention-merge")
    with _browser(
        playwright, chromium_path, lms, "allowed", tmp_path, viewport={"width": 400, "height": 800}
    ) as ctx:
        page = ctx.new_page()
        page.goto(
            lms.course_url(
                sub="phone-1", roles=[LEARNER], custom={"kgrade_assignment": aid}, frame="360x740"
            )
        )
        frame = page.frame_locator("#tool")
        frame.get_by_role("button", name="Submit for grading").wait_for()
        tool_frame = next(f for f in page.frames if f.url.startswith(lms.tool.url))
        check_page(tool_frame, "lti-frame-exercise-phone", width_of=page)
