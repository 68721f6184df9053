#!/usr/bin/env bash
# scripts/install-deps.sh - install every Debian package Bonsai needs to build and test.
#
# Idempotent and non-interactive: packages already present are left alone, so CI can run it on
# every build. The CUDA toolkit is not installed here; CMake uses /usr/local/cuda when it exists.
set -euo pipefail

packages=(
  build-essential cmake ninja-build git
  llvm-22-dev llvm-22-tools libmlir-22-dev mlir-22-tools
  clang-22 libfuzzer-22-dev libclang-rt-22-dev
  libflatbuffers-dev flatbuffers-compiler
  libopenblas-dev
  libpcre2-dev libicu-dev libsentencepiece-dev
  libgtest-dev
  librsvg2-bin
  python3-numpy
  libopenmpi-dev openmpi-bin
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
