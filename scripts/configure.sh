#!/usr/bin/env bash
# Configures a build directory: scripts/configure.sh BUILD_DIR [extra cmake arguments...]
# CUDA is enabled when nvcc is found (PATH or /usr/local/cuda); SPARSEGRID_CUDA_ARCHS overrides the
# architecture list (e.g. "90a-real" on an H200, "90-real" for a compile check).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=$1
shift

args=(-S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${SPARSEGRID_BUILD_TYPE:-Release}")
# The PyTorch layer needs a g++ with a shared libstdc++ (CMakeLists.txt says why). Where the first g++
# on PATH has none (a toolchain of static libraries) and /usr/bin/g++ has one, take that one, for the
# CUDA host code too; CXX / CUDAHOSTCXX set by the caller always win.
has_shared_libstdcxx() { [[ $("$1" -print-file-name=libstdc++.so 2>/dev/null) == /* ]]; }
if [ -z "${CXX:-}" ] && command -v g++ >/dev/null 2>&1 && ! has_shared_libstdcxx g++ &&
  [ -x /usr/bin/g++ ] && has_shared_libstdcxx /usr/bin/g++; then
  echo "configure.sh: $(command -v g++) has no shared libstdc++; using /usr/bin/g++"
  export CXX=/usr/bin/g++ CC=${CC:-/usr/bin/gcc} CUDAHOSTCXX=${CUDAHOSTCXX:-/usr/bin/g++}
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
if command -v nvcc >/dev/null 2>&1; then
  args+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
  [ -n "${SPARSEGRID_CUDA_ARCHS:-}" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$SPARSEGRID_CUDA_ARCHS")
fi
cmake "${args[@]}" "$@"
