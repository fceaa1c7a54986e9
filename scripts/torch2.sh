#!/usr/bin/env bash
# fedwan against the LibTorch inside PyPI's `torch` wheel (2.x, C++20, CUDA
# build), the one most users have: builds the torch-facing targets in their
# own tree, runs the torch-facing tests, the Gloo engine's tests (over that
# LibTorch's Gloo, through c10d), a demo
# federation whose sites have two ranks, and the installed-package consumer;
# then the Python package as a user gets it: `pip install .` into the same
# venv (pip's NumPy 2 and pybind11), the pytest suite against the installed
# package (not the build tree), its type stubs under mypy, and the Python
# examples with torchrun. Called by `scripts/quickstart.sh test` after the Debian (LibTorch 1.13)
# build.
#
#   FEDWAN_TORCH2_SPEC      pip requirement (default torch==2.15.0, the newest
#                           release when this was last checked)
#   FEDWAN_TORCH2_VENV      where the venv lives (kept between runs; made
#                           again when it cannot import torch)
#   FEDWAN_TORCH2_BUILD_DIR build tree (default build-torch2)
#   FEDWAN_BUILD_DIR        the Debian build, for the mixed-Gloo check
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

SPEC="${FEDWAN_TORCH2_SPEC:-torch==2.15.0}"
VENV="${FEDWAN_TORCH2_VENV:-$HOME/.cache/fedwan/venv-${SPEC//[^A-Za-z0-9.]/-}}"
BUILD_DIR="${FEDWAN_TORCH2_BUILD_DIR:-build-torch2}"
DEBIAN_BUILD="${FEDWAN_BUILD_DIR:-build}"
JOBS="${FEDWAN_JOBS:-$(nproc)}"
PYTHON=/usr/bin/python3
started=$(date +%s)
say() { echo "torch2: $*"; }

if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  say "creating $VENV with $SPEC (about 3 GB with its CUDA libraries)"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
fi
# dp-accounting: the reference the privacy accountant is checked against
# (bindings/python/tests/test_privacy.py).
if ! "$VENV/bin/python" -c "import torch, numpy, pytest, mypy, dp_accounting" >/dev/null 2>&1; then
  "$VENV/bin/pip" install -q --disable-pip-version-check "$SPEC" numpy pytest mypy dp-accounting
