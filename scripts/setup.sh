#!/usr/bin/env bash
# Installs every system dependency of fedwan from Debian 12 packages.
# Idempotent: installs only what is missing; needs root (or sudo) for that.
set -euo pipefail

PACKAGES=(
  build-essential cmake ccache pkg-config git
  clang libclang-rt-14-dev            # libFuzzer for scripts/fuzz.sh
  clang-format clang-tidy             # scripts/lint.sh (.clang-format, .clang-tidy)
  libtorch-dev python3-torch
  libzmq3-dev cppzmq-dev libssl-dev zlib1g-dev libzstd-dev
  libgcrypt20-dev                     # AES-256-GCM with VAES (src/security/aead.hpp)
  libxxhash-dev                       # the replay fingerprint (src/common/fingerprint.hpp)
  libboost-dev libboost-system-dev libgloo-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  pybind11-dev python3-pybind11 python3-dev python3-numpy python3-pytest
  python3-venv                        # pip's torch 2.x for scripts/torch2.sh
  dataset-fashion-mnist
  iproute2 python3-matplotlib         # fedwan bench: namespaces, plots
  prometheus                          # tests/integration/test_prometheus_scrape.py scrapes the demo
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
