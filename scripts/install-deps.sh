#!/usr/bin/env bash
# Installs the Debian packages sparsegrid builds and tests with, skipping those already present.
set -euo pipefail

# The PyTorch layer and its tests use Debian's torch (CPU) with its CMake package, pytest, and matplotlib
# for the training example's figures; the layout test checks the code style with clang-format.
packages=(build-essential cmake ninja-build ccache libgtest-dev googletest libtorch-dev python3-torch
  python3-pytest python3-matplotlib clang-format)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
