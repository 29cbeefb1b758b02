#!/usr/bin/env bash
# Configures a build directory: scripts/configure.sh BUILD_DIR [extra cmake arguments...]
# CUDA is enabled when nvcc is found (PATH or /usr/local/cuda); SPARSEGRID_CUDA_ARCHS overrides the
# architecture list (e.g. "90a-real" on an H200, "90-real" for a compile check).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=$1
shift

args=(-S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${SPARSEGRID_BUILD_TYPE:-Release}")
# A g++ with a shared libstdc++ for the PyTorch layer (and the CUDA host code).
source "$root/scripts/pick-compiler.sh"
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
if command -v nvcc >/dev/null 2>&1; then
  args+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
  [ -n "${SPARSEGRID_CUDA_ARCHS:-}" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$SPARSEGRID_CUDA_ARCHS")
fi
cmake "${args[@]}" "$@"