fi
TORCH_VERSION=$("$VENV/bin/python" -c "import torch; print(torch.__version__)")
PREFIX=$("$VENV/bin/python" -c "import torch; print(torch.utils.cmake_prefix_path)")
TORCH_LIB=$("$VENV/bin/python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
say "LibTorch $TORCH_VERSION from $PREFIX"

# The only flag beyond a normal build: where the wheel's CMake config is.
mkdir -p "$BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DFEDWAN_BUILD_TESTS=ON -DFEDWAN_BUILD_BENCHMARKS=OFF -DFEDWAN_BUILD_PYTHON=OFF \
  -DPython3_EXECUTABLE="$PYTHON" >"$BUILD_DIR/configure.log" 2>&1 ||
  { cat "$BUILD_DIR/configure.log"; exit 1; }
grep "^-- fedwan:" "$BUILD_DIR/configure.log" || true
cmake --build "$BUILD_DIR" -j "$JOBS" --target fedwan_cli fedwan_aggregator_cli fedwan_torch_tests \
  fedwan_unit_tests fedwan_libraries

say "what the shared libraries export (against this LibTorch's Gloo too)"
exported=()
for lib in src/libfedwan_core.so src/libfedwan.so cuda/libfedwan_cuda.so; do
  if [ -f "$BUILD_DIR/$lib" ]; then exported+=("$BUILD_DIR/$lib"); fi
done
"$PYTHON" scripts/check_exports.py nm "${exported[@]}"

say "torch-facing tests"
"$BUILD_DIR/tests/fedwan_torch_tests" --gtest_brief=1
say "the site communicator's Gloo engine over LibTorch's Gloo"
"$BUILD_DIR/tests/fedwan_unit_tests" --gtest_brief=1 --gtest_filter='GlooComm.*'

say "demo federation, sites of 2 ranks (Gloo)"
rm -rf "$BUILD_DIR/demo_ranks_smoke"
"$PYTHON" tests/integration/check_demo_report.py "$BUILD_DIR/bin/fedwan" \
  "$BUILD_DIR/demo_ranks_smoke" --max-ratio 0.54 --require-improvement \
  -- --rounds 3 --inner-steps 20 --ranks-per-site 2

say "installed package, used by a separate CMake project"
cmake -DFEDWAN_BUILD_DIR="$PWD/$BUILD_DIR" -DFEDWAN_SOURCE_DIR="$PWD" \
  -DCONSUMER_SOURCE_DIR="$PWD/examples/consumer" -DSCRATCH_DIR="$PWD/$BUILD_DIR/install-scratch" \
  -DBUILD_TYPE=Release -DPREFIX_PATH="$PREFIX" -DCXX_LAUNCHER="$(command -v ccache || true)" \
  -P tests/install/consumer_test.cmake

# A fedwan built against the system's Gloo, in a process where this
# LibTorch's Gloo comes first (as when a program links both), must say so
# instead of crashing: the Debian build's Gloo test with the wheel's
# libtorch_cpu loaded ahead of everything.
if [ -x "$DEBIAN_BUILD/tests/fedwan_unit_tests" ]; then
  say "a fedwan built for the system's Gloo refuses this LibTorch's Gloo"
  set +e
  mixed=$(LD_PRELOAD="$TORCH_LIB/libtorch_cpu.so" "$DEBIAN_BUILD/tests/fedwan_unit_tests" \
    --gtest_filter=GlooComm.OneRankNeedsNoPeers 2>&1)
  set -e
  if ! grep -q "the process runs Gloo's code from .*libtorch_cpu.so" <<<"$mixed"; then
    echo "torch2: expected the mixed-Gloo ConfigError; got:" >&2
    echo "$mixed" >&2
    exit 1
  fi
  grep -m1 -o "this fedwan was built against the system's Gloo.*" <<<"$mixed" | cut -c1-160
fi
say "the Python package: pip install . into the venv"
pip_started=$(date +%s)
"$VENV/bin/pip" uninstall -q -y fedwan >/dev/null 2>&1 || true
"$VENV/bin/pip" install -q --disable-pip-version-check .
say "installed in $(( $(date +%s) - pip_started )) s"
# Run from a directory with no fedwan sources, so that `import fedwan` can
# only find the installed package.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
installed=$(cd "$scratch" && "$VENV/bin/python" -c \
  "import fedwan, numpy; print(fedwan.__file__, fedwan.__version__, numpy.__version__)")
case "$installed" in
  "$VENV"/*) say "import fedwan: $installed" ;;
  *) echo "torch2: import fedwan found $installed, not the venv's package" >&2; exit 1 ;;
esac
say "Python suite against the installed package (torch $TORCH_VERSION)"
# FEDWAN_BUILD_DIR: the Debian build's benchmarks, which the results tests run.
(cd "$scratch" && FEDWAN_CLI="$ROOT/$BUILD_DIR/bin/fedwan" FEDWAN_SOURCE_DIR="$ROOT" \
  FEDWAN_BUILD_DIR="$ROOT/$DEBIAN_BUILD" "$VENV/bin/python" -m pytest -q \
  -p no:cacheprovider "$ROOT/bindings/python/tests")
say "type stubs (mypy, stubtest) against the installed package"
(cd "$scratch" && bash "$ROOT/scripts/typecheck.sh" "$VENV/bin/python")
say "example: a site of 2 ranks under torchrun (DDP), C++ aggregators"
(cd "$scratch" && "$VENV/bin/python" "$ROOT/examples/python/launch.py" \
  --cli "$ROOT/$BUILD_DIR/bin/fedwan" --launcher torchrun --sites 2 --ranks-per-site 2 \
  --rounds 2 --inner-steps 10 --max-samples 1000 --eval-samples 1000 --timeout 240)
say "passed against LibTorch $TORCH_VERSION in $(( $(date +%s) - started )) s"
