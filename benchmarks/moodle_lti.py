"""kgrade inside a real Moodle 4.5, end to end in Chromium; prints what happened and how long.

Not part of CI (it needs the Moodle that ../shared/tools/moodle installs). Set-up, from the
project root (docs/lms.md, "Checked against Moodle 4.5.6"):

    M=../shared/tools/moodle
    MOODLE_GITDIR=/path/to/hrsq1.git $M/setup.sh && $M/serve.sh
    make run &                                   # kgrade on http://127.0.0.1:8000
    php $M/lti_platform.php --tool=http://127.0.0.1:8000 --jwks=/lti/jwks \\
        --deeplink=/lti/launch > /tmp/lti.out    # registers kgrade in Moodle
    .venv/bin/kgrade lti register ...            # Moodle's values, from /tmp/lti.out
    .venv/bin/python benchmarks/moodle_lti.py /tmp/lti.out [--shots docs/screenshots]

Steps, each as its user would in the browser:

1. the teacher adds two External tool activities with Moodle's *Select content* button: kgrade's
   picker (deep linking) places a quiz and a kernel exercise; Moodle makes their grade items;
2. the student opens the quiz in Moodle, takes it in kgrade and submits: the time until Moodle's
   gradebook holds the grade is measured by polling Moodle's database;
3. the student opens the exercise, submits a correct solution, watches it grade (CPU), and the
   grade reaches Moodle;
4. the teacher opens the quiz: kgrade's grade table lists Moodle's roster (NRPS), who has not
   submitted, and that the grade is in the gradebook; Moodle's grader report shows both grades.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUIZ_TITLE = "Ring Attention quiz (kgrade)"
EXERCISE_TITLE = "Merge partial attention (kgrade)"
ROWS: list[tuple[str, str, str]] = []


def row(step: str, result: str, seconds: float | None = None) -> None:
    ROWS.append((step, result, "" if seconds is None else f"{seconds:.2f}"))
    print(
        f"- {step}: {result}" + (f" ({seconds:.2f} s)" if seconds is not None else ""), flush=True
    )


def moodle_sql(query: str) -> list[list[str]]:
    env = dict(os.environ, PGPASSWORD=os.environ.get("MOODLE_DBPASS", "moodle-local-1"))
    out = subprocess.run(
        [
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            os.environ.get("MOODLE_PGPORT", "54410"),
            "-U",
            "moodle",
            "moodle",
            "-tA",
            "-F",
            "\t",
            "-c",
            query,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    return [line.split("\t") for line in out.splitlines() if line]


def grade_in_moodle(course: int, item: str, userid: int) -> tuple[float, float] | None:
    """(grade, maximum) of ``userid`` in the course's grade item ``item``, once there is one."""
    rows = moodle_sql(
        "select gg.finalgrade, gi.grademax from mdl_grade_grades gg "
        "join mdl_grade_items gi on gi.id = gg.itemid "
        f"where gi.courseid = {int(course)} and gi.itemname = '{item}' "
        f"and gg.userid = {int(userid)} and gg.finalgrade is not null "
        "order by gi.id desc limit 1"
    )
    return (float(rows[0][0]), float(rows[0][1])) if rows else None


