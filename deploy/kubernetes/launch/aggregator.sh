#!/usr/bin/env bash
# Container entry point of an aggregator (root, region or the root's standby).
# Runs `fedwan aggregator` for FEDWAN_NODE, forwards SIGTERM to it (it stops at
# once; its last round boundary is checkpointed) and, once the federation is
# finished, keeps the pod idle instead of exiting, so that a StatefulSet does
# not start a finished aggregator again and its results stay readable
# (kubectl cp). Delete the marker FEDWAN_DATA/finished to run it again.
#
# Environment: FEDWAN_NODE (required), FEDWAN_STANDBY=1 for the standby,
# FEDWAN_TOPOLOGY, FEDWAN_CREDENTIALS, FEDWAN_DATA (the PersistentVolume),
# FEDWAN_JOIN_TIMEOUT, FEDWAN_METRICS (host:port to serve metrics at),
# FEDWAN_METRICS_TOKEN_FILE (the bearer token they require),
# FEDWAN_WORKLOAD_ARGS, FEDWAN_EXTRA_ARGS, FEDWAN_BIN.
set -uo pipefail
: "${FEDWAN_NODE:?set FEDWAN_NODE to the aggregator id in the topology}"
bin="${FEDWAN_BIN:-fedwan}"
data="${FEDWAN_DATA:-/var/lib/fedwan}"
name="$FEDWAN_NODE"
args=(aggregator --topology "${FEDWAN_TOPOLOGY:-/etc/fedwan/topology/topology.yaml}"
      --node "$FEDWAN_NODE" --credentials "${FEDWAN_CREDENTIALS:-/etc/fedwan/credentials}"
      --join-timeout "${FEDWAN_JOIN_TIMEOUT:-3600}")
[ -n "${FEDWAN_METRICS:-}" ] && args+=(--metrics "$FEDWAN_METRICS")
[ -n "${FEDWAN_METRICS_TOKEN_FILE:-}" ] && args+=(--metrics-token-file "$FEDWAN_METRICS_TOKEN_FILE")
if [ "${FEDWAN_STANDBY:-0}" = 1 ]; then
  args+=(--standby)
  name="$FEDWAN_NODE.standby"
fi
# A root (or a standby that took over) writes its report and the final
# model here; a region ignores these flags.
args+=(--checkpoint-dir "$data/checkpoints" --audit-log "$data/$name.audit.jsonl"
       --report "$data/$name.report.json" --out "$data/$name.model.bin")

idle() {
  echo "fedwan: '$name' finished the federation; results in $data (delete $data/finished to run it again)"
  trap 'exit 0' TERM INT
  while :; do sleep 3600 & wait $!; done
}
[ -e "$data/finished" ] && idle
mkdir -p "$data" || exit 1

# Word splitting of the flag lists is intended.
# shellcheck disable=SC2086
"$bin" "${args[@]}" ${FEDWAN_WORKLOAD_ARGS:-} ${FEDWAN_EXTRA_ARGS:-} &
pid=$!
echo "$pid" >"${TMPDIR:-/tmp}/fedwan.pid"
stopping=0
trap 'stopping=1; kill -TERM "$pid" 2>/dev/null' TERM INT
while :; do
  wait "$pid"
  rc=$?
  kill -0 "$pid" 2>/dev/null || break
done
rm -f "${TMPDIR:-/tmp}/fedwan.pid"
if [ "$rc" -eq 0 ] && [ "$stopping" -eq 0 ]; then
  touch "$data/finished"
  idle
fi
exit "$rc"
