#!/usr/bin/env bash
# The two Quickstart commands:
#   scripts/quickstart.sh demo [fedwan demo flags...]  install, build, run the demo federation
#   scripts/quickstart.sh test                         install, build, run every test (C++ and
#                                                      Python) against Debian's LibTorch 1.13,
#                                                      the GPU check (skipping what needs a GPU),
#                                                      the torch-facing ones again against pip's
#                                                      torch 2.x (scripts/torch2.sh), then fuzz
#                                                      each target briefly
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
shift || true
BUILD_DIR="${FEDWAN_BUILD_DIR:-build}"
JOBS="${FEDWAN_JOBS:-$(nproc)}"
# Debian's interpreter: it is the one python3-torch and pybind11 belong to.
PYTHON="${FEDWAN_PYTHON:-/usr/bin/python3}"

bash scripts/setup.sh

# Paths under the checkout reach the compiler cache relative, so two builds
# (and two checkouts) of the same sources share its entries.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"

configure() {
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
    -DPython3_EXECUTABLE="$PYTHON" -DPYTHON_EXECUTABLE="$PYTHON" "$@"
}

case "$mode" in
  demo)
    configure -DFEDWAN_BUILD_TESTS=OFF -DFEDWAN_BUILD_BENCHMARKS=OFF
    cmake --build "$BUILD_DIR" -j "$JOBS" --target fedwan_cli fedwan_aggregator_cli
    exec "$BUILD_DIR/bin/fedwan" demo "$@"
    ;;
  test)
    # No include runs upward between the library's folders
    # (docs/architecture.md, "Layers").
    "$PYTHON" scripts/check_layering.py .
    configure -DFEDWAN_BUILD_TESTS=ON -DFEDWAN_BUILD_BENCHMARKS=ON
    # clang-format over every C++ file, clang-tidy over the library sources
    # changed (scripts/lint.sh says against what); before the build, from
    # the compile commands the configure wrote.
    FEDWAN_JOBS="$JOBS" bash scripts/lint.sh "$BUILD_DIR"
    cmake --build "$BUILD_DIR" -j "$JOBS"
    # ctest runs the C++ suites, the demo checks and the Python suite
    # (registered as python_bindings).
    (cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS")
    # Every GPU test and benchmark in one go (docs/benchmarks.md, "GPU
    # check"): without a GPU it runs as far as it can and says what it
    # skipped and why.
    "$PYTHON" scripts/gpu_check.py --build-dir "$BUILD_DIR" --out "$BUILD_DIR/gpu-check"
    # The same torch-facing tests and demo against the LibTorch of PyPI's
    # torch wheel (2.x), in a venv; FEDWAN_SKIP_TORCH2=1 skips it.
    if [ "${FEDWAN_SKIP_TORCH2:-0}" != 1 ]; then
      FEDWAN_BUILD_DIR="$BUILD_DIR" bash scripts/torch2.sh
    fi
    # A short fuzzing pass over every fuzz target (own clang build in
    # build-fuzz); fuzz/README.md has the long run.
    bash scripts/fuzz.sh "${FEDWAN_FUZZ_SECONDS:-15}"
    ;;
  *)
    echo "usage: scripts/quickstart.sh demo|test [args...]" >&2
    exit 2
    ;;
esac
