#!/bin/sh
# Run Prometheus with prometheus.yml plus one worker target per extra process of a worker pool.
#
# A worker container with WORKER_PROCESSES=N serves the metrics of process n on 9100 + n
# (worker/pool.py), and Prometheus cannot read environment variables in its configuration: so
# the worker job, the last one of prometheus.yml, gets a DNS discovery on each extra port here.
# Arguments are passed on to Prometheus. With PROMETHEUS_CONFIG_OUT set it only writes the
# configuration there (from PROMETHEUS_CONFIG_IN): the unit test runs it so.
set -eu
source_config=${PROMETHEUS_CONFIG_IN:-/etc/prometheus/prometheus.yml}
config=${PROMETHEUS_CONFIG_OUT:-/prometheus/prometheus.yml}
processes=${WORKER_PROCESSES:-1}
case "$processes" in
  '' | *[!0-9]*) echo "start.sh: WORKER_PROCESSES: expected a number, got '$processes'" >&2; exit 2 ;;
esac
cp "$source_config" "$config"
n=1
while [ "$n" -lt "$processes" ]; do
  echo "      - {names: [worker], type: A, port: $((9100 + n)), refresh_interval: 15s}" >>"$config"
  n=$((n + 1))
done
[ -n "${PROMETHEUS_CONFIG_OUT:-}" ] && exit 0
exec prometheus --config.file="$config" "$@"
