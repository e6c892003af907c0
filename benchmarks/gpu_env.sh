# Sourced (bash) on the GPU machine, which has no package index, from the repository root:
# the service's Python packages from .whl into $WORK/site and redis-server and bwrap from .deb
# (both carried by the device run; see ../shared/tools/device-wheels.sh), on the paths.
# Expects ROOT (the repository root), WORK (a scratch folder) and PY; SKIP_WHEELS=1 skips pip.
if [ "${SKIP_WHEELS:-0}" != 1 ]; then
  # Python packages the GPU image lacks (flask, celery, redis, sqlalchemy, ...), from local wheels.
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" .whl/*.whl
fi
export PYTHONPATH="$WORK/site:$ROOT"
# redis-server and bwrap from the unpacked Debian packages.
for d in .deb/*.deb; do if [ -e "$d" ]; then dpkg -x "$d" "$WORK/deb"; fi; done
export LD_LIBRARY_PATH="$WORK/deb/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$WORK/deb/usr/bin:$PATH"