def wait_grade(course: int, item: str, userid: int, timeout: float) -> tuple[float, float, float]:
    """Poll Moodle's database until the grade is there: (grade, maximum, seconds waited)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        found = grade_in_moodle(course, item, userid)
        if found is not None:
            return found[0], found[1], time.monotonic() - t0
        time.sleep(0.02)
    raise SystemExit(f"no grade for {item!r} in Moodle after {timeout} s")


def shot(page: Any, folder: Path | None, name: str) -> None:
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        page.wait_for_timeout(300)
        page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def login(ctx: Any, www: str, user: dict[str, Any]) -> Any:
    page = ctx.new_page()
    for _ in range(3):  # PHP's built-in server now and then loses the fresh session's token
        page.goto(f"{www}/login/index.php", wait_until="networkidle")
        page.fill("#username", user["username"])
        page.fill("#password", user["password"])
        page.click("#loginbtn")
        page.wait_for_load_state()
        if "/login/" not in page.url:
            return page
    raise SystemExit(f"could not log in to Moodle as {user['username']}")


def add_activity(
    page: Any,
    www: str,
    course: int,
    typeid: int,
    resource: str,
    title: str,
    shots: Path | None,
    shot_name: str | None,
) -> int:
    """Moodle's "Add an activity" form for the kgrade tool, with Select content (deep linking)."""
    page.goto(
        f"{www}/course/modedit.php?add=lti&course={course}&section=0&return=0&typeid={typeid}"
    )
    page.click("#id_selectcontent")
    frame = page.frame_locator(".modal iframe")
    frame.get_by_label("Quiz or kernel exercise").select_option(resource)
    if shot_name:
        page.wait_for_timeout(500)
        shot(page, shots, shot_name)
    frame.get_by_label("Title in the course").fill(title)
    frame.get_by_label("Attempts allowed").fill("3")
    frame.get_by_role("button", name="Add to the course").click()
    # Moodle's return page fills the activity form (name, custom parameters, grade), then closes.
    page.wait_for_function(
        "() => document.getElementById('id_name').value.length > 0", timeout=30000
    )
    page.click("#id_submitbutton2")  # Save and return to course
    page.wait_for_load_state()
    cmid = moodle_sql(
        "select cm.id from mdl_course_modules cm join mdl_lti l on l.id = cm.instance "
        f"join mdl_modules m on m.id = cm.module and m.name = 'lti' where l.name = '{title}' "
        "order by cm.id desc limit 1"
    )
    return int(cmid[0][0])


