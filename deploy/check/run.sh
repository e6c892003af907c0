#!/usr/bin/env bash
# `make deploy-check`: build the image, bring up the compose stack (Redis with AOF, PostgreSQL,
# the migrate job, the API, a CPU worker, the maint worker with Celery beat), run the smoke test
# against it as a new user would, and tear it down (volumes included), whatever the outcome.
# Needs a running Docker engine and docker compose (v2, or Debian's docker-compose 1.29).
# docs/deploy-check.md has a recorded run.
#
# The CPU worker must grade inside bubblewrap (deploy/README.md, "The sandbox in a container");
# ALLOW_RLIMITS=1 accepts a grading with rlimits only (a host without user namespaces).
#
# No registry or package index is needed: base images come from Debian packages
# (base-images.sh) and Python wheels from this machine's pip sources (wheels.sh). With
# OFFICIAL_IMAGES=1 the official images and package indexes are used instead.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PROJECT=${PROJECT:-kgrade-check}
export KGRADE_API_PORT=${KGRADE_API_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
START=$SECONDS
mkdir -p var/deploy-check  # logs of the last run (var/ is not tracked)
step() { printf '\n== %s (%d s)\n' "$*" $((SECONDS - START)); }

docker info >/dev/null 2>&1 || { echo "deploy-check: no Docker engine (start dockerd)" >&2; exit 1; }
COMPOSE_FILE=deploy/docker-compose.yml
if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then
    # Compose 1.x predates the top-level `name:` key (the project name is given with -p anyway),
    # opens a seccomp profile relative to the working directory, not to the file, and hands
    # `systempaths=unconfined` to the engine, which refuses it: compose_v1.py sends what
    # Compose v2 sends instead (empty MaskedPaths and ReadonlyPaths), under Compose's Python.
    py=$(head -1 "$(command -v docker-compose)" | sed -n 's/^#! *//p')
    COMPOSE=("${py:-python3}" deploy/check/compose_v1.py)
    grep -v '^name:' deploy/docker-compose.yml \
        | sed "s#seccomp=\./#seccomp=$ROOT/deploy/#" > var/deploy-check/docker-compose.yml
    COMPOSE_FILE=var/deploy-check/docker-compose.yml
else
    echo "deploy-check: neither 'docker compose' nor docker-compose is installed" >&2
    exit 1
fi
COMPOSE+=(-p "$PROJECT" -f "$COMPOSE_FILE")
echo "compose: ${COMPOSE[*]} ($("${COMPOSE[@]}" version --short 2>/dev/null || true))"

BUILD_ARGS=()
if [ "${OFFICIAL_IMAGES:-0}" != 1 ]; then
    step "base images from Debian packages"
    deploy/check/base-images.sh
    step "wheelhouse"
    deploy/check/wheels.sh
    export KGRADE_REDIS_IMAGE=kgrade-check/redis:7.0 KGRADE_POSTGRES_IMAGE=kgrade-check/postgres:15
    offline="--no-index --find-links /wheelhouse"
    BUILD_ARGS=(--build-arg BASE_IMAGE=kgrade-check/python:3.11
                --build-arg NODE_IMAGE=kgrade-check/node:18
                --build-arg "TORCH_PIP_ARGS=$offline" --build-arg "PIP_ARGS=$offline")
fi

step "docker build -t kgrade:cpu"
docker build -t kgrade:cpu "${BUILD_ARGS[@]}" . > var/deploy-check/build.log 2>&1 \
    || { tail -40 var/deploy-check/build.log >&2; exit 1; }
docker image ls kgrade:cpu --format 'kgrade:cpu {{.ID}} {{.Size}}'

teardown() {
    status=$?
    if [ "$status" != 0 ]; then
        echo "deploy-check: failed; the last log lines of each service:" >&2
        "${COMPOSE[@]}" logs --no-color --tail 40 >&2 || true
    fi
    step "tear down"
    "${COMPOSE[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
    echo "deploy-check: $([ "$status" = 0 ] && echo passed || echo FAILED) in $((SECONDS - START)) s"
    exit "$status"
}
trap teardown EXIT

# The reaper every 10 s instead of 60, a job stuck after 15 s of silence instead of 180 (with a
# heartbeat every 2 s instead of 15), so that the smoke test sees beat send the reaper and the
# reaper requeue a grading whose worker it killed, within seconds.
export KGRADE_REAP_INTERVAL_S=${KGRADE_REAP_INTERVAL_S:-10}
export KGRADE_STUCK_AFTER_S=${KGRADE_STUCK_AFTER_S:-15}
export KGRADE_HEARTBEAT_S=${KGRADE_HEARTBEAT_S:-2}
SERVICES=(redis postgres migrate api worker-cpu maint)
step "compose up: ${SERVICES[*]} (API on :$KGRADE_API_PORT)"
# up waits for the healthchecks and the migrate job that depends_on names.
"${COMPOSE[@]}" up -d --no-build "${SERVICES[@]}"
docker ps --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}\t{{.Image}}\t{{.Status}}'
aof=$("${COMPOSE[@]}" exec -T redis redis-cli config get appendonly | tail -1 | tr -d '\r')
[ "$aof" = yes ] || { echo "deploy-check: Redis appendonly is '$aof'" >&2; exit 1; }
echo "redis appendonly: $aof"
"${COMPOSE[@]}" logs --no-color migrate | tail -3

step "smoke test"
SMOKE_ARGS=()
if [ "${ALLOW_RLIMITS:-0}" = 1 ]; then SMOKE_ARGS+=(--allow-rlimits); fi
python3 deploy/check/smoke.py --api "http://127.0.0.1:$KGRADE_API_PORT" \
    --compose "${COMPOSE[*]}" "${SMOKE_ARGS[@]}"
