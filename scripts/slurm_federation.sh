#!/usr/bin/env bash
# Runs a real federation under Slurm on this one machine, with the recipe in
# deploy/slurm/: installs Slurm and MUNGE (Debian 12, idempotent), starts
# munged, slurmctld and slurmd from a generated configuration in a temporary
# directory, provisions a small topology (root, 1 region, 2 sites of N ranks)
# and its credentials, submits deploy/slurm/aggregators.sbatch and one
# deploy/slurm/site.sbatch per site, and checks both ways a site job is
# started again: site-0 runs under a 1-minute time limit, so the recipe's
# SIGUSR1 stops it (it checkpoints) and requeues it, maybe more than once;
# site-1 is requeued in the middle of the federation as a preemption would.
# Both must resume from their checkpoints. It waits for every job (bounded),
# checks the result, prints a summary and tears Slurm down again, also on
# failure or Ctrl-C.
#
#   sudo bash scripts/slurm_federation.sh [--rounds 20] [--ranks 2] [--inner-steps 20]
#                                         [--timeout 900] [--no-restarts] [--keep]
#                                         [--fedwan build/bin/fedwan]
#
# Needs root (it starts the Slurm daemons). Everything it writes is under one
# temporary directory (removed at the end unless --keep); every address is
# on loopback. Exit 0: every job completed and the root reported every round.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

rounds=20
ranks=2
inner_steps=20
timeout_s=900
restart_test=1
keep=0
fedwan="$repo/build/bin/fedwan"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --inner-steps) inner_steps="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --no-restarts) restart_test=0; shift ;;
    --keep) keep=1; shift ;;
    --fedwan) fedwan="$(realpath "$2")"; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "slurm_federation: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

