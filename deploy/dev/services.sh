#!/usr/bin/env bash
# Start (or stop) the real servers the test suite needs: PostgreSQL, Redis, and the tools
# headless-browser and sandbox tests use (Chromium, bubblewrap). Debian packages; run as root.
# Writes an env file with KGRADE_TEST_DATABASE_URL and KGRADE_TEST_REDIS_URL.
set -euo pipefail
action=${1:-start}
env_file=${2:-var/test-services.env}
PG_PORT=${KGRADE_TEST_PG_PORT:-54329}
REDIS_PORT=${KGRADE_TEST_REDIS_PORT:-63799}
PG_DIR=/tmp/kgrade-test-pg-$PG_PORT
RUN_DIR=/tmp/kgrade-test-run

need_pkgs=()
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_pkgs+=(postgresql)
command -v chromium >/dev/null || need_pkgs+=(chromium)
command -v bwrap >/dev/null || need_pkgs+=(bubblewrap)

pg_bin() { ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1; }
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

stop() {
  if [ -d "$PG_DIR" ] && [ -x "$(pg_bin)/pg_ctl" ]; then
    as_pg "$(pg_bin)/pg_ctl" -D "$PG_DIR" -m fast stop >/dev/null 2>&1 || true
  fi
  if command -v redis-cli >/dev/null; then redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true; fi
}

if [ "$action" = stop ]; then stop; exit 0; fi

if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "services: installing ${need_pkgs[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
mkdir -p "$RUN_DIR" "$(dirname "$env_file")"
chmod 1777 "$RUN_DIR"

# PostgreSQL: a private cluster on its own port, trust auth on loopback only.
bin=$(pg_bin)
if ! as_pg "$bin/pg_ctl" -D "$PG_DIR" status >/dev/null 2>&1; then
  if [ ! -f "$PG_DIR/PG_VERSION" ]; then
    rm -rf "$PG_DIR"; mkdir -p "$PG_DIR"; chown postgres: "$PG_DIR" 2>/dev/null || true
    as_pg "$bin/initdb" -D "$PG_DIR" -U postgres --auth=trust -E UTF8 --no-locale >/dev/null
  fi
  as_pg "$bin/pg_ctl" -D "$PG_DIR" -w -l "$RUN_DIR/postgres.log" \
    -o "-p $PG_PORT -k $RUN_DIR -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
fi
as_pg "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -tAc \
  "SELECT 1 FROM pg_database WHERE datname='kgrade_test'" | grep -q 1 \
  || as_pg "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres kgrade_test

# Redis: no persistence, and noeviction so broker messages are never silently dropped.
if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --daemonize yes --save '' --appendonly no \
    --maxmemory-policy noeviction --logfile "$RUN_DIR/redis.log" --dir "$RUN_DIR"
  for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi

cat > "$env_file" <<ENV
KGRADE_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:$PG_PORT/kgrade_test
KGRADE_TEST_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
KGRADE_TEST_REDIS_PORT=$REDIS_PORT
KGRADE_CHROMIUM=$(command -v chromium)
ENV
echo "services: PostgreSQL :$PG_PORT, Redis :$REDIS_PORT ready ($env_file)"