def tool_frame(page: Any) -> Any:
    """kgrade in Moodle's launch page (embedded), or the page itself (new window)."""
    for _ in range(100):
        for f in page.frames:
            if f.url.startswith("http://127.0.0.1:8000/") and "/lti/" not in f.url:
                return f
        page.wait_for_timeout(100)
    raise SystemExit(
        "kgrade did not open in Moodle's page: " + " ".join(f.url for f in page.frames)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("platform_json", help="the output of lti_platform.php")
    ap.add_argument("--shots", type=Path, default=None, help="save screenshots here")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    text = Path(args.platform_json).read_text()
    cfg = json.loads(text.split("===JSON-BEGIN===", 1)[1].split("===JSON-END===", 1)[0])
    www = cfg["platform_for_tool"]["issuer"]
    course = int(cfg["course"]["id"])
    typeid = int(cfg["tool_type"]["id"])
    teacher, student = cfg["users"]["teacher"], cfg["users"]["student"]
    # As docs/lms.md has the administrator set it: "Default launch container: Embed, without
    # blocks" (lti_platform.php registers the tool to open in a new window).
    moodle_sql(
        f"update mdl_lti_types_config set value = '3' where typeid = {typeid} "
        "and name = 'launchcontainer'"
    )
    # A test site: Moodle's user tours and its course index drawer would cover kgrade's frame
    # in the screenshots.
    moodle_sql("update mdl_tool_usertours_tours set enabled = 0")
    for who in (teacher, student):
        moodle_sql(
            "insert into mdl_user_preferences (userid, name, value) values "
            f"({int(who['id'])}, 'drawer-open-index', '0') "
            "on conflict (userid, name) do update set value = '0'"
        )

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=args.chromium,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        tctx = browser.new_context(viewport={"width": 1280, "height": 1000})
        tpage = login(tctx, www, teacher)
        t0 = time.monotonic()
        quiz_cm = add_activity(
            tpage,
            www,
            course,
            typeid,
            "quiz:ring-attention-quiz",
            QUIZ_TITLE,
            args.shots,
            "moodle-deep-link-picker",
        )
        row(
            "teacher: Select content (deep linking) places the quiz",
            f"activity cmid {quiz_cm}",
            time.monotonic() - t0,
        )
        t0 = time.monotonic()
        ex_cm = add_activity(
            tpage, www, course, typeid, "exercise:attention-merge", EXERCISE_TITLE, None, None
        )
        row(
            "teacher: deep linking places the kernel exercise",
            f"activity cmid {ex_cm}",
            time.monotonic() - t0,
        )
        items = moodle_sql(
            f"select itemname, grademax from mdl_grade_items where courseid = {course} "
            f"and itemname in ('{QUIZ_TITLE}', '{EXERCISE_TITLE}') order by id"
        )
        row("Moodle made the grade items", "; ".join(f"{n}, max {float(m):g}" for n, m in items))

        # The student takes the quiz inside Moodle.
        sctx = browser.new_context(viewport={"width": 1280, "height": 1000})
        spage = login(sctx, www, student)
        spage.goto(f"{www}/mod/lti/view.php?id={quiz_cm}")
        frame = tool_frame(spage)
        frame.get_by_role("button", name="Start attempt 1").wait_for()
        shot(spage, args.shots, "moodle-student-quiz")
        frame.get_by_role("button", name="Start attempt 1").click()
        sys.path.insert(0, str(ROOT))
        from item_bank import get_quiz

        quiz = get_quiz("ring-attention-quiz")
        for n, item in enumerate(quiz.items):
            right = next(o for o in item.options if o.correct)
            frame.get_by_label(right.text.en, exact=True).check()
            frame.get_by_role("button", name="Check answer").click()
            frame.locator(".feedback").wait_for()
            if n == 0:
                shot(spage, args.shots, "moodle-student-feedback")
            if n + 1 < len(quiz.items):
                frame.get_by_role("link", name="Next question").click()
        frame.get_by_role("button", name="Submit attempt 1").click()
        grade, maximum, waited = wait_grade(course, QUIZ_TITLE, student["id"], 60)
        frame.locator("text=Question by question").wait_for()
        row("student: quiz submitted in kgrade", f"all {len(quiz.items)} right")
        row(
            "quiz grade in Moodle's gradebook, from the Submit click",
            f"{grade:g} / {maximum:g}",
            waited,
        )

        # The student's kernel exercise.
        spage.goto(f"{www}/mod/lti/view.php?id={ex_cm}")
        frame = tool_frame(spage)
        frame.locator(".cm-editor").wait_for()
        solution = ROOT / "item_bank/exercises/attention-merge/solutions/correct/stable_fp32.py"
        frame.locator("#file").set_input_files(str(solution))
        frame.locator("#file-loaded").filter(has_text="Loaded").wait_for()
        t0 = time.monotonic()
        frame.get_by_role("button", name="Submit for grading").click()
        frame.locator("#grading-status").wait_for()
        shot(spage, args.shots, "moodle-student-grading")
        frame.locator("#verdict-h").wait_for(timeout=600_000)
        verdict = frame.locator("#verdict-h").inner_text()
        graded = time.monotonic() - t0
        shot(spage, args.shots, "moodle-student-result")
        grade, maximum, waited = wait_grade(course, EXERCISE_TITLE, student["id"], 120)
        row(
            "student: kernel graded by kgrade's CPU worker, seen live",
            " ".join(verdict.split()),
            graded,
        )
        row(
            "exercise grade in Moodle's gradebook, after the page showed the verdict",
            f"{grade:g} / {maximum:g}",
            waited,
        )

        # The teacher: kgrade's grade table, then Moodle's gradebook.
        tpage.goto(f"{www}/mod/lti/view.php?id={quiz_cm}")
        frame = tool_frame(tpage)
        frame.locator("section[aria-labelledby=grades-h]").wait_for()
        table = frame.locator("section[aria-labelledby=grades-h] table").inner_text()
        shot(tpage, args.shots, "moodle-teacher-grades")
        row(
            "teacher: kgrade's grade table",
            " | ".join(line.strip() for line in table.splitlines()[1:] if line.strip()),
        )
        tpage.goto(f"{www}/grade/report/grader/index.php?id={course}")
        tpage.wait_for_load_state()
        shot(tpage, args.shots, "moodle-gradebook")
        tpage.locator("table#user-grades").wait_for()
        grades = moodle_sql(
            "select gi.itemname, gg.finalgrade, gi.grademax from mdl_grade_grades gg "
            "join mdl_grade_items gi on gi.id = gg.itemid "
            f"where gi.courseid = {course} and gg.userid = {int(student['id'])} "
            "and gi.itemtype = 'mod' order by gi.id"
        )
        row(
            "Moodle's gradebook (grader report), the student",
            "; ".join(f"{n}: {float(g):g} / {float(m):g}" for n, g, m in grades if g),
        )
        browser.close()

    print("\n| step | result | seconds |\n|---|---|---|")
    for step, result, sec in ROWS:
        print(f"| {step} | {result} | {sec} |")


if __name__ == "__main__":
    main()
