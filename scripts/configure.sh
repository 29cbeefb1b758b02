#!/usr/bin/env bash
# Configures a build directory: scripts/configure.sh BUILD_DIR [extra cmake arguments...]
# CUDA is enabled when nvcc is found (PATH or /usr/local/cuda); SPARSEGRID_CUDA_ARCHS overrides the
# architecture list (e.g. "90a-real" on an H200, "90-real" for a compile check).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=$1
shift

args=(-S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${SPARSEGRID_BUILD_TYPE:-Release}")
# The PyTorch layer needs a g++ with a shared libstdc++ (CMakeLists.txt says why). Where the compiler
# CMake would take ($CXX, else c++ or g++ on PATH) has none (a toolchain of static libraries only)
# and /usr/bin/g++ has one, take /usr/bin/g++, for the CUDA host code too.
has_shared_libstdcxx() { [[ $("$1" -print-file-name=libstdc++.so 2>/dev/null) == /* ]]; }
cxx=${CXX:-$(command -v c++ || command -v g++ || true)}
if [ -n "$cxx" ] && ! has_shared_libstdcxx "$cxx" && [ -x /usr/bin/g++ ] && has_shared_libstdcxx /usr/bin/g++; then
  echo "configure.sh: $cxx has no shared libstdc++; using /usr/bin/g++"
  export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
if command -v nvcc >/dev/null 2>&1; then
  args+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
  [ -n "${SPARSEGRID_CUDA_ARCHS:-}" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$SPARSEGRID_CUDA_ARCHS")
fi
cmake "${args[@]}" "$@"
