#!/bin/sh
# memworker-postgres: `postgres [options]` initialises $PGDATA once (POSTGRES_PASSWORD,
# POSTGRES_USER, POSTGRES_DB) and runs the server; any other command runs as given.
set -eu
if [ "${1:-}" != postgres ]; then
    exec "$@"
fi
shift
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "memworker-postgres: set POSTGRES_PASSWORD (the superuser's password)" >&2
        exit 1
    fi
    user="${POSTGRES_USER:-postgres}"
    db="${POSTGRES_DB:-$user}"
    # a half-made data directory would pass for a made one at the next start: undo on failure
    trap 'pg_ctl --pgdata="$PGDATA" --silent --mode=immediate stop 2> /dev/null; find "$PGDATA" -mindepth 1 -delete' EXIT
    pwfile="$(mktemp)"
    printf '%s' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --pgdata="$PGDATA" --username="$user" --pwfile="$pwfile" --encoding=UTF8 \
        --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256 > /dev/null
    rm -f "$pwfile"
    # clients come from other containers: password authentication from anywhere
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "$db" != postgres ]; then
        # a private socket and no TCP: no client (nor pg_isready, the health check) sees this
        # server before the database exists
        socket="$(mktemp -d)"
        pg_ctl --pgdata="$PGDATA" --wait --silent \
            --options="-c listen_addresses='' -c unix_socket_directories=$socket" start
        echo 'CREATE DATABASE :"db"' | psql --no-psqlrc --quiet -v ON_ERROR_STOP=1 -v db="$db" \
            --host="$socket" --username="$user" --dbname=postgres
        pg_ctl --pgdata="$PGDATA" --wait --silent --mode=fast stop
        rmdir "$socket"
    fi
    trap - EXIT
    echo "memworker-postgres: initialised $PGDATA (superuser $user, database $db)"
fi
exec postgres -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql "$@"
