#!/usr/bin/env bash
# Make sure a Docker engine answers; start one only when none does, and record that we did.
#
# A daemon started here is recorded in $TFSHIP_DOCKERD_STATE (pid file + log beside it) so that
# stop-dockerd.sh stops exactly that daemon and nothing else. An engine that was already reachable
# (Docker Desktop, a system service, CI's) is left alone and nothing is recorded.
#
# Env:
#   TFSHIP_DOCKERD_STATE  folder for dockerd.pid / dockerd.log (default: /tmp/tfship-dockerd)
#   TFSHIP_DOCKERD_ARGS   extra dockerd flags (default: overlay2, no iptables, no bridge: this machine
#                         has no bridge networking, so containers and builds use --network host)
#   DOCKERD_WAIT_S        seconds to wait for the new daemon (default 60)
set -euo pipefail

STATE="${TFSHIP_DOCKERD_STATE:-/tmp/tfship-dockerd}"
ARGS="${TFSHIP_DOCKERD_ARGS:---storage-driver=overlay2 --iptables=false --bridge=none}"
WAIT_S="${DOCKERD_WAIT_S:-60}"

reachable() { docker info >/dev/null 2>&1; }

if reachable; then
  echo "ensure-dockerd: a Docker engine is already reachable; leaving it alone"
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  echo "ensure-dockerd: no Docker engine reachable and no dockerd on PATH." >&2
  echo "  install one: apt-get update && apt-get install -y docker.io" >&2
  exit 1
fi
if [[ "$(id -u)" != "0" ]]; then
  echo "ensure-dockerd: starting dockerd needs root (uid is $(id -u)); start Docker yourself" >&2
  exit 1
fi

mkdir -p "$STATE"
if [[ -f "$STATE/dockerd.pid" ]] && kill -0 "$(cat "$STATE/dockerd.pid")" 2>/dev/null; then
  echo "ensure-dockerd: dockerd we started earlier (pid $(cat "$STATE/dockerd.pid")) is still starting"
else
  # shellcheck disable=SC2086  # ARGS is a flag list on purpose
  setsid nohup dockerd $ARGS >"$STATE/dockerd.log" 2>&1 &
  echo $! >"$STATE/dockerd.pid"
  echo "ensure-dockerd: started dockerd (pid $!), log: $STATE/dockerd.log"
fi

for _ in $(seq "$WAIT_S"); do
  if reachable; then
    echo "ensure-dockerd: engine is up"
    exit 0
  fi
  if ! kill -0 "$(cat "$STATE/dockerd.pid")" 2>/dev/null; then
    echo "ensure-dockerd: dockerd exited; last log lines:" >&2
    tail -n 20 "$STATE/dockerd.log" >&2
    rm -f "$STATE/dockerd.pid"
    exit 1
  fi
  sleep 1
done
echo "ensure-dockerd: dockerd did not answer within ${WAIT_S}s; see $STATE/dockerd.log" >&2
exit 1
