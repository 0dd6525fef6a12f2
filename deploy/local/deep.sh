#!/usr/bin/env bash
# deploy/local/deep.sh up|down|status|redis-up: a RabbitMQ node and a Redis of their own, on loopback only,
# for the deep-frontier benchmark (bench/deep_frontier.py) and the soak (tests/soak/). Millions of queued messages would
# trip the memory or disk alarm of a shared broker and block every other client, so the deep
# frontier gets a node with its own data directory. Nothing here touches another node.
#   DEEP_DIR (default /var/tmp/crawl-deep)  data, logs and config
#   DEEP_AMQP_PORT 5691, DEEP_DIST_PORT 25691, DEEP_MGMT_PORT 15691, DEEP_REDIS_PORT 6391
#   DEEP_NODE deep@localhost
set -euo pipefail

DEEP_DIR=${DEEP_DIR:-/var/tmp/crawl-deep}
DEEP_NODE=${DEEP_NODE:-deep@localhost}
DEEP_AMQP_PORT=${DEEP_AMQP_PORT:-5691}
DEEP_DIST_PORT=${DEEP_DIST_PORT:-25691}
DEEP_MGMT_PORT=${DEEP_MGMT_PORT:-15691}
DEEP_REDIS_PORT=${DEEP_REDIS_PORT:-6391}

rabbit_env() {
    export RABBITMQ_NODENAME=$DEEP_NODE
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT=$DEEP_AMQP_PORT
    export RABBITMQ_DIST_PORT=$DEEP_DIST_PORT
    export RABBITMQ_MNESIA_BASE=$DEEP_DIR/mnesia
    export RABBITMQ_LOG_BASE=$DEEP_DIR/log
    export RABBITMQ_CONFIG_FILE=$DEEP_DIR/rabbitmq.conf
    export RABBITMQ_ENABLED_PLUGINS_FILE=$DEEP_DIR/enabled_plugins
    export RABBITMQ_PID_FILE=$DEEP_DIR/rabbitmq.pid
}

# Redis alone, empty: also what brings it back after `redis-cli -p PORT shutdown nosave` (the soak,
# tests/soak/, restarts it that way, as after a crash).
redis_up() {
    mkdir -p "$DEEP_DIR/log" "$DEEP_DIR/redis"
    redis-server --bind 127.0.0.1 --port "$DEEP_REDIS_PORT" --save '' --appendonly no \
        --dir "$DEEP_DIR/redis" --daemonize yes --pidfile "$DEEP_DIR/redis.pid" \
        --logfile "$DEEP_DIR/log/redis.log"
}

up() {
    mkdir -p "$DEEP_DIR/mnesia" "$DEEP_DIR/log" "$DEEP_DIR/redis"
    cat >"$DEEP_DIR/rabbitmq.conf" <<CONF
listeners.tcp.1 = 127.0.0.1:$DEEP_AMQP_PORT
management.tcp.ip = 127.0.0.1
management.tcp.port = $DEEP_MGMT_PORT
loopback_users = none
disk_free_limit.absolute = 5GB
vm_memory_high_watermark.relative = 0.4
CONF
    echo '[rabbitmq_management].' >"$DEEP_DIR/enabled_plugins"
    # Run as root, the packaged scripts switch to the rabbitmq user: it must own the node's files.
    if [[ $(id -u) == 0 ]] && id rabbitmq >/dev/null 2>&1; then
        chown -R rabbitmq:rabbitmq "$DEEP_DIR/mnesia" "$DEEP_DIR/log" "$DEEP_DIR/rabbitmq.conf" \
            "$DEEP_DIR/enabled_plugins"
        chown rabbitmq:rabbitmq "$DEEP_DIR"
    fi
    rabbit_env
    rabbitmq-server -detached
    redis_up
    rabbitmqctl -n "$DEEP_NODE" wait --timeout 120 "$DEEP_DIR/rabbitmq.pid" >/dev/null
    echo "deep frontier services up: amqp://guest:guest@127.0.0.1:$DEEP_AMQP_PORT/%2f" \
        "redis://127.0.0.1:$DEEP_REDIS_PORT/0 management http://127.0.0.1:$DEEP_MGMT_PORT"
}

down() {
    rabbit_env
    rabbitmqctl -n "$DEEP_NODE" stop "$DEEP_DIR/rabbitmq.pid" >/dev/null 2>&1 || true
    if [[ -f $DEEP_DIR/redis.pid ]]; then
        kill "$(cat "$DEEP_DIR/redis.pid")" 2>/dev/null || true
        rm -f "$DEEP_DIR/redis.pid"
    fi
    echo "deep frontier services stopped (data kept in $DEEP_DIR; remove it to start empty)"
}

status() {
    rabbitmqctl -n "$DEEP_NODE" status 2>/dev/null | grep -E 'RabbitMQ version|Total memory' || echo "rabbitmq: down"
    redis-cli -p "$DEEP_REDIS_PORT" info memory 2>/dev/null | grep '^used_memory_human' || echo "redis: down"
}

case ${1:-} in
up) up ;;
redis-up) redis_up ;;
down) down ;;
status) status ;;
*)
    echo "usage: deploy/local/deep.sh up|down|status|redis-up" >&2
    exit 2
    ;;
esac
