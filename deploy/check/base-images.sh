#!/usr/bin/env bash
# Build the base images the stack check needs from Debian packages, since no image registry is
# reachable here: mmdebstrap makes a Debian root filesystem, `docker import` makes it an image.
# They stand in for the official images the Dockerfile and compose file default to:
#   kgrade-check/python   python:3.x-slim   (Debian's Python 3.11 + venv; the torch wheel is cp311)
#   kgrade-check/node     node:20-slim      (Debian's nodejs + npm: the assets stage)
#   kgrade-check/redis    redis:7.2-alpine  (Debian's redis-server 7.0)
#   kgrade-check/postgres postgres:16       (Debian's PostgreSQL 15, entrypoint as the official one)
# One at a time (four mmdebstrap runs side by side failed here). An image that already exists
# is kept (delete it to rebuild). Usage: base-images.sh [MIRROR]
set -euo pipefail
MIRROR=${1:-${DEBIAN_MIRROR:-http://deb.debian.org/debian}}
SUITE=${DEBIAN_SUITE:-bookworm}
# docker import sets no PATH; a Dockerfile's `ENV PATH=...:$PATH` needs one.
SYSPATH='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
HERE=$(cd "$(dirname "$0")" && pwd)
LOGS=${LOGS:-$HERE/../../var/deploy-check}
mkdir -p "$LOGS"

build() {  # NAME PACKAGES [docker import --change ...]
    local name=$1 packages=$2
    shift 2
    if docker image inspect "$name" >/dev/null 2>&1; then
        echo "base-images: $name exists"
        return
    fi
    local start=$SECONDS log=$LOGS/base-${name//[\/:]/-}.log
    # minbase (mmdebstrap also drops apt's lists and caches): as lean as the -slim images.
    # A failed debootstrap must not leave a half image that the next run would take as built.
    if ! mmdebstrap --variant=minbase --include="$packages" \
        --customize-hook="${CUSTOMIZE:-true}" \
        "$SUITE" - "$MIRROR" 2> "$log" | docker import "$@" - "$name" >/dev/null; then
        tail -20 "$log" >&2
        docker rmi -f "$name" >/dev/null 2>&1 || true
        return 1
    fi
    echo "base-images: $name built in $((SECONDS - start)) s"
}

CUSTOMIZE='' build kgrade-check/python:3.11 python3,python3-venv,ca-certificates,passwd \
    --change "$SYSPATH" --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]'
# npm ci reaches the npm registry from inside the build. The host's CA bundle replaces the
# image's: where a TLS-inspecting proxy sits in between (as here), only the host trusts its CA.
CUSTOMIZE="cp /etc/ssl/certs/ca-certificates.crt \"\$1\"/etc/ssl/certs/ca-certificates.crt" \
    build kgrade-check/node:18 nodejs,npm,ca-certificates \
    --change "$SYSPATH" --change 'ENV LANG=C.UTF-8' --change 'CMD ["node"]'
CUSTOMIZE='mkdir -p "$1"/data' build kgrade-check/redis:7.0 redis-server,redis-tools \
    --change "$SYSPATH" --change 'WORKDIR /data' --change 'CMD ["redis-server"]'
CUSTOMIZE="cp '$HERE/postgres-entrypoint.sh' \"\$1\"/usr/local/bin/docker-entrypoint.sh" \
    build kgrade-check/postgres:15 postgresql-15,postgresql-client-15 \
    --change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV PGDATA=/var/lib/postgresql/data' \
    --change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' --change 'CMD ["postgres"]'
