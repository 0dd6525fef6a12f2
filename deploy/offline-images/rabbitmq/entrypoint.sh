#!/bin/sh
# Like the official image: RABBITMQ_DEFAULT_USER and RABBITMQ_DEFAULT_PASS create the first user,
# logs go to stdout, and the server runs as the rabbitmq user.
set -e
if [ "$1" = rabbitmq-server ]; then
  conf=/etc/rabbitmq/rabbitmq.conf
  cat >"$conf" <<CONF
listeners.tcp.default = 5672
management.tcp.port = 15672
loopback_users = none
log.console = true
log.console.level = info
log.file = false
CONF
  if [ -n "${RABBITMQ_DEFAULT_USER:-}" ]; then echo "default_user = $RABBITMQ_DEFAULT_USER" >>"$conf"; fi
  if [ -n "${RABBITMQ_DEFAULT_PASS:-}" ]; then echo "default_pass = $RABBITMQ_DEFAULT_PASS" >>"$conf"; fi
  chown -R rabbitmq:rabbitmq /var/lib/rabbitmq
  cd /var/lib/rabbitmq
  export RABBITMQ_LOGS=-
  exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups /usr/lib/rabbitmq/bin/rabbitmq-server
fi
exec "$@"
