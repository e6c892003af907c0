#!/bin/sh
# The official postgres image's contract, for the stand-in built from Debian's postgresql
# package (deploy/check/base-images.sh): on an empty data directory, create the cluster with
# POSTGRES_USER as superuser (password POSTGRES_PASSWORD) and the database POSTGRES_DB; accept
# password logins from the compose network; run the server as the postgres user.
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}" "${POSTGRES_PASSWORD:?required}"
PGDATA=${PGDATA:-/var/lib/postgresql/data}
mkdir -p "$PGDATA" /var/run/postgresql
chown -R postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp) && printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile" && chown postgres "$pwfile"
    # UTF8 as the official image (minbase has no locale: initdb would pick SQL_ASCII, and
    # psycopg then returns bytes for text)
    as_pg initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        echo "CREATE DATABASE \"$POSTGRES_DB\";" | as_pg postgres --single -D "$PGDATA" postgres >/dev/null
    fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"
