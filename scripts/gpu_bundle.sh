#!/usr/bin/env bash
# Builds here what the GPU check (scripts/gpu_check.py) needs on a GPU machine
# that has its own PyTorch, CUDA and Python but no package registry and none
# of fedwan's other dependencies: the GPU tests, the GPU benchmarks and the
# `fedwan` program, built against the same LibTorch release as that
# machine's PyTorch, with every library they need that such a machine lacks
# (ZeroMQ, OpenSSL, spdlog, fmt, GoogleTest, ...), and Fashion-MNIST for the
# demo step. LibTorch, CUDA's runtime and NCCL are that machine's own: the
# check puts them on the library path.
#
#   scripts/gpu_bundle.sh [BUNDLE_DIR]        (default .gpu-bundle, git-ignored)
#
#   FEDWAN_GPU_TORCH_SPEC   the LibTorch to build against, as a pip requirement
#                           (default torch==2.11.0: the GPU machine's PyTorch)
#   FEDWAN_GPU_ARCHS        CUDA architectures (default 90: H100 and H200)
#   FEDWAN_GPU_BUILD_DIR    build tree (default build-gpu)
#   FEDWAN_GPU_BUNDLE_DATA  0 leaves Fashion-MNIST out (the demo step then skips)
#   FEDWAN_GPU_BUNDLE_MAX_MIB  size limit of the bundle plus the working tree (default 64)
#
# Then, on the GPU machine, from the repository root with the bundle beside it:
#   python3 scripts/gpu_check.py --bundle .gpu-bundle --out OUT --require-gpu
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BUNDLE="${1:-.gpu-bundle}"
SPEC="${FEDWAN_GPU_TORCH_SPEC:-torch==2.11.0}"
ARCHS="${FEDWAN_GPU_ARCHS:-90}"
BUILD_DIR="${FEDWAN_GPU_BUILD_DIR:-build-gpu}"
MAX_MIB="${FEDWAN_GPU_BUNDLE_MAX_MIB:-64}"
VENV="${FEDWAN_GPU_VENV:-$HOME/.cache/fedwan/venv-${SPEC//[^A-Za-z0-9.]/-}}"
JOBS="${FEDWAN_JOBS:-$(nproc)}"
PYTHON=/usr/bin/python3
DATA=/usr/share/datasets/fashion-mnist
say() { echo "gpu-bundle: $*"; }

NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ ! -x "$NVCC" ]; then
  say "needs the CUDA toolkit (nvcc) to build the GPU side; scripts/setup.sh installs it"
  exit 2
