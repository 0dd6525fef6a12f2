#!/usr/bin/env bash
# `make compose-test`: the project's docker-compose.yml, run for real on this machine.
#
# Installs what it needs from Debian if missing (docker.io, docker-compose, debootstrap, tini),
# starts a Docker daemon of its own (tests/compose/dockerd.sh: own socket, data root, exec root
# and address pool, no route off the machine), builds every image from Debian packages
# (deploy/offline-images/build.sh; images whose inputs did not change are kept from the last
# run), runs the scenario of tests/compose/check_stack.py, and stops the daemon it started.
# The host's own RabbitMQ, Redis and PostgreSQL, and their ports, are left alone: the stack's
# published ports are moved to free ones.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
work=${COMPOSE_TEST_WORK:-var/compose-test}
mkdir -p "$work"

say() { echo "compose-test: $*"; }

[ "$(id -u)" = 0 ] || { say "error: run as root (it starts a Docker daemon)" >&2; exit 2; }
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v tini >/dev/null || missing+=(tini)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -q >"$work/apt.log" 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$work/apt.log" 2>&1 \
    || { tail -n 20 "$work/apt.log" >&2; exit 1; }
fi

started=$(date +%s)
# Never the host's own daemon, if it has one: a daemon of the test's own, stopped at the end
# unless it was running before (someone is using it).
if tests/compose/dockerd.sh running; then
  say "the test's dockerd runs already: it is used and left running"
else
  trap 'tests/compose/dockerd.sh stop' EXIT
fi
DOCKER_HOST=$(tests/compose/dockerd.sh start)
export DOCKER_HOST
unset COMPOSE_PROJECT_NAME COMPOSE_FILE COMPOSE_PROFILES
say "private dockerd at $DOCKER_HOST"

build_started=$(date +%s)
deploy/offline-images/build.sh
say "images ready in $(( $(date +%s) - build_started )) s"

"$PY" tests/compose/check_stack.py --work-dir "$work"
say "done in $(( $(date +%s) - started )) s"
