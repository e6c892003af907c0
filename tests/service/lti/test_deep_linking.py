"""Deep Linking 2.0: the instructor's pick goes back signed, with a line item; its first launch
binds the assignment; a copied course gets a copy; a bare link is set up once."""

from __future__ import annotations

import re

from sqlalchemy import select

from service.db.courses import Assignment, Course
from service.extensions import db
from tests.service.conftest import table_snapshot
from tests.service.lti.conftest import TOOL, LtiWorld, content_item, text
from tests.service.lti.platform import DL, INSTRUCTOR, LEARNER, L


def test_deep_link_returns_a_signed_resource_link_with_a_line_item(lti: LtiWorld) -> None:
    b = lti.browser()
    page = b.launch(sub="t1", roles=[INSTRUCTOR], message_type="LtiDeepLinkingRequest")
    html = page.get_data(as_text=True)
    assert "quiz:quiz-a" in html and "exercise:attention-merge" in html  # the catalogue
    r = b.post_form(
        b.page_url.split("?")[0],
        html,
        {
            "action": "add",
            "resource": "quiz:quiz-a",
            "title": "Week 3 quiz",
            "attempts": "3",
            "policy": "last",
            "due_at": "2026-12-24T23:59",
            "lang": "source",
        },
    )
    assert r.status_code == 200
    body = r.get_data(as_text=True)
    form = re.search(r'<form method="post" action="([^"]+)" data-autosubmit>', body)
    assert form and form.group(1) == f"{lti.platform.url}/dl-return"
    jwt_value = re.search(r'name="JWT" value="([^"]+)"', body).group(1)
    claims = lti.platform.verify_tool_jwt(jwt_value, lti.platform.issuer)
    assert claims["iss"] == lti.platform.client_id
    assert claims["nonce"] and claims["exp"] > claims["iat"]
    assert claims[L + "deployment_id"] == lti.platform.deployment_id
    assert claims[L + "message_type"] == "LtiDeepLinkingResponse"
    assert claims[L + "version"] == "1.3.0"
    assert claims[DL + "data"] == "opaque-platform-data"
    item = content_item(claims)
    assert item["type"] == "ltiResourceLink" and item["title"] == "Week 3 quiz"
    assert item["url"] == f"{TOOL}/lti/launch"
    with lti.app.app_context():
        a = db.session.execute(select(Assignment)).scalar_one()
        assert (a.kind, a.resource_id, a.allowed_attempts, a.policy, a.lang) == (
            "quiz",
            "quiz-a",
            3,
            "last",
            "source",
        )
        assert a.due_at is not None and a.due_at.isoformat().startswith("2026-12-24T23:59")
        assert a.score_maximum == 6.0 and a.resource_link_id is None
        assert item["lineItem"] == {
            "scoreMaximum": 6.0,
            "label": "Week 3 quiz",
            "resourceId": a.line_item_resource_id,
            "tag": "kgrade",
        }
        assert item["custom"]["kgrade_assignment"] == a.id
        assert item["submission"]["endDateTime"].startswith("2026-12-24T23:59")


def test_cancel_returns_no_items_and_a_learner_cannot_deep_link(lti: LtiWorld) -> None:
    b = lti.browser()
    page = b.launch(sub="t1", roles=[INSTRUCTOR], message_type="LtiDeepLinkingRequest")
    r = b.post_form(b.page_url.split("?")[0], page.get_data(as_text=True), {"action": "cancel"})
    jwt_value = re.search(r'name="JWT" value="([^"]+)"', r.get_data(as_text=True)).group(1)
    claims = lti.platform.verify_tool_jwt(jwt_value, lti.platform.issuer)
    assert claims[DL + "content_items"] == []
    learner = lti.browser()
    state, nonce = learner.start()
    token = lti.platform.id_token(nonce, roles=[LEARNER], message_type="LtiDeepLinkingRequest")
    refused = learner.post_launch(token, state)
    assert refused.status_code == 400 and "only instructors" in text(refused)


