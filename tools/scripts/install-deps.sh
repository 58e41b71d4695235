#!/usr/bin/env bash
#===- install-deps.sh - install what building and testing actplace needs --===#
#
# Idempotent and quiet: installs only the Debian packages that are missing.
# CUDA 13 (nvcc, cuBLASLt, NCCL) is not a Debian package; when
# /usr/local/cuda/bin/nvcc exists the CUDA parts are built too. python3-torch
# (PyTorch 1.13, CPU) is for the gradient oracle test (test/e2e/grad_oracle.py).
# clang-22 and libclang-rt-22-dev (libFuzzer, ASan, UBSan) build the fuzz
# targets (tools/scripts/fuzz.sh, docs/fuzzing.md).
#
#===----------------------------------------------------------------------===#
set -euo pipefail

packages=(
  cmake ninja-build g++ python3
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
  libgtest-dev libopenmpi-dev openmpi-bin nlohmann-json3-dev
  python3-torch
  clang-22 libclang-rt-22-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! $sudo apt-get install -y -qq "${missing[@]}" >/tmp/actplace-apt.log 2>&1; then
  # A fresh machine may have no package lists yet.
  $sudo apt-get update -qq >>/tmp/actplace-apt.log 2>&1
  $sudo apt-get install -y -qq "${missing[@]}" >>/tmp/actplace-apt.log 2>&1 || {
    echo "install-deps: apt-get failed; see /tmp/actplace-apt.log" >&2
    tail -20 /tmp/actplace-apt.log >&2
    exit 1
  }
fi
