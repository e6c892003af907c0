#!/bin/bash
# The whole grading pipeline once, for real, on a GPU machine without a package index:
# Redis (unpacked Debian package) + the API under gunicorn (SQLite) + one Celery worker on the
# `gpu` queue (-c 1, one GPU) + benchmarks/pipeline_gpu.py submitting every known solution of
# every exercise over HTTP and grading our own reference 5 times.
#
# Needs, in the repository root (the device run's `carry` list): .whl (from
#   `DEB=1 ../shared/tools/device-wheels.sh`) and .deb (redis-server, its libraries, bubblewrap).
# Usage: benchmarks/pipeline_gpu.sh [pipeline_gpu.py options]; writes logs and a JSON report to
# $OUT (or /tmp/kgrade-pipeline/out).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${KGRADE_PIPELINE_DIR:-/tmp/kgrade-pipeline}
OUT=${OUT:-$WORK/out}
rm -rf "$WORK/var" "$WORK/redis"; mkdir -p "$WORK/var" "$WORK/redis" "$OUT"

# Python packages the GPU image lacks (flask, celery, redis, sqlalchemy, ...), from local wheels.
python3 -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" .whl/*.whl
export PYTHONPATH="$WORK/site:$ROOT"
# redis-server and bwrap from the unpacked Debian packages.
for d in .deb/*.deb; do dpkg -x "$d" "$WORK/deb"; done
export LD_LIBRARY_PATH="$WORK/deb/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$WORK/deb/usr/bin:$PATH"

REDIS_PORT=${REDIS_PORT:-6391}
API_PORT=${API_PORT:-8011}
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
export DATABASE_URL="sqlite:///$WORK/var/kgrade.sqlite3"
export KGRADE_VAR_DIR="$WORK/var"
export KGRADE_GRADE_DEVICE=cuda
export KGRADE_GPUS=${KGRADE_GPUS:-0}
export KGRADE_IMPORT_BANK=0

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 2
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  cp -f "$WORK"/*.log "$OUT"/ 2>/dev/null || true
}
trap cleanup EXIT

echo "== versions"
python3 -c 'import sys, torch, celery, flask, sqlalchemy; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "celery", celery.__version__, "flask", flask.__version__, "sqlalchemy", sqlalchemy.__version__)'
nvidia-smi --query-gpu=index,name,driver_version,temperature.gpu,memory.used --format=csv,noheader
redis-server --version
command -v bwrap && bwrap --version || echo "bwrap: not found"

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --maxmemory-policy noeviction --daemonize yes --dir "$WORK/redis" --logfile "$WORK/redis.log"
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$REDIS_PORT" ping

kgrade() { python3 -c 'import sys; from service.cli import main; sys.argv[0] = "kgrade"; main()' "$@"; }
kgrade db upgrade --no-import
TOKEN=$(kgrade token create --role instructor --name pipeline 2>/dev/null | tail -n 1)

python3 -m gunicorn --bind "127.0.0.1:$API_PORT" --workers 2 --threads 2 --timeout 60 \
  'service:create_app()' >"$WORK/api.log" 2>&1 &
pids+=($!)
# One Celery process for the one GPU; it never touches CUDA itself (each job is a fresh process).
python3 -m celery -A workers.celery_app worker -Q gpu -c 1 --pool prefork \
  --prefetch-multiplier 1 -n gpu0@%h --without-mingle --without-gossip -l info \
  >"$WORK/worker.log" 2>&1 &
pids+=($!)

set +e
python3 benchmarks/pipeline_gpu.py --api "http://127.0.0.1:$API_PORT" --token "$TOKEN" \
  --json "$OUT/pipeline.json" "$@"
rc=$?
set -e
echo "== worker log (tail)"; tail -n 25 "$WORK/worker.log"
exit $rc