say() { echo "slurm_federation: $*"; }
die() { echo "slurm_federation: ERROR: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root: it starts munged, slurmctld and slurmd"
[ -x "$fedwan" ] || die "no fedwan executable at $fedwan (build it, or pass --fedwan PATH)"
if [ "$restart_test" -eq 1 ] && [ "$rounds" -lt 10 ]; then
  die "--rounds must be at least 10 for the restart checks (or pass --no-restarts)"
fi

# --- packages (idempotent) ---------------------------------------------------
need=()
command -v slurmctld >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || need+=(munge)
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need+=(dataset-fashion-mnist)
if [ "${#need[@]}" -gt 0 ]; then
  say "installing ${need[*]}"
  apt-get update -qq
  # The packages' own services are not started (the daemons below are ours).
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" \
    >/dev/null
fi

# --- a private Slurm ---------------------------------------------------------
work="$(mktemp -d /tmp/fedwan-slurm.XXXXXX)"
chmod 711 "$work"
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  export SLURM_CONF="$work/slurm.conf"
  local f pid
  # Jobs still running (a failure, a timeout, Ctrl-C): end them before the
  # daemons go, so that no node of the federation outlives this script.
  if [ -f "$work/slurmctld.pid" ] && [ -n "$(squeue -h -o %i 2>/dev/null || true)" ]; then
    scancel --user=root >/dev/null 2>&1 || true
    for _ in $(seq 30); do
      [ -z "$(squeue -h -o %i 2>/dev/null || true)" ] && break
      sleep 1
    done
  fi
  for f in slurmd slurmctld munge/munged; do
    pid="$(cat "$work/$f.pid" 2>/dev/null || true)"
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
  done
  for f in slurmd slurmctld munge/munged; do
    pid="$(cat "$work/$f.pid" 2>/dev/null || true)"
    [ -n "$pid" ] || continue
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
  done
  if [ "$keep" -eq 1 ]; then
    say "kept $work"
  else
    rm -rf "$work"
  fi
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_ports() {  # N free loopback TCP ports
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}
read -r ctld_port slurmd_port root_port region_port <<<"$(free_ports 4)"

mkdir -p "$work/munge" "$work/state" "$work/spool" "$work/log"
mungekey --create --keyfile="$work/munge/munge.key"
# -f: the key and the socket are root's, not the munge user's.
munged -f --socket="$work/munge/munge.sock" --key-file="$work/munge/munge.key" \
  --log-file="$work/munge/munged.log" --pid-file="$work/munge/munged.pid" \
  --seed-file="$work/munge/munged.seed"

# The machine's real CPUs and memory, as slurmd sees them, on a node named
# localhost.
node_line="$(slurmd -C | head -n 1 | sed 's/^NodeName=[^ ]*/NodeName=localhost NodeAddr=127.0.0.1/')"
cat >"$work/slurm.conf" <<EOF
ClusterName=fedwan-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
# No cgroups, no accounting: processes are tracked by their parent chain.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=30
MinJobAge=3600
$node_line State=UNKNOWN
# Up to 8 jobs per core: the root, a region and 2 sites x N ranks on 2 cores.
PartitionName=fedwan Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
export SLURM_CONF="$work/slurm.conf"
slurmctld -f "$SLURM_CONF" -i
slurmd -f "$SLURM_CONF" -N localhost
for _ in $(seq 60); do
  state="$(sinfo -h -n localhost -o %T 2>/dev/null || true)"
  [ "$state" = idle ] && break
  sleep 1
done
[ "$state" = idle ] || { tail -n 20 "$work/log/slurmctld.log" "$work/log/slurmd.log"; die "the Slurm node did not come up (state '$state')"; }
say "Slurm up in $work: $(sinfo -h -o '%P %D node(s) %c CPUs %m MB %T')"

# --- the federation -----------------------------------------------------------
fed="$work/federation"
mkdir -p "$fed"
cat >"$fed/topology.yaml" <<EOF
job: fedwan-slurm-test
federation:
  rounds: $rounds
  inner_steps: $inner_steps
  codec: fp16
  outer_optimizer: {name: diloco}
nodes:
  - {id: root, role: root, endpoint: "tcp://127.0.0.1:$root_port"}
  - {id: region-0, role: region, parent: root, endpoint: "tcp://127.0.0.1:$region_port"}
  - {id: site-0, role: site, parent: region-0}
  - {id: site-1, role: site, parent: region-0}
EOF
"$fedwan" certs init --topology "$fed/topology.yaml" --out "$fed/pki" >/dev/null

common="ALL,FEDWAN_BIN=$fedwan,FEDWAN_TOPOLOGY=$fed/topology.yaml,FEDWAN_CREDENTIALS_DIR=$fed/pki"
common+=",FEDWAN_CHECKPOINT_DIR=$fed/checkpoints,FEDWAN_OUT_DIR=$fed/out,FEDWAN_JOIN_TIMEOUT=300"
common+=",FEDWAN_WORKLOAD_ARGS=--trainer fashion-cnn --seed 1,FEDWAN_LOG_LEVEL=info"
cd "$fed"
agg_job="$(sbatch --parsable --ntasks=2 --cpus-per-task=1 --time=30 \
  --export="$common,FEDWAN_AGGREGATORS=root region-0" "$repo/deploy/slurm/aggregators.sbatch")"
site_jobs=()
for s in site-0 site-1; do
  limit=(--time=30)
  # site-0: SIGUSR1 15 s into each 1-minute run; the job stops the site and
  # requeues itself.
  [ "$restart_test" -eq 1 ] && [ "$s" = site-0 ] && limit=(--time=1 --signal=B:USR1@45)
  site_jobs+=("$(sbatch --parsable --ntasks="$ranks" --cpus-per-task=1 "${limit[@]}" \
    --job-name="fedwan-$s" --export="$common,FEDWAN_NODE=$s,FEDWAN_DEVICE=cpu" \
    "$repo/deploy/slurm/site.sbatch")")
done
jobs=("$agg_job" "${site_jobs[@]}")
say "submitted: aggregators job $agg_job, site jobs ${site_jobs[*]} ($ranks rank(s) each); $rounds rounds x $inner_steps steps"

show_logs() {
  say "job states:"
  for j in "${jobs[@]}"; do
    scontrol show job "$j" 2>/dev/null | grep -Eo '(JobId|JobName|JobState|Reason|ExitCode|Restarts)=[^ ]*' | paste -sd' ' || true
  done
  for f in "$fed"/*.out "$fed"/out/*.log "$work"/log/slurmctld.log; do
    [ -f "$f" ] && { echo "----- $f (last 25 lines)"; tail -n 25 "$f"; }
  done
}

job_state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }

# Slurm holds a requeued job back for a while (its BeginTime) before it may
# start again; here it may start at once.
release_requeued() {
  local j
  for j in $(squeue -h -t PD -o '%i %r' | awk '$2 == "BeginTime" {print $1}'); do
    scontrol update JobId="$j" StartTime=now
  done
}

# --- preempt one site mid-federation ------------------------------------------
start=$(date +%s)
deadline=$((start + timeout_s))
if [ "$restart_test" -eq 1 ]; then
  victim="${site_jobs[1]}"
  until grep -q "round   3/$rounds" "$fed/out/root.log" 2>/dev/null; do
    [ "$(date +%s)" -lt "$deadline" ] || { show_logs; die "timed out after ${timeout_s}s waiting for round 3"; }
    st="$(job_state "$agg_job")"
    case "$st" in PENDING|RUNNING|CONFIGURING|COMPLETING|"") ;; *) show_logs; die "the aggregators' job is $st before round 3" ;; esac
    release_requeued
    sleep 1
  done
  say "round 3 done; requeueing site-1's job $victim as a preemption would"
  scontrol requeue "$victim"
fi

# --- wait for every job ---------------------------------------------------------
while :; do
  pending=0
  for j in "${jobs[@]}"; do
    case "$(job_state "$j")" in
      COMPLETED) ;;
      PENDING|RUNNING|CONFIGURING|COMPLETING|REQUEUED|"") pending=1 ;;
      *) show_logs; die "job $j ended $(job_state "$j")" ;;
    esac
  done
  [ "$pending" -eq 0 ] && break
  release_requeued
  if [ "$(date +%s)" -ge "$deadline" ]; then
    show_logs
    die "timed out after ${timeout_s}s; the jobs above did not finish"
  fi
  sleep 2
done
elapsed=$(($(date +%s) - start))

# --- check the result --------------------------------------------------------------
failures=()
for j in "${jobs[@]}"; do
  code="$(scontrol show job "$j" | grep -o ' ExitCode=[0-9:]*' | cut -d= -f2)"
  [ "$code" = "0:0" ] || failures+=("job $j exit code $code")
done
summary="$(python3 - "$fed/out" "$rounds" site-0 site-1 <<'EOF'
import json, sys
out, rounds, sites = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
problems = []
root = json.load(open(f"{out}/root.report.json"))
got = [r["round"] for r in root["rounds"]]
if got != list(range(rounds)):
    problems.append(f"root reported rounds {got}, expected 0..{rounds - 1}")
lines = [f"root: {len(got)}/{rounds} rounds, final accuracy {root.get('final_accuracy', float('nan')):.4f}, "
         f"WAN {root['wan_bytes_total'] / 1e6:.2f} MB ({root['wan_bytes_total'] / root['fp32_bytes_total']:.3f} of fp32), "
         f"security {root['security']}"]
for s in sites:
    r = json.load(open(f"{out}/{s}.report.json"))
    if r["stopped"]:
        problems.append(f"{s} did not finish (its report says stopped)")
    last = max((x["round"] for x in r["rounds"]), default=-1)
    lines.append(f"{s}: finished={not r['stopped']}, synced rounds up to {last + 1}, "
                 f"sent {r['bytes_sent_total'] / 1e3:.1f} kB")
print("\n".join(lines))
for p in problems:
    print("PROBLEM: " + p)
EOF
)" || failures+=("could not read the reports")
while IFS= read -r l; do
  case "$l" in PROBLEM:*) failures+=("${l#PROBLEM: }") ;; esac
done <<<"$summary"
restart_of() { scontrol show job "$1" | grep -o 'Restarts=[0-9]*' | cut -d= -f2; }
resumed_line() { grep -h 'resumed from' "$fed/out/$1.log" | head -n 1 | sed 's/.*] resumed/resumed/'; }
if [ "$restart_test" -eq 1 ]; then
  restarts0="$(restart_of "${site_jobs[0]}")"
  restarts1="$(restart_of "${site_jobs[1]}")"
  [ "${restarts0:-0}" -ge 1 ] || failures+=("site-0's job was never requeued at its time limit")
  grep -q 'time limit near' "$fed"/fedwan-site-0-*.out ||
    failures+=("site-0's job did not see the time-limit signal")
  [ "${restarts1:-0}" -ge 1 ] || failures+=("site-1's job shows no restart after the requeue")
  resumed0="$(resumed_line site-0)"
  resumed1="$(resumed_line site-1)"
  [ -n "$resumed0" ] || failures+=("site-0 did not resume from its checkpoint after the time limit")
  [ -n "$resumed1" ] || failures+=("site-1 did not resume from its checkpoint after the requeue")
fi
for a in "$fed"/out/audit/*.jsonl; do
  "$fedwan" audit verify "$a" --ca "$fed/pki/ca/ca.pem" >/dev/null 2>&1 ||
    failures+=("audit log $(basename "$a") does not verify")
done

if [ "${#failures[@]}" -gt 0 ]; then
  show_logs
  for f in "${failures[@]}"; do echo "slurm_federation: FAILED: $f" >&2; done
  exit 1
fi
say "root's rounds:"
grep -E '^round ' "$fed/out/root.log" | sed 's/^/  /'
while IFS= read -r l; do echo "  $l"; done <<<"$summary"
if [ "$restart_test" -eq 1 ]; then
  say "site-0 (time limit 1 min, SIGUSR1 at 15 s): requeued $restarts0 time(s); first restart $resumed0"
  say "site-1 (requeued after round 3): requeued $restarts1 time(s); $resumed1"
fi
say "PASSED: aggregators + 2 sites x $ranks rank(s) under Slurm, all ${#jobs[@]} jobs COMPLETED, $rounds rounds, every audit log verifies, ${elapsed}s"
