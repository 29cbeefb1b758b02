#!/usr/bin/env bash
# The topology benchmark: builds the sparsegrid tool (in build/bench) and benchmarks every topology
# operation and kernel map on the bundled reference batch (16 shapes, surface voxels at resolution 64).
# Runs on the GPU when one is present and the build has CUDA, on the CPU otherwise. Extra arguments go
# to `sparsegrid bench`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
build_dir="$root/build/bench"
"$root/scripts/configure.sh" "$build_dir" -DSPARSEGRID_BUILD_TESTS=OFF -DSPARSEGRID_BUILD_TOOLS=ON \
  -DSPARSEGRID_WITH_TORCH=OFF
cmake --build "$build_dir" -j "$(nproc)" --target sparsegrid_cli
device=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 \
   && "$build_dir/tools/sparsegrid" --version | grep -q "cuda: yes"; then
  device=cuda
fi
exec "$build_dir/tools/sparsegrid" bench --input "$root/data/reference_batch_r64.txt" --members 16 \
  --device "$device" "$@"
