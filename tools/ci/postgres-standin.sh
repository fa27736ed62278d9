#!/bin/sh
# Entrypoint of the PostgreSQL STAND-IN tools/ci/images.sh builds (Debian's postgresql under the tag
# deploy/compose.failover.yaml names): what the official image does with its environment, no more.
# POSTGRES_PASSWORD (required), POSTGRES_USER (default postgres), POSTGRES_DB (default the user),
# PGDATA (default /var/lib/postgresql/data). A new data directory is made with that superuser,
# password authentication from anywhere (scram-sha-256), listening on every address; an existing one
# is started as it is. Runs the server as the postgres user, in the foreground.
set -eu
PGDATA=${PGDATA:-/var/lib/postgresql/data}
export PGDATA
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec runuser -u postgres -- "$0" "$@"
fi
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set (as for the official image)}"
  pwfile=$(mktemp)
  printf '%s' "$POSTGRES_PASSWORD" >"$pwfile"
  "$BIN/initdb" -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all 0.0.0.0/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  if [ "$db" != postgres ]; then
    echo "CREATE DATABASE \"$db\" OWNER \"$user\";" | "$BIN/postgres" --single -D "$PGDATA" postgres >/dev/null
  fi
fi
exec "$BIN/postgres" -D "$PGDATA" "$@"
