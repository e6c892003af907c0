#!/usr/bin/env bash
# Restore kgrade's Moodle exports in a real Moodle 4.5 and take each quiz as students
# (docs/moodle.md). Needs the local Moodle of ../shared/tools/moodle (setup.sh); not run in CI.
#
#   benchmarks/moodle/check_mbz.sh [OUTDIR]      # from the project root; default /tmp/kgrade-mbz
#
# For each case: export → Moodle's restore (restore_imscc.php detects a Moodle 2 backup as
# well as a cartridge and restores either into a new course) → attempt_quiz.php (student_all
# answers every question right, student_half the first half) → one summary line per scenario.
# The cartridge of the same quiz is run too, to show the marks Moodle gives it.
set -euo pipefail
M=${MOODLE_TOOLS:-../shared/tools/moodle}
OUT=${1:-/tmp/kgrade-mbz}
PY=.venv/bin/python
mkdir -p "$OUT"

export_case() {  # name quiz format lang
  local name=$1 quiz=$2 fmt=$3 lang=$4 ext=mbz
  [ "$fmt" = imscc ] && ext=imscc
  if [ "$quiz" = fixture ]; then
    # The test fixture: points 1.5, 2, 1, 1; multiple answers and true/false items.
    $PY -c "import sys; from tests.service.export_fixtures import fixture_quiz; \
from service.exports import export_quiz; \
sys.stdout.buffer.write(export_quiz(fixture_quiz(), '$fmt', '$lang').data)" > "$OUT/$name.$ext"
  else
    .venv/bin/kgrade export "$quiz" --format "$fmt" --lang "$lang" -o "$OUT/$name.$ext" --check >&2
  fi
  echo "$OUT/$name.$ext"
}

run_case() {  # name quiz format lang
  local name=$1 file course
  file=$(export_case "$@")
  php "$M/restore_imscc.php" --file="$file" > "$OUT/$name.restore.json" 2> "$OUT/$name.restore.log" || {
    echo "$name: restore failed"; $M/jsonpick.py -f "$OUT/$name.restore.json" exception; return 1; }
  course=$($M/jsonpick.py -f "$OUT/$name.restore.json" course.id)
  php "$M/attempt_quiz.php" --courseid="$course" > "$OUT/$name.attempt.json" 2> /dev/null
  $PY - "$name" "$OUT/$name.restore.json" "$OUT/$name.attempt.json" <<'PYEOF'
import json, sys

def load(path):
    text = open(path, encoding="utf-8").read()
    return json.loads(text.split("===JSON-BEGIN===", 1)[1].split("===JSON-END===", 1)[0])

name, restore, attempt = sys.argv[1], load(sys.argv[2]), load(sys.argv[3])
q = restore["quizzes"][0]
marks = ",".join(f"{s['maxmark']:g}" for s in q["questions"])
s = q["summary"]
print(f"{name}: {restore['detected_format']} course {restore['course']['id']}, "
      f"{s['questions']} questions ({s['answers_with_feedback']}/{s['answers']} answers with "
      f"feedback, {s['with_generalfeedback']} general feedback), marks [{marks}], "
      f"sumgrades {q['sumgrades']:g}, grade {q['grade']:g}; restore messages: {len(restore['messages'])}")
for r in attempt["quizzes"]:
    print(f"  {r['scenario']:>4}: {r['answered_correctly']} right -> marks {r['attempt_marks']:g}, "
          f"grade {r['attempt_grade']:g}/{r['quiz_grade_max']:g}, gradebook {r.get('gradebook_str')}, "
          f"grade_ok {r['grade_ok']}")
PYEOF
}

run_case ring-mbz-all ring-attention-quiz moodle-mbz all
run_case sparse-mbz-en sparse-attention-quiz moodle-mbz en
run_case fixture-mbz-source fixture moodle-mbz source
run_case ring-imscc-all ring-attention-quiz imscc all
