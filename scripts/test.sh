#!/usr/bin/env bash
# Builds sparsegrid with its tests in build/test and runs every test: the C++ suite (CPU everywhere,
# CUDA as well when a GPU is present) and the Python suite of the PyTorch layer, both through ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
build_dir="$root/build/test"
"$root/scripts/configure.sh" "$build_dir" -DSPARSEGRID_BUILD_TESTS=ON -DSPARSEGRID_BUILD_TOOLS=ON \
  -DSPARSEGRID_WARNINGS_AS_ERRORS=ON -DSPARSEGRID_WITH_TORCH="${SPARSEGRID_WITH_TORCH:-ON}"
cmake --build "$build_dir" -j "$(nproc)"
cd "$build_dir"
ctest --output-on-failure -j "$(nproc)"
# The command-line tool is part of what is tested: a short benchmark run must succeed.
"$build_dir/tools/sparsegrid" bench --batch 4 --resolution 32 --repeats 2 --warmup 1 >/dev/null
echo "all tests passed"