def test_bad_pick_names_the_field_and_stores_nothing(lti: LtiWorld) -> None:
    b = lti.browser()
    page = b.launch(sub="t1", roles=[INSTRUCTOR], message_type="LtiDeepLinkingRequest")
    before = table_snapshot(lti.app)["assignments"]
    for form, field in (
        ({"resource": "quiz:no-such-quiz"}, "unknown quiz"),
        ({"resource": "quiz:quiz-a", "attempts": "0"}, "between 1 and 100"),
        ({"resource": "quiz:quiz-a", "policy": "median"}, "policy"),
        ({"resource": "quiz:quiz-a", "due_at": "next tuesday"}, "date and time"),
        ({"resource": "cake:quiz-a"}, "neither a quiz nor an exercise"),
    ):
        r = b.post_form(
            b.page_url.split("?")[0], page.get_data(as_text=True), {"action": "add", **form}
        )
        assert r.status_code == 422, (form, r.status_code)
        assert field in text(r)
    assert table_snapshot(lti.app)["assignments"] == before


def test_first_launch_binds_the_link_and_a_copied_course_gets_a_copy(lti: LtiWorld) -> None:
    claims = lti.deep_link(lti.browser(), resource="quiz:quiz-b", title="Practice")
    aid = content_item(claims)["custom"]["kgrade_assignment"]
    custom = {"kgrade_assignment": aid, "kgrade_due": "$ResourceLink.submission.endDateTime"}
    _, page = lti.student("s1", resource_link="rl-9", custom=custom)
    assert page.status_code == 200 and "Practice" in text(page) and "Start attempt 1" in text(page)
    # The LMS copied the course: same custom parameter, new context and link.
    _, copied = lti.student("s2", context="ctx-2", resource_link="rl-copy", custom=custom)
    assert "Practice" in text(copied)
    with lti.app.app_context():
        rows = (
            db.session.execute(select(Assignment).order_by(Assignment.created_at)).scalars().all()
        )
        assert len(rows) == 2
        original, copy = rows
        assert original.id == aid and original.resource_link_id == "rl-9"
        assert copy.copied_from == aid and copy.resource_link_id == "rl-copy"
        courses = {c.id: c.context_id for c in db.session.execute(select(Course)).scalars()}
        assert courses[original.course_id] == "ctx-1" and courses[copy.course_id] == "ctx-2"


def test_a_due_date_the_platform_sends_is_used(lti: LtiWorld) -> None:
    claims = lti.deep_link(lti.browser(), resource="quiz:quiz-b")
    aid = content_item(claims)["custom"]["kgrade_assignment"]
    lti.student("s1", custom={"kgrade_assignment": aid, "kgrade_due": "2027-01-05T12:00:00Z"})
    with lti.app.app_context():
        a = db.session.get(Assignment, aid)
        assert a.due_at.isoformat() == "2027-01-05T12:00:00+00:00"


def test_a_bare_link_is_set_up_once_by_the_instructor(lti: LtiWorld) -> None:
    student, page = lti.student("s1", resource_link="bare-1")
    assert "not set up yet" in text(page)
    teacher = lti.browser()
    setup = teacher.launch(
        sub="t1",
        roles=[INSTRUCTOR],
        resource_link="bare-1",
        lineitem=f"{lti.platform.url}/lineitems/1",
    )
    assert "What should this link deliver?" in text(setup)
    r = teacher.post_form(
        teacher.page_url.split("?")[0],
        setup.get_data(as_text=True),
        {"resource": "exercise:attention-merge", "title": "Merge"},
    )
    assert r.status_code == 303
    with lti.app.app_context():
        a = db.session.execute(select(Assignment)).scalar_one()
        assert a.resource_link_id == "bare-1" and a.kind == "exercise"
        assert a.lineitem_url == f"{lti.platform.url}/lineitems/1"
    _, again = lti.student("s1", resource_link="bare-1")
    assert "Merging partial attention results" in text(again) or "Merge" in text(again)
    assert "Submit for grading" in text(again)
