#!/usr/bin/env bash
# Data-parallel scaling of the shape VAE: the same training run (batch 16 per process, resolution 64)
# on 1 GPU and on N GPUs (torch.distributed, NCCL, one process per GPU), one after the other, then the
# throughput of each and the scaling. Needs N CUDA devices and the PyTorch layer built in build/gpu
# (scripts/gpu-check.sh OUT build).
# Usage: scripts/ddp-scaling.sh OUT_DIR [N=2] [ITERATIONS=1000]
set -euo pipefail
out=${1:?usage: scripts/ddp-scaling.sh OUT_DIR [N] [ITERATIONS]}
gpus=${2:-2}
iterations=${3:-1000}
root=$(cd "$(dirname "$0")/.." && pwd)
layer="$root/build/gpu/python/libsparsegrid_torch.so"
[ -f "$layer" ] || { echo "ddp-scaling: $layer is missing; run scripts/gpu-check.sh OUT build first" >&2; exit 1; }
mkdir -p "$out"
export PYTHONPATH="$root/python" SPARSEGRID_TORCH_LIBRARY="$layer" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"  # NVLink multicast stays off
for world in 1 "$gpus"; do
  python3 "$root/examples/vae.py" --device cuda --world-size "$world" --batch 16 --resolution 64 --shapes 256 \
    --iterations "$iterations" --print-every 100 --output "$out/vae_${world}gpu" | tee "$out/vae_${world}gpu.md"
done
one=$(sed -n 's/^throughput: \([0-9.]*\) shapes\/s.*/\1/p' "$out/vae_1gpu.md")
many=$(sed -n 's/^throughput: \([0-9.]*\) shapes\/s.*/\1/p' "$out/vae_${gpus}gpu.md")
{
  echo "| GPUs | shapes/s | scaling |"
  echo "|---:|---:|---:|"
  echo "| 1 | $one | 1.00 |"
  echo "| $gpus | $many | $(python3 -c "print(f'{$many / $one:.2f}')") |"
} | tee "$out/scaling.md"
