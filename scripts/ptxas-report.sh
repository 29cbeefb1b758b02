#!/usr/bin/env bash
# Registers, stack frame and spills of every kernel of one CUDA source, compiled for sm_90a as on the
# GPU machine (no GPU needed): scripts/ptxas-report.sh src/cuda/conv_implicit_gemm.cu [FILTER]
set -euo pipefail
source=${1:?usage: scripts/ptxas-report.sh SOURCE.cu [KERNEL_FILTER]}
filter=${2:-.}
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
"$nvcc" -DSPARSEGRID_WITH_CUDA=1 -I"$root/include" -I"$root/src" -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr \
  -gencode arch=compute_90a,code=sm_90a -Xptxas -v -c "$source" -o /dev/null 2>&1 |
  awk -v filter="$filter" '
    /Compiling entry function/ { name = $0; sub(/.*function ./, "", name); sub(/. for .*/, "", name) }
    /bytes stack frame/ { frame = $0 }
    /Used [0-9]+ registers/ && name ~ filter {
      match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
      cmd = "c++filt \"" name "\""; cmd | getline pretty; close(cmd)
      gsub(/sparsegrid::detail::cuda::\(anonymous namespace\)::/, "", pretty)
      printf "%4s regs | %s | %s\n", regs, frame, substr(pretty, 1, 140)
    }'
