#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan in their own
# build directory and runs each one for a while on a scratch copy of its seed
# corpus.
#   scripts/fuzz.sh [SECONDS] [TARGET...]   SECONDS per target (default 30);
#                                           TARGETs default to every one built
# Exits non-zero when a target crashes (or leaks, times out, runs out of
# memory), naming the target and the input that did it. fuzz/README.md has
# the long-run command and how to reproduce a crash.
# Environment: FEDWAN_FUZZ_BUILD_DIR (default build-fuzz), FEDWAN_JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."

duration="${1:-30}"
shift || true
if ! [[ "$duration" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]" >&2
  echo "  SECONDS per target must be a positive integer, got '$duration'" >&2
  exit 2
fi
BUILD_DIR="${FEDWAN_FUZZ_BUILD_DIR:-build-fuzz}"
JOBS="${FEDWAN_JOBS:-$(nproc)}"
started=$(date +%s)

if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ not found; install clang and libclang-rt-14-dev (bash scripts/setup.sh)" >&2
  exit 1
fi

# Only the fuzzers: the rest of the tree is configured but none of it is built.
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Debug \
  -DFEDWAN_BUILD_FUZZERS=ON -DFEDWAN_WITH_TORCH=OFF -DFEDWAN_WITH_CUDA=OFF \
  -DFEDWAN_BUILD_TESTS=OFF -DFEDWAN_BUILD_BENCHMARKS=OFF -DFEDWAN_BUILD_EXAMPLES=OFF \
  -DFEDWAN_BUILD_PYTHON=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target fuzzers

manifest="$BUILD_DIR/fuzz/fuzzers.txt"
declare -A binary=()
built=()
skipped=()
while read -r verb name rest; do
  case "$verb" in
    run) binary[$name]="$rest"; built+=("$name") ;;
    skip) skipped+=("$name ($rest)") ;;
  esac
done <"$manifest"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=("${built[@]}"); fi
for t in "${targets[@]}"; do
  if [ -z "${binary[$t]:-}" ]; then
    echo "fuzz: no built target '$t'; built: ${built[*]}" >&2
    exit 2
  fi
done

scratch=$(mktemp -d "${TMPDIR:-/tmp}/fedwan-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
artifacts="$(pwd)/$BUILD_DIR/fuzz/artifacts"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

summary=()
failed=()
for t in "${targets[@]}"; do
  # New corpus entries go to the scratch copy, never into the repository.
  mkdir -p "$scratch/$t" "$artifacts/$t"
  if [ -d "fuzz/corpus/$t" ]; then cp -R "fuzz/corpus/$t/." "$scratch/$t/"; fi
  stamp="$scratch/$t.stamp"
  log="$scratch/$t.log"
  touch "$stamp"
  echo "fuzz: running $t for ${duration}s"
  rc=0
  "${binary[$t]}" -max_total_time="$duration" -rss_limit_mb=2048 -timeout=30 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$t/" "$scratch/$t" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  corpus=$(find "$scratch/$t" -type f | wc -l)
  if [ "$rc" -ne 0 ]; then
    crash=$(find "$artifacts/$t" -type f -newer "$stamp" | head -n 1)
    tail -n 60 "$log" >&2
    echo "fuzz: FAILED $t (exit $rc); input: ${crash:-none written, see the log above}" >&2
    failed+=("$t: ${crash:-exit $rc}; reproduce: ${binary[$t]} ${crash:-<input>}")
    summary+=("$(printf '%-12s FAILED  %s' "$t" "${crash:-exit $rc}")")
  else
    summary+=("$(printf '%-12s ok  %10s execs in %ss  corpus %s' \
      "$t" "${execs:-?}" "$duration" "$corpus")")
  fi
done

echo "fuzz: summary"
for line in "${summary[@]}"; do echo "  $line"; done
for s in "${skipped[@]}"; do echo "  SKIPPED $s"; done
echo "fuzz: total wall time $(($(date +%s) - started))s (build included)"
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) crashed:" >&2
  for f in "${failed[@]}"; do echo "  $f" >&2; done
  exit 1
fi
