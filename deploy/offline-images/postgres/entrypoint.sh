#!/bin/sh
# Like the official image: an empty data directory is initialised with the superuser
# POSTGRES_USER (postgres) and its password POSTGRES_PASSWORD, the database POSTGRES_DB is
# created, other containers log in with that password, and the server runs as postgres.
set -e
if [ "$1" != postgres ]; then exec "$@"; fi
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
user=${POSTGRES_USER:-postgres}
database=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "postgres: error: the data directory is empty and POSTGRES_PASSWORD is not set" >&2
    exit 1
  fi
  password_file=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$password_file"
  initdb --username="$user" --pwfile="$password_file" --encoding=UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$password_file"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  pg_ctl --wait --options="-c listen_addresses=''" start >/dev/null
  if [ "$database" != postgres ]; then
    psql --quiet -v ON_ERROR_STOP=1 --username="$user" --dbname=postgres \
      --command="CREATE DATABASE \"$database\""
  fi
  pg_ctl --wait --mode=fast stop >/dev/null
fi
shift
exec postgres -c listen_addresses='*' "$@"
