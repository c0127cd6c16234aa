#!/usr/bin/env bash
# `make run`: serve until Ctrl-C or SIGTERM, then end quietly. The server drains and exits by the
# signal (as a process manager expects); make would report that as "make: *** [run] Terminated",
# which reads as a failure, so this wrapper, make's child, passes a SIGTERM on to the server, waits
# for its drain and exits 0 for a stop that was asked for. Ctrl-C reaches the server directly (the
# terminal signals the whole process group). Arguments go to `python -m app.server`.
set -u
cd "$(dirname "$0")/.."
.venv/bin/python -m app.server "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null' TERM HUP
trap ':' INT
while :; do
    wait "$pid"
    status=$?
    kill -0 "$pid" 2>/dev/null || break  # wait returned for a trapped signal: the server is still draining
done
case $status in
    0 | 130 | 143) exit 0 ;;  # stopped as asked (130: SIGINT, 143: SIGTERM)
    *) exit "$status" ;;
esac
