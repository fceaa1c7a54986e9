#!/usr/bin/env bash
# Builds the library and its C++ tests with a sanitizer and runs them: the
# unit tests, then the integration tests. `address` is AddressSanitizer
# with UndefinedBehaviorSanitizer (and LeakSanitizer at exit), `thread`
# ThreadSanitizer. The build leaves out LibTorch, CUDA, Python, the
# benchmarks and the fuzzers, so it needs only what scripts/setup.sh
# installs. Any failed test or sanitizer report fails the run; the logs
# stay in BUILD_DIR/sanitize/.
#
#   scripts/sanitize.sh address|thread [BUILD_DIR]
#   FEDWAN_SANITIZE_FILTER   gtest filter for both binaries (default: all)
#   FEDWAN_SANITIZE_TIMEOUT  seconds each binary may take (default 3600)
#
# ThreadSanitizer sees nothing of what ZeroMQ's uninstrumented library does
# between its own threads (its queues hand messages from its I/O thread to
# the socket's owner): tests/tsan.supp leaves out reports inside
# libzmq.so; what fedwan hands to it is ordered for the sanitizer
# (common/thread_sanitizer.hpp). On the development machine (2 cores), with
# ThreadSanitizer: a build of about 25 minutes from nothing, the unit tests
# about 4 minutes, the integration tests about 13.
set -uo pipefail
cd "$(dirname "$0")/.."
KIND="${1:-}"
case "$KIND" in
  address | thread) ;;
  *)
    echo "usage: scripts/sanitize.sh address|thread [BUILD_DIR]" >&2
    exit 2
    ;;
esac
BUILD_DIR="${2:-build-$KIND}"
FILTER="${FEDWAN_SANITIZE_FILTER:-*}"
LIMIT="${FEDWAN_SANITIZE_TIMEOUT:-3600}"

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFEDWAN_SANITIZE="$KIND" \
  -DFEDWAN_WITH_TORCH=OFF -DFEDWAN_WITH_CUDA=OFF -DFEDWAN_BUILD_PYTHON=OFF \
  -DFEDWAN_BUILD_BENCHMARKS=OFF -DFEDWAN_BUILD_EXAMPLES=OFF -DFEDWAN_BUILD_FUZZERS=OFF \
  -DFEDWAN_BUILD_TESTS=ON >/dev/null || exit 2
OUT="$BUILD_DIR/sanitize"
mkdir -p "$OUT"
echo "sanitize ($KIND): building in $BUILD_DIR (log: $OUT/build.log) ..."
if ! cmake --build "$BUILD_DIR" -j "$(nproc)" --target fedwan_unit_tests \
  fedwan_integration_tests fedwan_aggregator_cli >"$OUT/build.log" 2>&1; then
  grep -E "error" "$OUT/build.log" | head -20 >&2
  echo "sanitize: the build failed (log: $OUT/build.log)" >&2
  exit 2
fi
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:print_summary=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=0"
export TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp:halt_on_error=0:report_signal_unsafe=0:history_size=4"

status=0
for binary in tests/fedwan_unit_tests tests/integration/fedwan_integration_tests; do
  name="$(basename "$binary")"
  log="$OUT/$name.log"
  echo "sanitize ($KIND): $name ..."
  timeout "$LIMIT" "$BUILD_DIR/$binary" --gtest_brief=1 --gtest_filter="$FILTER" >"$log" 2>&1
  rc=$?
  reports=$(grep -c -E "^(WARNING: ThreadSanitizer|==[0-9]+==ERROR: (Address|Leak)Sanitizer)|runtime error:" "$log")
  summary=$(grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$log" | tr '\n' ' ')
  echo "  exit $rc; sanitizer reports: $reports; $summary"
  if [ "$rc" -ne 0 ] || [ "$reports" -ne 0 ]; then
    status=1
    grep -E "^\[  FAILED  \]" "$log" | sort -u | sed 's/^/  /'
    echo "  log: $log"
  fi
done
exit "$status"
