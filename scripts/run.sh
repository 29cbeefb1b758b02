#!/usr/bin/env bash
# The main job: trains the generative shape VAE of examples/vae.py on the bundled data (procedural
# shapes and the Stanford bunny) and writes its figures to out/vae.
#   - installs missing Debian packages (scripts/install-deps.sh);
#   - picks the Python: the first of $SPARSEGRID_PYTHON, python3 and /usr/bin/python3 whose torch
#     imports, preferring one whose torch sees a GPU, then one with matplotlib;
#   - builds the PyTorch layer (target sparsegrid_torch) in build/release against that torch, with the
#     CUDA backend only when the run will use a GPU (then for the local GPU's architecture unless
#     SPARSEGRID_CUDA_ARCHS says otherwise);
#   - trains: on a GPU batch 16 at resolution 64, 6500 iterations over 4096 procedural shapes with
#     channels 32/64/128/256 in bfloat16 autocast where the GPU supports bfloat16 (float32 elsewhere;
#     progress lines without the per-call time split); on the CPU batch 8 at resolution 32, 500
#     iterations (a few minutes on 2 cores).
# Extra arguments go to examples/vae.py and override these (e.g. --iterations 100 --output DIR).
# The topology benchmark of the sparsegrid tool is scripts/bench.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"

# Score each interpreter: no torch -> skipped; 2 when its torch sees a GPU, +1 with matplotlib.
python="" best=-1
for candidate in ${SPARSEGRID_PYTHON:-} python3 /usr/bin/python3; do
  command -v "$candidate" >/dev/null 2>&1 || continue
  score=$("$candidate" -c 'import importlib.util, torch
print(2 * torch.cuda.is_available() + (importlib.util.find_spec("matplotlib") is not None))' 2>/dev/null) || continue
  if [ "$score" -gt "$best" ]; then
    python=$(command -v "$candidate") best=$score
  fi
done
if [ -z "$python" ]; then
  echo "run.sh: no Python with torch found (tried: ${SPARSEGRID_PYTHON:-} python3 /usr/bin/python3)" >&2
  exit 1
fi

nvcc_found=0
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then nvcc_found=1; fi
device=cpu cuda=OFF
if [ "$best" -ge 2 ] && [ "$nvcc_found" = 1 ]; then
  device=cuda cuda=ON
  capability=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ') || true
  if [ -n "$capability" ]; then
    # Torch's CMake package would otherwise probe the GPU for its own (unused) architecture flags.
    export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$capability}"
    export SPARSEGRID_CUDA_ARCHS="${SPARSEGRID_CUDA_ARCHS:-${capability/./}-real}"
  fi
elif [ "$best" -ge 2 ]; then
  echo "run.sh: torch sees a GPU but nvcc was not found, so the library is built without CUDA: training on the CPU"
fi

# Build against the interpreter's own torch when it ships its CMake package (pip wheels do; Debian's
# torch is found through libtorch-dev).
build_dir="$root/build/release"
args=(-DSPARSEGRID_BUILD_TESTS=OFF -DSPARSEGRID_WITH_TORCH=ON -DSPARSEGRID_WITH_CUDA=$cuda)
torch_cmake=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
[ -f "$torch_cmake/Torch/TorchConfig.cmake" ] && args+=(-DCMAKE_PREFIX_PATH="$torch_cmake")
"$root/scripts/configure.sh" "$build_dir" "${args[@]}"
cmake --build "$build_dir" -j "$(nproc)" --target sparsegrid_torch

export SPARSEGRID_TORCH_LIBRARY="$build_dir/python/libsparsegrid_torch.so"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
if [ "$device" = cuda ]; then
  # bfloat16 autocast where the GPU has bfloat16 tensor cores (compute capability 8.0 on), else float32.
  precision=none
  "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.get_device_capability()[0] >= 8 else 1)' 2>/dev/null &&
    precision=bfloat16
  defaults=(--device cuda --batch 16 --resolution 64 --shapes 4096 --iterations 6500 --channels 32 64 128 256
            --autocast "$precision" --no-breakdown --print-every 250)
else
  defaults=(--device cpu --batch 8 --resolution 32 --shapes 64 --iterations 500 --print-every 50)
  echo "run.sh: no GPU: the small configuration (batch 8, resolution 32, 500 iterations) on the CPU"
fi
echo "run.sh: $python (torch $("$python" -c 'import torch; print(torch.__version__)')), $device"
exec "$python" "$root/examples/vae.py" "${defaults[@]}" --output "$root/out/vae" "$@"
