#!/bin/sh
# A PgBouncer of our own on loopback, in transaction pooling mode, in front of the local
# PostgreSQL: `pgbouncer.sh up` installs Debian's pgbouncer if it is missing, writes its
# configuration under a runtime directory and starts it; `pgbouncer.sh down` stops it.
# The pipeline reaches it with DATABASE_POOLER=transaction and
# DATABASE_URL=postgresql://postgres@127.0.0.1:$PGBOUNCER_PORT/<database> (docs/SCALING.md).
#
# Settings (environment): PGBOUNCER_PORT (6432), PGBOUNCER_POOL_SIZE (server connections per
# database and user, 8), PGBOUNCER_MAX_CLIENTS (400), PGBOUNCER_DIR (/tmp/crawl-pgbouncer-PORT),
# POSTGRES_HOST (127.0.0.1), POSTGRES_PORT (5432), POSTGRES_USER (postgres).
set -eu

PORT=${PGBOUNCER_PORT:-6432}
POOL_SIZE=${PGBOUNCER_POOL_SIZE:-8}
MAX_CLIENTS=${PGBOUNCER_MAX_CLIENTS:-400}
DIR=${PGBOUNCER_DIR:-/tmp/crawl-pgbouncer-$PORT}
PG_HOST=${POSTGRES_HOST:-127.0.0.1}
PG_PORT=${POSTGRES_PORT:-5432}
PG_USER=${POSTGRES_USER:-postgres}
PIDFILE=$DIR/pgbouncer.pid

case "$PG_HOST" in
    127.*|::1|localhost) ;;
    *) echo "POSTGRES_HOST=$PG_HOST: this script only fronts a PostgreSQL on loopback" >&2; exit 2 ;;
esac

running() {
    [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

install_pgbouncer() {
    PATH=$PATH:/usr/sbin
    command -v pgbouncer >/dev/null && return
    if [ "$(id -u)" != 0 ]; then
        echo "pgbouncer is not installed; as root: apt-get install -y pgbouncer" >&2
        exit 1
    fi
    echo "installing Debian's pgbouncer"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null
    # The package's own service (port 6432 by default) is not ours: never leave it running.
    if command -v systemctl >/dev/null && systemctl is-active --quiet pgbouncer 2>/dev/null; then
        systemctl stop pgbouncer
    fi
    if [ -f /run/postgresql/pgbouncer.pid ] && kill -0 "$(cat /run/postgresql/pgbouncer.pid)" 2>/dev/null; then
        service pgbouncer stop || true
    fi
}

write_config() {
    mkdir -p "$DIR"
    # Trust, like the local PostgreSQL: PgBouncer still wants the user listed in an auth file.
    printf '"%s" ""\n' "$PG_USER" > "$DIR/userlist.txt"
    cat > "$DIR/pgbouncer.ini" <<INI
; Written by deploy/local/pgbouncer.sh; rewritten at every start.
[databases]
; Every database name is passed through to the same server.
* = host=$PG_HOST port=$PG_PORT user=$PG_USER

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/userlist.txt
admin_users = $PG_USER
stats_users = $PG_USER
pool_mode = transaction
default_pool_size = $POOL_SIZE
max_client_conn = $MAX_CLIENTS
; Server connections idle this long are closed, so the pool shrinks after a crawl.
server_idle_timeout = 60
pidfile = $PIDFILE
logfile = $DIR/pgbouncer.log
INI
}

up() {
    if running; then
        echo "pgbouncer already running on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"))"
        return
    fi
    install_pgbouncer
    write_config
    # PgBouncer refuses to run as root: as root, it runs as the PostgreSQL system user.
    if [ "$(id -u)" = 0 ]; then
        chown -R postgres "$DIR"
        pgbouncer -d -u postgres "$DIR/pgbouncer.ini"
    else
        pgbouncer -d "$DIR/pgbouncer.ini"
    fi
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        running && break
        sleep 0.5
    done
    if ! running; then
        echo "pgbouncer did not start; see $DIR/pgbouncer.log" >&2
        tail -5 "$DIR/pgbouncer.log" >&2 || true
        exit 1
    fi
    echo "pgbouncer running on 127.0.0.1:$PORT (pool_mode=transaction, $POOL_SIZE server connections" \
        "per database); DATABASE_POOLER=transaction DATABASE_URL=postgresql://$PG_USER@127.0.0.1:$PORT/crawler"
}

down() {
    if ! running; then
        echo "pgbouncer on 127.0.0.1:$PORT is not running"
        return
    fi
    pid=$(cat "$PIDFILE")
    kill -TERM "$pid"  # immediate shutdown: its clients see their connections close
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "pgbouncer (pid $pid) did not stop" >&2
        exit 1
    fi
    rm -f "$PIDFILE"
    echo "pgbouncer on 127.0.0.1:$PORT stopped"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
