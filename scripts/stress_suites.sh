#!/usr/bin/env bash
# Runs the chaos, fault-injection and striped-link suites again and again
# beside a CPU-bound load (one busy process per core by default), to expose
# races that an idle machine hides. Every repetition runs the whole set; a
# test that fails once is a bug, so the summary lists each failure with the
# repetition it happened in and the log of that repetition is kept.
#
#   scripts/stress_suites.sh [BUILD_DIR]
#   FEDWAN_STRESS_REPEAT   repetitions (default 20)
#   FEDWAN_STRESS_LOAD     busy processes beside the tests (default: nproc)
#   FEDWAN_STRESS_JOBS     ctest -j (default: nproc)
#   FEDWAN_STRESS_REGEX    which tests (default: the suites above)
#   FEDWAN_STRESS_OUT      where logs and the summary go (default BUILD_DIR/stress)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
REPEAT="${FEDWAN_STRESS_REPEAT:-20}"
LOAD="${FEDWAN_STRESS_LOAD:-$(nproc)}"
JOBS="${FEDWAN_STRESS_JOBS:-$(nproc)}"
REGEX="${FEDWAN_STRESS_REGEX:-^(Chaos|ChaosOverlap|FaultLane|FaultProxy|FaultProxyZmq|FaultSpec|FaultyTransportTest|StripedLinks|TransportFaults|TransportDecorator)[./]|^demo_chaos_}"
OUT="${FEDWAN_STRESS_OUT:-$BUILD_DIR/stress}"

if [ ! -f "$BUILD_DIR/CTestTestfile.cmake" ]; then
  echo "stress: $BUILD_DIR is not a configured build tree (build it first)" >&2
  exit 2
fi
OUT="$(mkdir -p "$OUT" && cd "$OUT" && pwd)"
count=$(cd "$BUILD_DIR" && ctest -N -R "$REGEX" | sed -n 's/^Total Tests: //p')
if [ "${count:-0}" -eq 0 ]; then
  echo "stress: no test matches $REGEX" >&2
  exit 2
fi

load_pids=()
stop_load() {
  for p in "${load_pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap stop_load EXIT
for _ in $(seq 1 "$LOAD"); do
  (while :; do :; done) &
  load_pids+=($!)
done

echo "stress: $count tests x $REPEAT repetitions, ctest -j$JOBS, $LOAD busy processes beside them"
: >"$OUT/failures.txt"
passed=0
for i in $(seq 1 "$REPEAT"); do
  start=$(date +%s)
  (cd "$BUILD_DIR" && ctest -j "$JOBS" -R "$REGEX" --output-on-failure) >"$OUT/run-$i.log" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1))
    rm -f "$OUT/run-$i.log"
    echo "stress: repetition $i passed ($took s)"
  else
    sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (\(.*\))$/\1 (\2)/p' "$OUT/run-$i.log" |
      sed "s/^/repetition $i: /" | tee -a "$OUT/failures.txt"
    echo "stress: repetition $i FAILED ($took s); log kept in $OUT/run-$i.log"
  fi
done
echo "stress: $passed of $REPEAT repetitions passed" | tee "$OUT/summary.txt"
cat "$OUT/failures.txt" >>"$OUT/summary.txt"
[ "$passed" -eq "$REPEAT" ]
