# Sourced (bash) on the GPU machine, which has no package index, from the repository root:
# the service's Python packages from .whl into $WORK/site and redis-server and bwrap from .deb
# (both carried by the device run; see ../shared/tools/device-wheels.sh), on the paths.
# Expects ROOT (the repository root), WORK (a scratch folder) and PY; SKIP_WHEELS=1 skips pip,
# as does a $WORK/site that already holds these wheels (its stamp lists them), so the files of
# one run in one WORK install once.
stamp="$WORK/site/.kgrade-wheels"
if [ "${SKIP_WHEELS:-0}" != 1 ] && ! ls .whl 2>/dev/null | cmp -s - "$stamp"; then
  # Python packages the GPU image lacks (flask, celery, redis, sqlalchemy, ...), from local wheels.
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" .whl/*.whl &&
    ls .whl >"$stamp"
fi
export PYTHONPATH="$WORK/site:$ROOT"
# redis-server and bwrap from the unpacked Debian packages.
for d in .deb/*.deb; do if [ -e "$d" ]; then dpkg -x "$d" "$WORK/deb"; fi; done
export LD_LIBRARY_PATH="$WORK/deb/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$WORK/deb/usr/bin:$PATH"
# Fail here, not at the API's boot minutes later ("the API did not come up", run 28's first
# call): .whl must hold every dependency in pyproject.toml, which device-wheels.sh's default list
# does not (flask-limiter, prometheus-client, pylti1p3next, pyjwt, markdown-it-py, psycopg...).
if ! "$PY" -c "import service, service.extensions, service.lti, service.metrics, workers.tasks" \
  2>"$WORK/import-check.log"; then
  tail -3 "$WORK/import-check.log" >&2
  echo "gpu_env: the service's packages are incomplete; on the development machine run" \
    "benchmarks/device_wheels.sh and carry .whl and .deb again" >&2
  exit 3
fi
