#!/usr/bin/env bash
# make cluster-check: a real two-node Ray cluster on this machine, each node in a network namespace of its own
# (benchmarks/cluster_check.py says what it checks). Root only (ip netns). Creates, and deletes on any exit:
#   <P>-svc  10.231.0.254 on bridge <P>-br: the driver, PostgreSQL (the shared job store), Prometheus
#   <P>-n1   10.231.0.1   veth to the bridge: the Ray head node (one CPU, one replica)
#   <P>-n2   10.231.0.2   veth to the bridge: the Ray worker node (one CPU, one replica), killed mid-job
# with P=idgc<this shell's pid>, and a temporary folder for every file (nothing is written into the checkout).
# Traffic stays inside those namespaces. The last line is the summary: cluster-check: N nodes, R replicas, ...
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=$ROOT/.venv/bin/python
[ "$(id -u)" = 0 ] || { echo "cluster-check: needs root (ip netns)" >&2; exit 2; }
[ -x "$PY" ] && "$PY" -c 'import ray.serve, psycopg' 2>/dev/null \
  || { echo "cluster-check: needs .venv with ray[serve] and psycopg (scripts/setup.sh dev)" >&2; exit 2; }
P=idgc$$
TMP=$(mktemp -d /tmp/idgc-XXXXXX)   # short: Ray's unix sockets live under it
chmod 755 "$TMP"                     # PostgreSQL runs as the postgres user
SUMMARY=$TMP/summary

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for ns in $P-n2 $P-n1 $P-svc; do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
  done
  sleep 1
  for ns in $P-n2 $P-n1 $P-svc; do ip netns del "$ns" 2>/dev/null || true; done
  local line
  line=$(cat "$SUMMARY" 2>/dev/null || echo "cluster-check: FAILED before any figure (exit $rc)")
  rm -rf "$TMP"
  echo "$line"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add $P-svc
ip netns add $P-n1
ip netns add $P-n2
ip -n $P-svc link add $P-br type bridge
ip -n $P-svc addr add 10.231.0.254/24 dev $P-br
ip -n $P-svc link set $P-br up
ip -n $P-svc link set lo up
for i in 1 2; do
  ip link add $P-v$i netns $P-n$i type veth peer name $P-p$i netns $P-svc
  ip -n $P-n$i addr add 10.231.0.$i/24 dev $P-v$i
  ip -n $P-n$i link set $P-v$i up
  ip -n $P-n$i link set lo up
  ip -n $P-svc link set $P-p$i master $P-br up
done

# 15 minutes at most in all; the driver stops what it started on SIGTERM, the trap above the rest
timeout --kill-after=30 ${CLUSTER_CHECK_TIMEOUT_S:-840} ip netns exec $P-svc "$PY" -m benchmarks.cluster_check \
  --root "$TMP" --head-ns $P-n1 --worker-ns $P-n2 --summary "$SUMMARY" "$@"
