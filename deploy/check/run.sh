#!/usr/bin/env bash
# `make deploy-check`: build the image, bring up the compose stack (Redis with AOF, PostgreSQL,
# the migrate job, the API, a CPU worker), run the smoke test against it as a new user would,
# and tear it down (volumes included), whatever the outcome. Needs a running Docker engine and
# docker compose (v2, or Debian's docker-compose 1.29). docs/deploy-check.md has a recorded run.
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
    # Compose 1.x predates the top-level `name:` key; the project name is given with -p anyway.
    COMPOSE=(docker-compose)
    grep -v '^name:' deploy/docker-compose.yml > var/deploy-check/docker-compose.yml
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

step "compose up: redis postgres migrate api worker-cpu (API on :$KGRADE_API_PORT)"
# up waits for the healthchecks and the migrate job that depends_on names.
"${COMPOSE[@]}" up -d --no-build redis postgres migrate api worker-cpu
docker ps --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}\t{{.Image}}\t{{.Status}}'
aof=$("${COMPOSE[@]}" exec -T redis redis-cli config get appendonly | tail -1 | tr -d '\r')
[ "$aof" = yes ] || { echo "deploy-check: Redis appendonly is '$aof'" >&2; exit 1; }
echo "redis appendonly: $aof"
"${COMPOSE[@]}" logs --no-color migrate | tail -3

step "smoke test"
python3 deploy/check/smoke.py --api "http://127.0.0.1:$KGRADE_API_PORT" \
    --exec "${COMPOSE[*]} exec -T api"