fi
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  say "creating $VENV with $SPEC (about 4 GB with its CUDA libraries)"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$SPEC"
fi
TORCH_VERSION=$("$VENV/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null)
TORCH_CUDA=$("$VENV/bin/python" -c "import torch; print(torch.version.cuda or '')" 2>/dev/null)
PREFIX=$("$VENV/bin/python" -c "import torch; print(torch.utils.cmake_prefix_path)" 2>/dev/null)
if [ -z "$TORCH_CUDA" ]; then
  say "$SPEC has no CUDA: the GPU check needs a CUDA build of LibTorch"
  exit 2
fi
say "LibTorch $TORCH_VERSION (CUDA $TORCH_CUDA), architectures $ARCHS, build tree $BUILD_DIR"

export CCACHE_BASEDIR="$ROOT"
mkdir -p "$BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DFEDWAN_WITH_CUDA=ON -DFEDWAN_CUDA_ARCHITECTURES="$ARCHS" \
  -DFEDWAN_BUILD_TESTS=ON -DFEDWAN_BUILD_BENCHMARKS=ON -DFEDWAN_BUILD_PYTHON=OFF \
  -DPython3_EXECUTABLE="$PYTHON" >"$BUILD_DIR/configure.log" 2>&1 ||
  { cat "$BUILD_DIR/configure.log"; exit 1; }
grep "^-- fedwan:" "$BUILD_DIR/configure.log" || true
TARGETS=(fedwan_cli fedwan_aggregator_cli fedwan_cuda_tests fedwan_torch_tests fedwan_gpu_bench_device_codec
  fedwan_gpu_bench_allreduce)
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"

PROGRAMS=(
  "$BUILD_DIR/bin/fedwan"
  "$BUILD_DIR/bin/fedwan-aggregator"
  "$BUILD_DIR/tests/fedwan_cuda_tests"
  "$BUILD_DIR/tests/fedwan_torch_tests"
  "$BUILD_DIR/benchmarks/fedwan_gpu_bench_device_codec"
  "$BUILD_DIR/benchmarks/fedwan_gpu_bench_allreduce"
)
# The programs must load and run here before they travel: the test cases
# that need no GPU run (the others skip), so a program that cannot start
# against this LibTorch (a missing library, a symbol bound to the wrong copy)
# fails here, not on the GPU machine.
say "running the GPU programs' host-side cases here"
"$BUILD_DIR/tests/fedwan_cuda_tests" --gtest_brief=1 >"$BUILD_DIR/smoke.log" 2>&1 &&
  "$BUILD_DIR/tests/fedwan_torch_tests" --gtest_brief=1 \
    --gtest_filter='CudaTraining.*:*GpuSiteCodec*' >>"$BUILD_DIR/smoke.log" 2>&1 ||
  { tail -30 "$BUILD_DIR/smoke.log"; say "the GPU programs fail here (log: $BUILD_DIR/smoke.log)"; exit 1; }

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
for p in "${PROGRAMS[@]}"; do
  cp "$p" "$BUNDLE/bin/"
done

# Every library the programs load, except what the GPU machine has itself:
# the C runtime (its own is newer), LibTorch and the CUDA wheels beside it
# (the check puts its own on the library path), and the CUDA driver.
TORCH_SITE=$("$VENV/bin/python" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" 2>/dev/null)
provided() {
  case "$(basename "$1")" in
    # The C library and every library that comes with it (they must match
    # that machine's libc), the C++ runtime, the CUDA driver.
    linux-vdso* | ld-linux* | libc.so* | libm.so* | libmvec.so* | libdl.so* | librt.so* | \
      libpthread.so* | libresolv.so* | libutil.so* | libnsl.so* | libanl.so* | libnss_* | \
      libBrokenLocale.so* | libthread_db.so* | libstdc++.so* | libgcc_s.so* | libcuda.so*) return 0 ;;
  esac
  case "$1" in
    "$TORCH_SITE"/* | /usr/local/cuda*) return 0 ;;
  esac
  return 1
}
for p in "${PROGRAMS[@]}"; do
  # ldd: "libx.so.1 => /path/libx.so.1 (0x...)"; an unresolved one says "not found".
  if ldd "$p" | grep -q "not found"; then
    say "$p has libraries that do not resolve here:"
    ldd "$p" | grep "not found"
    exit 1
  fi
  ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
  if ! provided "$path"; then
    cp -L "$path" "$BUNDLE/lib/$soname"
  fi
done
strip --strip-unneeded "$BUNDLE"/bin/* "$BUNDLE"/lib/* 2>/dev/null || true

if [ "${FEDWAN_GPU_BUNDLE_DATA:-1}" = 1 ] && [ -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  mkdir -p "$BUNDLE/data/fashion-mnist"
  cp "$DATA"/*.gz "$BUNDLE/data/fashion-mnist/"
else
  say "no Fashion-MNIST bundled: the demo step will skip"
fi

{
  echo "commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes')"
  echo "built=$(date -u +%Y-%m-%dT%H:%MZ)"
  echo "torch_version=$TORCH_VERSION"
  echo "torch_cuda=$TORCH_CUDA"
  echo "cuda_version=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' || true)"
  echo "cuda_architectures=$ARCHS"
  echo "glibc=$(ldd --version | head -1 | awk '{print $NF}')"
} >"$BUNDLE/MANIFEST"

# What travels: the working tree (tracked and untracked files that are not
# ignored) and the bundle.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
bundle_bytes=$(du -sb "$BUNDLE" | cut -f1)
total_mib=$(((tree_bytes + bundle_bytes + 1048575) / 1048576))
say "bundle $BUNDLE: $((bundle_bytes / 1048576)) MiB ($(ls "$BUNDLE/lib" | wc -l) libraries), working tree $((tree_bytes / 1048576)) MiB, together $total_mib MiB (limit $MAX_MIB)"
cat "$BUNDLE/MANIFEST"
if [ "$total_mib" -gt "$MAX_MIB" ]; then
  say "too large: set FEDWAN_GPU_BUNDLE_DATA=0 to leave the dataset out"
  exit 1
fi
