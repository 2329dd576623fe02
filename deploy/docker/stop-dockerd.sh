#!/usr/bin/env bash
# Stop the Docker engine that ensure-dockerd.sh started, and only that one.
# Does nothing when ensure-dockerd.sh found an engine already running (no pid recorded).
set -euo pipefail

STATE="${TFSHIP_DOCKERD_STATE:-/tmp/tfship-dockerd}"
PIDFILE="$STATE/dockerd.pid"
WAIT_S="${DOCKERD_WAIT_S:-60}"

if [[ ! -f "$PIDFILE" ]]; then
  echo "stop-dockerd: no dockerd was started by ensure-dockerd.sh; nothing to stop"
  exit 0
fi
pid="$(cat "$PIDFILE")"
if ! kill -0 "$pid" 2>/dev/null; then
  echo "stop-dockerd: recorded dockerd (pid $pid) is no longer running"
  rm -f "$PIDFILE"
  exit 0
fi
# Refuse to signal a recycled pid that is not a dockerd.
if [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "dockerd" ]]; then
  echo "stop-dockerd: pid $pid is not dockerd any more; removing the stale record" >&2
  rm -f "$PIDFILE"
  exit 0
fi
kill -TERM "$pid"
for _ in $(seq "$WAIT_S"); do
  if ! kill -0 "$pid" 2>/dev/null; then
    rm -f "$PIDFILE"
    echo "stop-dockerd: stopped dockerd (pid $pid)"
    exit 0
  fi
  sleep 1
done
echo "stop-dockerd: dockerd (pid $pid) still running after ${WAIT_S}s" >&2
exit 1
