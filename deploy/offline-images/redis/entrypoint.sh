#!/bin/sh
# Like the official image: arguments starting with '-' are options of redis-server, which runs as
# the redis user in /data. Debian builds redis with protected mode on, which refuses clients of
# other containers when no password is set; the official image has it off, and so has this one.
set -e
case "$1" in -*) set -- redis-server "$@" ;; esac
if [ "$1" = redis-server ]; then
  shift
  set -- redis-server --protected-mode no "$@"
  if [ "$(id -u)" = 0 ]; then
    chown -R redis:redis /data
    exec setpriv --reuid=redis --regid=redis --init-groups "$@"
  fi
fi
exec "$@"
