#!/usr/bin/env bash
# A Docker daemon of the compose test's own, beside anything else on the machine:
#
#   tests/compose/dockerd.sh start     # prints the DOCKER_HOST to use
#   tests/compose/dockerd.sh stop
#   tests/compose/dockerd.sh running   # exit 0 if it runs
#
# Its socket, data root, exec root, pid file and address pool are its own, and it changes
# nothing on the host's network: no iptables rules, no forwarding, no masquerading, no docker0
# bridge. Its containers reach each other on compose's network and this machine reaches their
# published ports (through docker-proxy), but nothing in them has a route off the machine.
# The data root is kept between runs: it caches the images (deploy/offline-images/build.sh
# rebuilds what changed) and nothing else.
set -euo pipefail

name=crawl-pipeline-docker
socket=/run/$name.sock
pidfile=/run/$name.pid
exec_root=/run/$name
data_root=${COMPOSE_TEST_DOCKER_ROOT:-/var/cache/crawl-pipeline/docker}
log=${COMPOSE_TEST_DOCKERD_LOG:-/var/log/$name.log}
# Not a network this machine uses; compose's project networks are carved out of it.
pool=${COMPOSE_TEST_ADDRESS_POOL:-10.231.0.0/16}

running() { [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

case "${1:-}" in
  start)
    if running; then echo "unix://$socket"; exit 0; fi
    mkdir -p "$data_root" "$exec_root" "$(dirname "$log")"
    dockerd \
      --host "unix://$socket" \
      --data-root "$data_root" \
      --exec-root "$exec_root" \
      --pidfile "$pidfile" \
      --iptables=false --ip-forward=false --ip-masq=false \
      --bridge=none \
      --default-address-pool "base=$pool,size=24" \
      >>"$log" 2>&1 </dev/null &
    for _ in $(seq 1 60); do
      if DOCKER_HOST="unix://$socket" docker version >/dev/null 2>&1; then
        echo "unix://$socket"
        exit 0
      fi
      sleep 1
    done
    echo "dockerd.sh: the daemon did not answer within 60 s; see $log" >&2
    tail -n 20 "$log" >&2
    exit 1
    ;;
  running)
    running
    ;;
  stop)
    running || exit 0
    pid=$(cat "$pidfile")
    kill -TERM "$pid"
    # dockerd stops its containers first (their stop timeouts apply), so give it time.
    for _ in $(seq 1 90); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 1; done
    echo "dockerd.sh: dockerd $pid did not stop within 90 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
    ;;
  *)
    echo "usage: $0 start|stop|running" >&2
    exit 2
    ;;
esac
