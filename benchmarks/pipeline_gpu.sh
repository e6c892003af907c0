#!/bin/bash
# The whole grading pipeline once, for real, on a GPU machine without a package index:
# Redis (unpacked Debian package) + the API under gunicorn (SQLite) + one Celery worker process
# (-c 1) for the GPUs + benchmarks/pipeline_gpu.py, which submits every known solution of every
# exercise over HTTP, then grades our own reference 5 times, and prints a table.
#
# Needs, in the repository root (the device run's `carry` list): .whl (from
#   `benchmarks/device_wheels.sh`: every dependency in pyproject.toml) and .deb (redis-server, its libraries, bubblewrap).
# Usage: benchmarks/pipeline_gpu.sh [pipeline_gpu.py options, e.g. --exercise attention-merge
#   --solutions one --reference-runs 5 --deadline 480]. Logs and pipeline.json go to $OUT.
# One GPU: one worker on queue `gpu`; multi-rank exercises are skipped (reported). Two or more
# GPUs: as deployed, one worker process per GPU on `gpu` (each job alone on its GPU, each worker
# with its own baseline of our reference), one holding GPUs 0,1 on `gpu-x2` and, with four or
# more GPUs, one holding GPUs 0-3 on `gpu-x4` (ring-attention-x4). The driver feeds the widest
# first, one width at a time, so a multi-GPU job always finds its GPUs idle.
# Only the 4-rank ring on a 4- or 8-GPU machine: benchmarks/pipeline_gpu.sh --exercise ring-attention-x4
# Local rehearsal on CPU: PIPELINE_DEVICE=cpu SKIP_WHEELS=1 PY=.venv/bin/python benchmarks/pipeline_gpu.sh
#   (without .deb, redis-server and bwrap come from the PATH)
# DRIVER=deadline runs benchmarks/deadline.py instead (issue 18: N submissions poured in at once,
#   drain time, latency, GPU utilisation, GPUs a class needs), with this script's worker list;
#   its options follow, e.g. DRIVER=deadline benchmarks/pipeline_gpu.sh --n 200. JSON: deadline.json.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-python3}
DEVICE=${PIPELINE_DEVICE:-cuda}
WORK=${KGRADE_PIPELINE_DIR:-/tmp/kgrade-pipeline}
OUT=${OUT:-$WORK/out}
rm -rf "$WORK/var" "$WORK/redis"; mkdir -p "$WORK/var" "$WORK/redis" "$OUT"
t_start=$(date +%s)

# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh

REDIS_PORT=${REDIS_PORT:-6391}
API_PORT=${API_PORT:-8011}
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
export DATABASE_URL="sqlite:///$WORK/var/kgrade.sqlite3"
export KGRADE_VAR_DIR="$WORK/var"
export KGRADE_GRADE_DEVICE=$DEVICE
export KGRADE_IMPORT_BANK=0
# The baseline (our reference, timed by the same harness) is measured once per worker and kept
# in a file per worker and GPU set under $KGRADE_VAR_DIR/ref-cache (workers.tasks.job_env).
unset KGRADE_REF_CACHE
# Compiled Triton kernels of our reference, kept between reference runs (never seen by students).
export KGRADE_REF_TRITON_CACHE=${KGRADE_REF_TRITON_CACHE:-$WORK/ref-triton}

# Workers as "queues:GPU list" (empty list on CPU).
if [ "$DEVICE" = cuda ]; then
  GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
  WORKERS=()
  for ((i = 0; i < GPUS; i++)); do WORKERS+=("gpu:$i"); done
  if [ "$GPUS" -ge 2 ]; then WORKERS+=("gpu-x2:0,1"); fi
  if [ "$GPUS" -ge 4 ]; then WORKERS+=("gpu-x4:0,1,2,3"); fi
else
  GPUS=4; WORKERS=("cpu:")  # CPU rehearsal: P-rank exercises run as P gloo processes
fi

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 3
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  cp -f "$WORK"/*.log "$OUT"/ 2>/dev/null || true
}
trap cleanup EXIT

echo "== versions"
"$PY" -c 'import sys, torch, celery, flask, sqlalchemy, redis; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "celery", celery.__version__, "flask", flask.__version__, "sqlalchemy", sqlalchemy.__version__, "redis-py", redis.__version__)'
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=index,name,driver_version,temperature.gpu,memory.used --format=csv,noheader
redis-server --version
if command -v bwrap >/dev/null; then bwrap --version; else echo "bwrap: not found"; fi
# job directories (snapshots of every checked call's outputs) live under the temp dir
df -hT "${TMPDIR:-/tmp}" /dev/shm 2>/dev/null || true

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --maxmemory-policy noeviction --daemonize yes --dir "$WORK/redis" --logfile "$WORK/redis.log"
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$REDIS_PORT" ping

kgrade() { "$PY" -c 'import sys; from service.cli import main; sys.argv[0] = "kgrade"; main()' "$@"; }
kgrade db upgrade --no-import
TOKEN=$(kgrade token create --role instructor --name pipeline 2>/dev/null | tail -n 1)

"$PY" -m gunicorn --bind "127.0.0.1:$API_PORT" --workers 2 --threads 2 --timeout 60 \
  'service:create_app()' >"$WORK/api.log" 2>&1 &
pids+=($!)
# Celery processes never touch CUDA themselves (each job is a fresh process tree).
n=0
for w in "${WORKERS[@]}"; do
  q=${w%%:*}; g=${w#*:}; n=$((n + 1))
  KGRADE_GPUS=$g "$PY" -m celery -A workers.celery_app worker -Q "$q" -c 1 --pool prefork \
    --prefetch-multiplier 1 -n "pipeline$n@%h" --without-mingle --without-gossip -l info \
    >"$WORK/worker$n.log" 2>&1 &
  pids+=($!)
done
echo "== redis on $REDIS_PORT, API on $API_PORT, workers ${WORKERS[*]}; setup $(( $(date +%s) - t_start )) s"

case "${DRIVER:-pipeline}" in
  pipeline) driver=(benchmarks/pipeline_gpu.py --json "$OUT/pipeline.json") ;;
  # the deadline driver needs the worker layout: its GPU count and which workers share GPUs
  deadline) driver=(benchmarks/deadline.py --json "$OUT/deadline.json" --device "$DEVICE"
    --workers "${WORKERS[*]}") ;;
  *) echo "DRIVER must be pipeline or deadline, not '$DRIVER'" >&2; exit 2 ;;
esac
set +e
"$PY" "${driver[@]}" --api "http://127.0.0.1:$API_PORT" --token "$TOKEN" --gpus "$GPUS" "$@"
rc=$?
set -e
# (|| true: no matching line, e.g. nothing graded, must not replace the driver's exit status)
echo "== worker logs (tail)"; grep -E "succeeded|failed|ERROR|WARNING" "$WORK"/worker*.log | tail -n 15 | cut -c1-300 || true
exit $rc
