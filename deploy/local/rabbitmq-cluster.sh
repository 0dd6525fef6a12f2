#!/usr/bin/env bash
# Three RabbitMQ nodes on this machine, clustered, all on loopback:
#   crawl1@localhost  AMQP 127.0.0.1:5681  distribution 25681
#   crawl2@localhost  AMQP 127.0.0.1:5682  distribution 25682
#   crawl3@localhost  AMQP 127.0.0.1:5683  distribution 25683
# Usage: rabbitmq-cluster.sh up | down | status | url | stop-node N | start-node N | ctl N ARGS...
#
# Each node has its own data, log, config and plugins file under RUNTIME_DIR, and the cluster has
# an Erlang cookie of its own there (HOME points at it for the server and for rabbitmqctl), so
# nothing here can reach a RabbitMQ already running on this machine: a node with another cookie
# refuses us. The server runs as the calling user. Docs: docs/SCALING.md, "RabbitMQ cluster".
set -euo pipefail

RUNTIME_DIR=${RUNTIME_DIR:-${TMPDIR:-/tmp}/crawl-rabbitmq-cluster}
NODES=${NODES:-3}
AMQP_BASE_PORT=${AMQP_BASE_PORT:-5680}     # node N listens on AMQP_BASE_PORT + N
DIST_BASE_PORT=${DIST_BASE_PORT:-25680}    # node N's Erlang distribution port
RABBITMQ_BIN=${RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}
START_TIMEOUT_S=${START_TIMEOUT_S:-90}

node_name() { echo "crawl$1@localhost"; }

ctl() {  # ctl N args...: rabbitmqctl against node N, with the cluster's own cookie
  local n=$1; shift
  # No cookie: the cluster was never started (or is gone); the CLI would only crash creating one.
  if [ ! -s "$RUNTIME_DIR/.erlang.cookie" ]; then
    echo "no cluster under $RUNTIME_DIR" >&2
    return 1
  fi
  HOME="$RUNTIME_DIR" RABBITMQ_CONF_ENV_FILE="$RUNTIME_DIR/rabbitmq-env.conf" \
  ERL_CRASH_DUMP="$RUNTIME_DIR/erl_crash.dump" \
    "$RABBITMQ_BIN/rabbitmqctl" -n "$(node_name "$n")" "$@"
}

prepare() {
  mkdir -p "$RUNTIME_DIR"
  # An env file of our own: the system one may name another node.
  : > "$RUNTIME_DIR/rabbitmq-env.conf"
  if [ ! -s "$RUNTIME_DIR/.erlang.cookie" ]; then
    (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$RUNTIME_DIR/.erlang.cookie")
  fi
  chmod 400 "$RUNTIME_DIR/.erlang.cookie"
  local n
  for n in $(seq 1 "$NODES"); do
    local dir="$RUNTIME_DIR/node$n"
    mkdir -p "$dir/mnesia" "$dir/log"
    cat > "$dir/rabbitmq.conf" <<CONF
listeners.tcp.1 = 127.0.0.1:$((AMQP_BASE_PORT + n))
loopback_users.guest = true
# Three nodes share one machine: each may use a modest share of its memory.
vm_memory_high_watermark.absolute = 512MiB
disk_free_limit.absolute = 200MiB
CONF
    echo '[].' > "$dir/enabled_plugins"   # no management listener: no port to collide on
  done
}

start_node() {
  local n=$1 dir="$RUNTIME_DIR/node$1"
  if ctl "$n" status >/dev/null 2>&1; then return 0; fi
  HOME="$RUNTIME_DIR" \
  RABBITMQ_CONF_ENV_FILE="$RUNTIME_DIR/rabbitmq-env.conf" \
  RABBITMQ_NODENAME="$(node_name "$n")" \
  RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
  RABBITMQ_NODE_PORT=$((AMQP_BASE_PORT + n)) \
  RABBITMQ_DIST_PORT=$((DIST_BASE_PORT + n)) \
  RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
  RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
  RABBITMQ_MNESIA_BASE="$dir/mnesia" \
  RABBITMQ_LOG_BASE="$dir/log" \
  RABBITMQ_PID_FILE="$dir/rabbitmq.pid" \
  ERL_EPMD_ADDRESS=127.0.0.1 \
  RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1} +S 1:1 +A 8" \
    nohup "$RABBITMQ_BIN/rabbitmq-server" > "$dir/log/stdout.log" 2>&1 &
  # wait: the node answers once its boot finished (or fails, and its log says why)
  if ! ctl "$n" wait --timeout "$START_TIMEOUT_S" "$dir/rabbitmq.pid" >/dev/null 2>&1; then
    echo "node $(node_name "$n") did not start; see $dir/log" >&2
    return 1
  fi
}

stop_node() {
  local n=$1
  ctl "$n" stop >/dev/null 2>&1 || true
}

up() {
  prepare
  local n
  for n in $(seq 1 "$NODES"); do start_node "$n"; done
  for n in $(seq 2 "$NODES"); do
    if ! ctl "$n" cluster_status --formatter json 2>/dev/null | grep -q "$(node_name 1)"; then
      ctl "$n" stop_app >/dev/null
      ctl "$n" join_cluster "$(node_name 1)" >/dev/null
      ctl "$n" start_app >/dev/null
    fi
  done
  ctl 1 await_online_nodes "$NODES" --timeout "$START_TIMEOUT_S" >/dev/null
  echo "RabbitMQ cluster up: $NODES nodes"
  echo "AMQP_URL=$(amqp_url)"
}

amqp_url() {
  local n urls=()
  for n in $(seq 1 "$NODES"); do urls+=("amqp://guest:guest@127.0.0.1:$((AMQP_BASE_PORT + n))/%2f"); done
  (IFS=,; echo "${urls[*]}")
}

down() {
  local n
  # Last started, first stopped; then the data goes, so the next `up` is a fresh cluster.
  for n in $(seq "$NODES" -1 1); do stop_node "$n"; done
  rm -rf "$RUNTIME_DIR"
  echo "RabbitMQ cluster down"
}

status() {
  local n
  for n in $(seq 1 "$NODES"); do
    if ctl "$n" status >/dev/null 2>&1; then echo "$(node_name "$n") running"; else echo "$(node_name "$n") stopped"; fi
  done
  ctl 1 cluster_status 2>/dev/null || true
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  url) amqp_url ;;
  stop-node) stop_node "${2:?node number}" ;;
  start-node) prepare; start_node "${2:?node number}" ;;
  ctl) shift; n=${1:?node number}; shift; ctl "$n" "$@" ;;
  *) echo "usage: $0 up|down|status|url|stop-node N|start-node N|ctl N ARGS..." >&2; exit 2 ;;
esac
