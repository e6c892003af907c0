#!/usr/bin/env bash
# Fill deploy/check/wheelhouse/ with every wheel the image installs, from the package sources
# this machine's pip already uses, so the image builds with `pip install --no-index`: torch is
# the same CPU wheel `make test` installs (`torch==2.13.0` resolves to a local file here), plus
# the project's dependencies and its build backend. The wheels must match the base image's
# Python (cp311: Debian bookworm's python3), hence the venv's Python 3.11 by default. bookworm
# has 3.11.2, where redis also wants async-timeout (python_full_version < 3.11.3): pip on a newer
# 3.11 would not fetch it, so it is named here.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
WHEELHOUSE=$ROOT/deploy/check/wheelhouse
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), f"need Python 3.11 wheels, {sys.executable} is {sys.version}"'
# pip download skips what is already there, so a rerun costs seconds. Its log only on failure.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$PY" -m pip download --dest "$WHEELHOUSE" --only-binary=:all: \
    "torch==${TORCH_VERSION:-2.13.0}" "setuptools>=68" wheel "$ROOT" \
    "async-timeout>=4.0.3" > "$log" 2>&1; then
    cat "$log" >&2
    exit 1
fi
test -n "$(ls "$WHEELHOUSE"/torch-*.whl 2>/dev/null)" || { echo "wheels.sh: no torch wheel" >&2; exit 1; }
echo "wheels.sh: $(ls "$WHEELHOUSE"/*.whl | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1)"
