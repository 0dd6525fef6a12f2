#!/usr/bin/env bash
# A Redis Cluster of three primaries and three replicas on loopback, for development and the
# cluster tests: `up` starts it (idempotent), `down` stops it and removes its files, `status`
# prints its nodes. Never touches the Redis on 6379.
#
#   REDIS_CLUSTER_DIR    where node dirs, logs and pid files go   (default: ./var/redis-cluster)
#   REDIS_CLUSTER_PORTS  the six ports, primaries first            (default: 7001 ... 7006)
#   REDIS_CLUSTER_NODE_TIMEOUT_MS  how long a silent primary has before its replica takes over
#
# Then: REDIS_URL=redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
set -euo pipefail

DIR=${REDIS_CLUSTER_DIR:-$(pwd)/var/redis-cluster}
PORTS=(${REDIS_CLUSTER_PORTS:-7001 7002 7003 7004 7005 7006})
NODE_TIMEOUT_MS=${REDIS_CLUSTER_NODE_TIMEOUT_MS:-2000}
HOST=127.0.0.1

start_node() {
    local port=$1 dir="$DIR/$1"
    mkdir -p "$dir"
    if redis-cli -h "$HOST" -p "$port" ping >/dev/null 2>&1; then
        return 0
    fi
    # No RDB snapshots and an append-only file: a killed primary comes back (if at all) as a
    # replica, and a restarted node keeps its writes. Persistence settings do not change what
    # asynchronous replication can lose at a failover.
    redis-server --port "$port" --bind "$HOST" --dir "$dir" \
        --cluster-enabled yes --cluster-config-file "nodes-$port.conf" \
        --cluster-node-timeout "$NODE_TIMEOUT_MS" \
        --appendonly yes --save '' --maxmemory-policy noeviction \
        --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
}

wait_ready() {
    for port in "${PORTS[@]}"; do
        for _ in $(seq 50); do
            redis-cli -h "$HOST" -p "$port" ping >/dev/null 2>&1 && break
            sleep 0.1
        done
    done
}

cluster_ok() {
    redis-cli -h "$HOST" -p "${PORTS[0]}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'
}

up() {
    for port in "${PORTS[@]}"; do start_node "$port"; done
    wait_ready
    local known
    known=$(redis-cli -h "$HOST" -p "${PORTS[0]}" cluster info | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p')
    if [ "$known" = "1" ]; then
        local nodes=()
        for port in "${PORTS[@]}"; do nodes+=("$HOST:$port"); done
        redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$DIR/create.log"
    fi
    for _ in $(seq 100); do
        cluster_ok && { echo "redis cluster up: $HOST:${PORTS[*]}"; return 0; }
        sleep 0.1
    done
    echo "redis cluster did not reach state ok; see $DIR/*/redis.log" >&2
    exit 1
}

down() {
    for port in "${PORTS[@]}"; do
        local pidfile="$DIR/$port/redis.pid"
        if [ -f "$pidfile" ]; then
            local pid
            pid=$(cat "$pidfile")
            # Only a redis-server of ours on this port: the pid file may be stale.
            if ps -o args= -p "$pid" 2>/dev/null | grep -q "redis-server.*:$port"; then
                kill "$pid"
                for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            fi
        fi
    done
    rm -rf "$DIR"
    echo "redis cluster down"
}

status() {
    redis-cli -h "$HOST" -p "${PORTS[0]}" cluster nodes 2>/dev/null || { echo "redis cluster not running"; exit 1; }
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
