#!/usr/bin/env bash
# Container entry point of a site: starts FEDWAN_RANKS processes in this
# container, one per rank (`fedwan site --ranks N --rank R --rendezvous DIR`;
# rank 0 is the leader), and waits for them. All ranks of a site run in one
# container because the ranks' Gloo communicator listens on 127.0.0.1.
#
# The exit status tells the Job what happened:
#   0    the site finished the federation (the Job completes)
#   143  it was stopped by SIGTERM before the end (eviction, preemption): it
#        checkpointed, and the Job starts it again; it resumes from there
#   else a rank failed; the others are stopped and the Job starts the site
#        again (every rank together, with a fresh rendezvous directory)
#
# Environment: FEDWAN_NODE (required), FEDWAN_RANKS (default 1), FEDWAN_DEVICE,
# FEDWAN_TOPOLOGY, FEDWAN_CREDENTIALS, FEDWAN_DATA (the PersistentVolume),
# FEDWAN_JOIN_TIMEOUT, FEDWAN_METRICS (host:port where rank 0 serves metrics),
# FEDWAN_METRICS_TOKEN_FILE (the bearer token they require),
# FEDWAN_WORKLOAD_ARGS, FEDWAN_EXTRA_ARGS, FEDWAN_BIN.
set -uo pipefail
: "${FEDWAN_NODE:?set FEDWAN_NODE to the site id in the topology}"
bin="${FEDWAN_BIN:-fedwan}"
data="${FEDWAN_DATA:-/var/lib/fedwan}"
ranks="${FEDWAN_RANKS:-1}"
rendezvous="${TMPDIR:-/tmp}/fedwan-rendezvous"
report="$data/$FEDWAN_NODE.report.json"
common=(site --topology "${FEDWAN_TOPOLOGY:-/etc/fedwan/topology/topology.yaml}"
        --node "$FEDWAN_NODE" --credentials "${FEDWAN_CREDENTIALS:-/etc/fedwan/credentials}"
        --device "${FEDWAN_DEVICE:-auto}" --join-timeout "${FEDWAN_JOIN_TIMEOUT:-3600}")
[ -n "${FEDWAN_METRICS:-}" ] && common+=(--metrics "$FEDWAN_METRICS")
[ -n "${FEDWAN_METRICS_TOKEN_FILE:-}" ] &&
  common+=(--metrics-token-file "$FEDWAN_METRICS_TOKEN_FILE")
# Fresh on every start: addresses the ranks of an earlier start left would
# be taken for live ranks.
rm -rf "$rendezvous"
mkdir -p "$rendezvous" "$data" || exit 1
rm -f "$report"

declare -A running=()  # pid -> rank
stopping=0
stop_all() { [ "${#running[@]}" -gt 0 ] && kill -TERM "${!running[@]}" 2>/dev/null; }
trap 'stopping=1; stop_all' TERM INT
for ((r = 0; r < ranks; r++)); do
  args=("${common[@]}")
  [ "$ranks" -gt 1 ] && args+=(--ranks "$ranks" --rank "$r" --rendezvous "$rendezvous")
  # The leader alone keeps the checkpoints, the audit log and the report.
  [ "$r" -eq 0 ] && args+=(--checkpoint-dir "$data/checkpoints"
                           --audit-log "$data/$FEDWAN_NODE.audit.jsonl"
                           --report "$report" --out "$data/$FEDWAN_NODE.model.bin")
  # shellcheck disable=SC2086
  "$bin" "${args[@]}" ${FEDWAN_WORKLOAD_ARGS:-} ${FEDWAN_EXTRA_ARGS:-} \
    > >(sed -u "s/^/[rank $r] /") 2>&1 &
  running[$!]=$r
  [ "$r" -eq 0 ] && echo "$!" >"${TMPDIR:-/tmp}/fedwan.pid"
done

# The first rank to fail stops the others: a site's communicator cannot be
# repaired in place, the site restarts whole.
rc=0
while [ "${#running[@]}" -gt 0 ]; do
  done_pid=""
  wait -n -p done_pid "${!running[@]}"
  code=$?
  [ -z "${done_pid:-}" ] && continue  # a trapped signal interrupted the wait
  r="${running[$done_pid]}"
  unset "running[$done_pid]"
  if [ "$code" -ne 0 ] && [ "$rc" -eq 0 ]; then
    rc=$code
    [ "$stopping" -eq 0 ] && echo "fedwan: rank $r of '$FEDWAN_NODE' failed (exit $code); stopping the others"
    stop_all
  fi
done
rm -rf "$rendezvous" "${TMPDIR:-/tmp}/fedwan.pid"
if [ "$rc" -ne 0 ] && [ "$stopping" -eq 0 ]; then
  exit "$rc"
fi
if grep -q '"stopped": true' "$report" 2>/dev/null || [ ! -e "$report" ]; then
  echo "fedwan: '$FEDWAN_NODE' stopped before the end of the federation; it resumes from its checkpoint"
  exit 143
fi
exit 0
