#!/bin/sh
# Entrypoint of the Debian PostgreSQL image (see Dockerfile): on the first start, make the
# cluster in $PGDATA from POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB, as the official
# postgres image does; then run `postgres -D $PGDATA` with the command's `-c` options.
set -eu

init_cluster() {
    user="${POSTGRES_USER:-postgres}"
    db="${POSTGRES_DB:-$user}"
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "POSTGRES_PASSWORD is empty: set it (docker run -e / compose .env) so the database is not left open." >&2
        exit 1
    fi
    # The password goes through a private file, never a command line (ps) or the log.
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    # Other containers connect over TCP with the password; the socket stays trust (local).
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    if [ "$db" != postgres ]; then
        # Single-user mode: no server (and so no open port) before the cluster is ready.
        echo "CREATE DATABASE \"$db\";" | postgres --single -D "$PGDATA" -j postgres >/dev/null
    fi
    echo "postgres-entrypoint: created the cluster in $PGDATA (user $user, database $db)"
}

if [ "${1:-}" = postgres ]; then
    shift
    if [ ! -s "$PGDATA/PG_VERSION" ]; then
        init_cluster
    fi
    unset POSTGRES_PASSWORD
    exec postgres -D "$PGDATA" "$@"
fi
exec "$@"
