#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, configures and builds everything, runs the whole
# test suite (every case on CPU and CUDA), runs compute-sanitizer memcheck on the CUDA cases, and
# benchmarks the reference workload (batch 16, 32, 48) against the torch-native baseline when torch
# is importable; with torch importable it also builds the PyTorch layer against that torch, runs the
# Python suite (pytest) with every CUDA case required, the convolution and training-step benchmarks,
# and a batch-16, resolution-64 training run of the shape VAE.
# Usage: [SPARSEGRID_GPU_DEADLINE=SECONDS] scripts/gpu-check.sh OUT_DIR [PHASE...]
#   PHASE: build test python huge memcheck bench conv engine passes profile wheel train norm wide vae completion baseline
#   (default: all but huge, engine, passes, profile, wheel, norm, wide, completion and baseline, in that order; norm
#   compares the step with sparsegrid.nn.BatchNorm and with torch's batch norm; wide times the training step at
#   published shape-VAE widths in float32, TF32 and bfloat16 autocast; huge runs the grids past 2^31 map entries; profile runs Nsight Compute on the engine's kernels; wheel builds, installs and runs the pip wheel; engine sweeps the tensor-core configurations, passes
#   times each convolution pass at 16/32/48 members and C = 32..256 in every dtype, baseline compares
#   with another tree, see below). The
#   build (configure when build/gpu is new, then ninja) runs before any phase and does nothing when up
#   to date, so "conv train" on a warm build folder goes straight to the benchmarks.
# Writes into OUT_DIR two files: gpu-check.log (every step's output and a PASS/FAIL summary) and
# results.tar.gz (the log, the benchmark tables and JSON, the VAE's figures). Exits non-zero when a
# step fails.
set -uo pipefail
final=${1:?usage: scripts/gpu-check.sh OUT_DIR [PHASE...]}
shift
phases=${*:-build test python memcheck bench conv train vae}
mkdir -p "$final"
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build/gpu"
out="$build/results"  # staged here, packed into OUT_DIR at the end
rm -rf "$out"
mkdir -p "$out"
log="$out/gpu-check.log"
: >"$log"
want() { [[ " $phases " == *" $1 "* ]]; }
# The tools' arguments for a dtype name: "tf32" is float32 with TF32 allowed.
dtype_flags() { if [ "$1" = tf32 ]; then echo "--dtype float32 --tf32"; else echo "--dtype $1"; fi; }
status=0
declare -a summary

# SPARSEGRID_GPU_DEADLINE=SECONDS: every step ends by then (counted from the start of this script), and
# the steps that would start less than 20 s before it are skipped, so that a run on a short lease still
# returns its log, summary and results.
deadline=${SPARSEGRID_GPU_DEADLINE:-}
step() {  # step NAME COMMAND...: runs, logs, records PASS/FAIL (SKIP past the deadline)
  local name=$1
  shift
  local limit=()
  if [ -n "$deadline" ]; then
    local left=$((deadline - SECONDS))
    if [ $left -lt 20 ]; then
      summary+=("SKIP $name (SPARSEGRID_GPU_DEADLINE)")
      return
    fi
    # (timeout runs programs, not this script's functions: those run unbounded)
    declare -F "$1" >/dev/null || limit=(timeout "$left")
  fi
  echo "==== $name: $*" >>"$log"
  local start=$SECONDS
  ${limit[@]+"${limit[@]}"} "$@" >>"$log" 2>&1
  local rc=$?
  if [ $rc = 0 ]; then
    summary+=("PASS $name ($((SECONDS - start)) s)")
  else
    local why=""
    [ ${#limit[@]} -gt 0 ] && [ $rc = 124 ] && why=", stopped at SPARSEGRID_GPU_DEADLINE"
    summary+=("FAIL $name ($((SECONDS - start)) s$why)")
    status=1
  fi
  # A run stopped by its time limit still leaves the log of every finished step.
  cp "$log" "$final/gpu-check.log"
}

{ nvidia-smi -L; nvcc --version | tail -2; echo "phases: $phases"; } >>"$log" 2>&1
export SPARSEGRID_CUDA_ARCHS="${SPARSEGRID_CUDA_ARCHS:-90a-real}"
# CMake packages: torch's when python3 has it, and GoogleTest staged by scripts/stage-device.sh in
# .device/gtest for a GPU machine without it.
prefix_path=()
[ -d "$root/.device/gtest" ] && prefix_path+=("$root/.device/gtest")
torch_args=()
if python3 -c "import torch" >/dev/null 2>&1; then
  # Torch's CMake package would otherwise probe the GPU for its own (unused) architecture flags.
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
  torch_args=(-DSPARSEGRID_WITH_TORCH=ON)
  prefix_path+=("$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')")
fi
cmake_args=(-DSPARSEGRID_BUILD_TESTS=ON -DSPARSEGRID_BUILD_TOOLS=ON -DSPARSEGRID_WARNINGS_AS_ERRORS=ON)
[ ${#prefix_path[@]} -gt 0 ] && cmake_args+=(-DCMAKE_PREFIX_PATH="$(IFS=';'; echo "${prefix_path[*]}")")
if [ ! -f "$build/build.ninja" ]; then
  step configure "$root/scripts/configure.sh" "$build" "${cmake_args[@]}" ${torch_args[@]+"${torch_args[@]}"}
  if [ ${#torch_args[@]} -gt 0 ] && [[ ${summary[-1]} == FAIL* ]]; then
    # A Torch package that fails to configure must not cost the CUDA checks: they run without the layer
    # (the failed configure above still fails the run).
    step "configure without torch" "$root/scripts/configure.sh" "$build" "${cmake_args[@]}" -DSPARSEGRID_WITH_TORCH=OFF
  fi
fi
# Everything is rebuilt when sources changed (ninja does nothing otherwise).
step build cmake --build "$build" -j "$(nproc)"
layer="$build/python/libsparsegrid_torch.so"
have_layer=0
if [ -f "$layer" ] && python3 -c "import pytest, torch" >/dev/null 2>&1; then have_layer=1; fi
# The layer must use the process's C++ runtime, not carry a copy of libstdc++ of its own (see the
# layer's link options in CMakeLists.txt): 0 expected.
[ -f "$layer" ] && echo "C++ stream symbols defined in the layer: $(nm -C --defined-only "$layer" | grep -c 'codecvt<')" >>"$log"
pyenv=(env PYTHONPATH="$root/python" SPARSEGRID_TORCH_LIBRARY="$layer" PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1)

if want test; then
  # Every launch waits and is checked in the tests, so a fault names the launch that caused it.
  step tests env SPARSEGRID_CUDA_DEBUG=1 ctest --test-dir "$build" --output-on-failure -j 4 --timeout 600 -E '^python\.'
  # Small maps keep voxel order by default: the CUDA convolution cases again with every map ordered.
  step "convolution tests, every map ordered" env SPARSEGRID_CUDA_DEBUG=1 SPARSEGRID_CONV_ORDER=1 \
    "$build/tests/sparsegrid_tests" --gtest_filter='ConvolutionCuda.*' --gtest_brief=1
  # And with K = S plans gathered instead of scattered (SPARSEGRID_CONV_SCATTER=0), the 4 x 4 tiles,
  # narrow layers' weight gradients on the 32 x 32 tiles (SPARSEGRID_WEIGHT_NARROW=0), and TF32 input rows
  # always rounded in the warpgroup kernels (SPARSEGRID_TF32_ROUND_ONCE=0).
  step "convolution tests, no scatter, 4x4 tiles, no narrow weight gradient, TF32 rounded in the kernels" \
    env SPARSEGRID_CUDA_DEBUG=1 SPARSEGRID_CONV_SCATTER=0 SPARSEGRID_CONV_TILES=4x4 SPARSEGRID_WEIGHT_NARROW=0 \
    SPARSEGRID_TF32_ROUND_ONCE=0 \
    "$build/tests/sparsegrid_tests" --gtest_filter='ConvolutionCuda.*' --gtest_brief=1
  # The topology and map cases over the binary search instead of the hash table.
  step "topology tests, lookup=search" env SPARSEGRID_CUDA_DEBUG=1 SPARSEGRID_LOOKUP=search \
    "$build/tests/sparsegrid_tests" --gtest_filter='KernelMap*:BackendParity*:Topology*:GridBatch*:HostSyncs*:ClippedGrid*:Bbox*' \
    --gtest_brief=1
fi
if want python; then
  # The Python suite (run here instead of through ctest, with this machine's python3 and torch);
  # SPARSEGRID_PYTEST_ARGS replaces the test paths (e.g. one file, or -k EXPRESSION with the path). With
  # pytest-xdist the files run in SPARSEGRID_PYTEST_WORKERS processes (4; 0 runs them in this one), all
  # on the one GPU: the tests share nothing but the device, and each process counts its own syncs.
  if [ $have_layer = 1 ]; then
    workers=()
    if [ "${SPARSEGRID_PYTEST_WORKERS:-4}" != 0 ] && python3 -c "import xdist" >/dev/null 2>&1; then
      workers=(-n "${SPARSEGRID_PYTEST_WORKERS:-4}" --dist loadfile)
    fi
    step "python tests" "${pyenv[@]}" SPARSEGRID_REQUIRE_CUDA=1 SPARSEGRID_CUDA_DEBUG=1 \
      python3 -m pytest -v -p no:cacheprovider ${workers[@]+"${workers[@]}"} \
      ${SPARSEGRID_PYTEST_ARGS:-"$root/tests/python"}
  else
    summary+=("SKIP python tests (no PyTorch layer built, or python3 cannot import torch and pytest)")
  fi
fi
if want huge; then
  # Grids past 80 million voxels (N x 27 > 2^31): plan and convolutions spot-checked, with times and
  # peak device memory (tests/python/test_huge.py).
  if [ $have_layer = 1 ]; then
    step "huge grids" "${pyenv[@]}" SPARSEGRID_HUGE_TESTS=1 python3 -m pytest -v -s -p no:cacheprovider \
      "$root/tests/python/test_huge.py"
  else
    summary+=("SKIP huge grids (no PyTorch layer built, or python3 cannot import torch and pytest)")
  fi
fi
if want memcheck; then
  # memcheck, racecheck (shared-memory hazards) and synccheck (barrier misuse) over the CUDA cases;
  # racecheck, far slower, over one run of every engine configuration (the kernels that share tiles
  # through shared memory), or over the test cases of SPARSEGRID_RACECHECK_FILTER when set (over every
  # CUDA case it needed more than 150 s). SPARSEGRID_SANITIZER_TOOLS selects tools (all three by default).
  for tool in ${SPARSEGRID_SANITIZER_TOOLS:-memcheck racecheck synccheck}; do
    filter="${SPARSEGRID_MEMCHECK_FILTER:-*cuda*:*Cuda*}"
    if [ $tool = racecheck ] && [ -z "${SPARSEGRID_RACECHECK_FILTER:-}" ]; then
      # Racecheck over the test cases takes minutes, and over one member of the reference batch (9,000
      # voxels) more than 160 s per dtype, over one surface of 436 voxels more than 60 s; here one run of
      # every engine configuration (forward, input and weight gradient, gathering and scatter, one and
      # several channel chunks) on that small surface, each dtype under its own time limit.
      # SPARSEGRID_RACECHECK_DTYPES narrows the dtypes; SPARSEGRID_RACECHECK_CONFIGS runs the named
      # configurations one by one (forced, "auto" for the automatic choice) instead of all of them at once.
      for dtype in ${SPARSEGRID_RACECHECK_DTYPES:-float16 bfloat16 tf32}; do
        read -ra dtype_args <<<"$(dtype_flags $dtype)"
        for config in ${SPARSEGRID_RACECHECK_CONFIGS:-all}; do
          config_args=(--configs)
          [ "$config" != all ] && config_args=()
          # Line-buffered, so that a run stopped by its time limit shows how far it got.
          step "racecheck engine $dtype $config" env SPARSEGRID_CONV_CONFIG="${config/all/auto}" \
            timeout "${SPARSEGRID_MEMCHECK_TIMEOUT:-300}" stdbuf -oL compute-sanitizer --tool racecheck \
            --error-exitcode 1 --print-limit 20 "$build/tools/sparsegrid" conv --device cuda \
            ${config_args[@]+"${config_args[@]}"} "${dtype_args[@]}" --batch 1 --resolution 16 --channels 64,128 \
            --repeats 1 --warmup 0
        done
      done
      continue
    fi
    [ $tool = racecheck ] && filter="$SPARSEGRID_RACECHECK_FILTER"
    step "$tool" timeout "${SPARSEGRID_MEMCHECK_TIMEOUT:-300}" compute-sanitizer --tool $tool --error-exitcode 1 \
      --print-limit 20 "$build/tests/sparsegrid_tests" --gtest_filter="$filter" --gtest_brief=1
  done
fi

if want bench; then
  pairs=()
  for members in 16 32 48; do
    step "bench b$members" "$build/tools/sparsegrid" bench --device cuda --input "$root/data/reference_batch_r64.txt" \
      --members "$members" --repeats "${SPARSEGRID_BENCH_REPEATS:-30}" --warmup 5 --json "$out/bench_b$members.json"
    if python3 -c "import torch" >/dev/null 2>&1 && [ -f "$root/bench/torch_baseline.py" ]; then
      step "torch b$members" python3 "$root/bench/torch_baseline.py" --input "$root/data/reference_batch_r64.txt" \
        --members "$members" --device cuda --json "$out/torch_b$members.json"
      pairs+=(--pair "$out/bench_b$members.json" "$out/torch_b$members.json")
    fi
  done
  # Lookups by binary search instead of the hash table, for comparison.
  step "bench b16 lookup=search" env SPARSEGRID_LOOKUP=search "$build/tools/sparsegrid" bench --device cuda \
    --input "$root/data/reference_batch_r64.txt" --members 16 --repeats 20 --warmup 5 --no-check
  # Per-member overhead: 64 members against the same voxels side by side in one member.
  step "bench 64 members" "$build/tools/sparsegrid" bench --device cuda --batch 64 --resolution 64 --repeats 20 \
    --warmup 5 --no-check
  step "bench 64 members as one" "$build/tools/sparsegrid" bench --device cuda --batch 64 --resolution 64 \
    --as-one-member --repeats 20 --warmup 5 --no-check
  if [ ${#pairs[@]} -gt 0 ] && [ -f "$root/bench/compare.py" ]; then
    python3 "$root/bench/compare.py" "${pairs[@]}" >"$out/compare.md" 2>>"$log" || summary+=("FAIL compare")
    cat "$out/compare.md" >>"$log"
  fi
fi

if want conv; then
  # Convolution kernels on their own: plan, forward, input and weight gradient at C = 32, 64, 128.
  for dtype in float32 float16; do
    step "conv $dtype" bash -c "'$build/tools/sparsegrid' conv --device cuda --input '$root/data/reference_batch_r64.txt' \
      --members 16 --dtype $dtype --repeats 20 --warmup 5 | tee '$out/conv_$dtype.md'"
  done
  # For comparison: fine rows of K = S plans gathered like any other row instead of scattered to, and
  # the narrow tile shapes (4 x 4 per thread, short k steps).
  for dtype in float32 float16; do
    step "conv $dtype, no scatter" bash -c "SPARSEGRID_CONV_SCATTER=0 '$build/tools/sparsegrid' conv --device cuda \
      --input '$root/data/reference_batch_r64.txt' --members 16 --dtype $dtype --repeats 20 --warmup 5 \
      | tee '$out/conv_${dtype}_gather.md'"
    step "conv $dtype, narrow tiles" bash -c "SPARSEGRID_CONV_TILES=4x4 '$build/tools/sparsegrid' conv --device cuda \
      --input '$root/data/reference_batch_r64.txt' --members 16 --dtype $dtype --repeats 20 --warmup 5 \
      | tee '$out/conv_${dtype}_narrow.md'"
  done
  # Through the PyTorch layer: convolutions against per-tap torch ops, dense conv3d and an equal-FLOP
  # GEMM, and the per-layer host overhead.
  if [ $have_layer = 1 ]; then
    for dtype in float32 float16; do
      step "conv bench (torch) $dtype" "${pyenv[@]}" bash -c "python3 '$root/bench/conv_bench.py' --device cuda \
        --repeats 20 --warmup 5 --dtype $dtype --input '$root/data/reference_batch_r64.txt' \
        --json '$out/conv_torch_$dtype.json' | tee '$out/conv_torch_$dtype.md'"
    done
    step "conv bench (torch) float32, TF32 allowed" "${pyenv[@]}" bash -c "python3 '$root/bench/conv_bench.py' \
      --device cuda --repeats 20 --warmup 5 --dtype float32 --tf32 --input '$root/data/reference_batch_r64.txt' \
      --json '$out/conv_torch_tf32.json' | tee '$out/conv_torch_tf32.md'"
  fi
fi
if want engine; then
  # The tensor-core engine: forward and input gradient on every tile configuration against the tiled
  # kernels ("off") and the automatic choice, with each configuration's results compared bitwise.
  # SPARSEGRID_ENGINE_DTYPES narrows the dtypes, SPARSEGRID_ENGINE_GATHER=0 skips the gathered runs.
  for dtype in ${SPARSEGRID_ENGINE_DTYPES:-float16 bfloat16 tf32}; do
    flags=$(dtype_flags $dtype)
    step "engine $dtype" bash -c "'$build/tools/sparsegrid' conv --device cuda --configs $flags \
      --input '$root/data/reference_batch_r64.txt' --members ${SPARSEGRID_ENGINE_MEMBERS:-16} \
      --channels ${SPARSEGRID_ENGINE_CHANNELS:-32,64,128} --repeats 20 --warmup 5 | tee '$out/engine_$dtype.md'"
    # The fine side of K = S plans gathered instead of scattered.
    [ "${SPARSEGRID_ENGINE_GATHER:-1}" = 0 ] && continue
    step "engine $dtype, no scatter" bash -c "SPARSEGRID_CONV_SCATTER=0 '$build/tools/sparsegrid' conv --device cuda \
      $flags --input '$root/data/reference_batch_r64.txt' --members ${SPARSEGRID_ENGINE_MEMBERS:-16} \
      --channels ${SPARSEGRID_ENGINE_CHANNELS:-32,64,128} --repeats 20 --warmup 5 | tee '$out/engine_${dtype}_gather.md'"
  done
fi
if want passes && [ $have_layer = 1 ]; then
  # Each pass on its own through the PyTorch layer, with TFLOP/s, the fraction of the dense peak and the
  # equal-FLOP torch.mm, at 16, 32 and 48 members and C = 32 to 256, in every dtype.
  # SPARSEGRID_PASSES_MEMBERS and SPARSEGRID_PASSES_DTYPES narrow the runs.
  for members in ${SPARSEGRID_PASSES_MEMBERS:-16 32 48}; do
    for dtype in ${SPARSEGRID_PASSES_DTYPES:-float16 bfloat16 tf32 float32}; do
      flags=$(dtype_flags $dtype)
      step "passes b$members $dtype" "${pyenv[@]}" bash -c "python3 '$root/bench/conv_bench.py' --device cuda \
        --members $members --channels 32 64 128 256 $flags --passes --no-baselines --no-host-overhead \
        --repeats 20 --warmup 5 --input '$root/data/reference_batch_r64.txt' \
        --json '$out/passes_b${members}_$dtype.json' | tee '$out/passes_b${members}_$dtype.md'"
    done
  done
fi
if want profile; then
  # Nsight Compute on the engine's kernels (k3s1 and k2s2, C = 64 and 128, float16 unless
  # SPARSEGRID_PROFILE_DTYPE says otherwise, e.g. bfloat16 or tf32; SPARSEGRID_PROFILE_CHANNELS): the full section set of each launch as text (profile.txt),
  # every metric of each launch, its warp stall reasons among them (profile_raw.csv), and the SASS of
  # the first launch with its per-instruction counts (profile_sass.txt). SPARSEGRID_PROFILE_LAUNCHES
  # limits the launches (12); SPARSEGRID_PROFILE_KERNELS (a regular expression of kernel names, e.g.
  # weight_engine_kernel) narrows the kernels profiled, matched against their plain names, or against the
  # demangled names with their template arguments under SPARSEGRID_PROFILE_NAME_BASE=demangled (e.g.
  # 'warpgroup_gemm_kernel<__half.*true>' for the float16 scatter instantiations).
  profile_run() {
    local dtype_args
    read -ra dtype_args <<<"$(dtype_flags "${SPARSEGRID_PROFILE_DTYPE:-float16}")"
    local kernels="${SPARSEGRID_PROFILE_KERNELS:-implicit_gemm_kernel|warpgroup_gemm_kernel|weight_engine_kernel|weight_warpgroup_kernel}"
    ncu --set full --import-source no --kernel-name-base "${SPARSEGRID_PROFILE_NAME_BASE:-function}" \
      --kernel-name regex:"$kernels" \
      --launch-count "${SPARSEGRID_PROFILE_LAUNCHES:-12}" -f -o "$out/engine" "$build/tools/sparsegrid" conv \
      --device cuda "${dtype_args[@]}" --channels "${SPARSEGRID_PROFILE_CHANNELS:-64,128}" \
      --repeats 1 --warmup 0 --input "$root/data/reference_batch_r64.txt" --members 16 || return 1
    ncu -i "$out/engine.ncu-rep" --print-summary none >"$out/profile.txt" || return 1
    ncu -i "$out/engine.ncu-rep" --page raw --csv >"$out/profile_raw.csv" || return 1
    ncu -i "$out/engine.ncu-rep" --page source --print-source sass --launch-count 1 >"$out/profile_sass.txt" || true
    grep -E '^  [a-z_]+.*(implicit_gemm|warpgroup_gemm|weight_engine|weight_warpgroup)|Duration|Registers Per|Achieved Occupancy|Issued Instructions  |Warp Cycles Per Issued' \
      "$out/profile.txt"
  }
  step "profile" profile_run
fi
if want wheel; then
  # pip wheel through scikit-build-core against this machine's torch, installed into a fresh virtual
  # environment that sees this interpreter's torch, imported from outside the tree and run on CUDA.
  wheel_dir="$build/wheel" venv="$build/wheel-venv"
  rm -rf "$wheel_dir" "$venv"
  # The layer needs a g++ with a shared libstdc++ (scripts/pick-compiler.sh, as for scripts/configure.sh).
  step "wheel build" bash -c "source '$root/scripts/pick-compiler.sh' && python3 -m pip wheel --no-build-isolation \
    --no-deps -w '$wheel_dir' '$root' -C cmake.define.CMAKE_CUDA_ARCHITECTURES='${SPARSEGRID_CUDA_ARCHS}' \
    -C build-dir='$build/wheel-build'"
  # The venv sees this interpreter's torch through a .pth file (python3 may itself be a venv, whose packages
  # --system-site-packages would not show).
  torch_site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  step "wheel install" bash -c "python3 -m venv '$venv' && echo '$torch_site' >\"\$('$venv/bin/python' -c \
    'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')/host-torch.pth\" && '$venv/bin/pip' install \
    --no-deps --no-index '$wheel_dir'/sparsegrid-*.whl"
  step "wheel import and convolve" bash -c "cd / && env -u SPARSEGRID_TORCH_LIBRARY -u PYTHONPATH \
    '$venv/bin/python' '$root/scripts/wheel_smoke.py'"
fi
if want train && [ $have_layer = 1 ]; then
  # With the host side's profile (operators by self CPU time, Python functions by own time) in
  # host_profile/. SPARSEGRID_TRAIN_BATCH narrows the batch sizes (16 32 48).
  step "train step" "${pyenv[@]}" bash -c "python3 '$root/bench/train_step.py' --device cuda \
    --batch ${SPARSEGRID_TRAIN_BATCH:-16 32 48} --host-profile '$out/host_profile' \
    --json '$out/train_step.json' | tee '$out/train_step.md'"
fi
if want norm && [ $have_layer = 1 ]; then
  # sparsegrid.nn.BatchNorm on CUDA: its tests, then the batch-16 step with torch's batch norm and ELU
  # against the fused layer (--norm fused), alternately, SPARSEGRID_NORM_ROUNDS rounds (2), in float32
  # at the default widths and in bfloat16 autocast at 32/64/128/256.
  step "batch norm tests" "${pyenv[@]}" SPARSEGRID_REQUIRE_CUDA=1 SPARSEGRID_CUDA_DEBUG=1 python3 -m pytest -q \
    -p no:cacheprovider "$root/tests/python/test_batch_norm.py"
  for round in $(seq "${SPARSEGRID_NORM_ROUNDS:-2}"); do
    for config in "float32::" "bfloat16:--autocast bfloat16:--channels 32 64 128 256"; do
      IFS=: read -r precision autocast channels <<<"$config"
      for norm in torch fused; do
        step "train step b16 $precision norm=$norm round $round" "${pyenv[@]}" bash -c "python3 \
          '$root/bench/train_step.py' --device cuda --batch 16 --warmup 20 --iterations 10 $autocast $channels \
          --norm $norm --json '$out/norm_${precision}_${norm}_$round.json' | tail -3"
      done
    done
  done
fi
if want wide && [ $have_layer = 1 ]; then
  # The training step at the widths of published shape VAEs: channels 32/64/128/256 at resolution 64,
  # batch 16, and 64/128/256/512 at resolution 128, batch 8; in float32, TF32 and bfloat16 autocast,
  # each with its host profile in host_profile/wide_r*_*/. SPARSEGRID_WIDE_RESOLUTIONS (64 128) and
  # SPARSEGRID_WIDE_PRECISIONS (float32 tf32 bfloat16) narrow the runs.
  for width in "64 16 32 64 128 256" "128 8 64 128 256 512"; do
    read -r resolution batch channels <<<"$width"
    [[ " ${SPARSEGRID_WIDE_RESOLUTIONS:-64 128} " == *" $resolution "* ]] || continue
    for precision in ${SPARSEGRID_WIDE_PRECISIONS:-float32 tf32 bfloat16}; do
      flags=""
      [ $precision = tf32 ] && flags="--tf32"
      [ $precision = bfloat16 ] && flags="--autocast bfloat16"
      step "wide r$resolution b$batch $precision" "${pyenv[@]}" bash -c "python3 '$root/bench/train_step.py' \
        --device cuda --resolution $resolution --batch $batch --channels $channels $flags \
        --host-profile '$out/host_profile/wide_r${resolution}_$precision' --json '$out/wide_r${resolution}_$precision.json' | tee '$out/wide_r${resolution}_$precision.md'"
    done
  done
fi
if want vae && [ $have_layer = 1 ]; then
  step "vae b16 r64" "${pyenv[@]}" bash -c "python3 '$root/examples/vae.py' --device cuda --batch 16 --resolution 64 \
    ${SPARSEGRID_VAE_ARGS:---shapes 4096 --iterations 6500 --channels 32 64 128 256 --autocast bfloat16 --no-breakdown} --print-every 50 --output '$out/vae' \
    | tee '$out/vae.md'"
fi

if want completion && [ $have_layer = 1 ]; then
  # The completion example at the VAE's GPU scale: its held-out completions against their inputs.
  step "completion b16 r64" "${pyenv[@]}" bash -c "python3 '$root/examples/completion.py' --device cuda --batch 16 \
    --resolution 64 ${SPARSEGRID_COMPLETION_ARGS:---shapes 4096 --iterations 6500 --channels 32 64 128 256 --autocast bfloat16 --no-breakdown} \
    --print-every 250 --output '$out/completion' | tee '$out/completion.md'"
fi

if want baseline; then
  # The topology and convolution tables of another tree, built here without the PyTorch layer, run
  # alternately with this tree's on the same GPU: SPARSEGRID_BASELINE names a .tar.gz of that tree
  # (git archive -o .device/baseline.tar.gz COMMIT). The output voxel counts of every bench row both
  # trees have must agree. SPARSEGRID_BASELINE_ENGINE names dtypes (e.g. "tf32 float16") whose engine
  # sweeps (`conv --configs`, batch 16, SPARSEGRID_ENGINE_CHANNELS or 64,128) run for both trees too,
  # alternately, into baseline_engine_DTYPE_ROUND.md and current_engine_DTYPE_ROUND.md; with
  # SPARSEGRID_BASELINE_CONFIGS (configuration names, e.g. "w64x64/4 w128x128/3") each of them is forced
  # in turn (SPARSEGRID_CONV_CONFIG) in place of the sweep, into ..._engine_DTYPE_CONFIG_ROUND.md (the
  # slash as "-"); a configuration a dtype cannot run gives way to the automatic choice. With
  # SPARSEGRID_BASELINE_ROUNDS=engine only those run (no bench and conv tables);
  # SPARSEGRID_BASELINE_CONV_DTYPES lists the conv tables' dtypes ("float32 float16"; empty: none; tf32
  # as well) and SPARSEGRID_BASELINE_CONV_CHANNELS their channels (32,64,128). With
  # SPARSEGRID_BASELINE_TRAIN=1 (and torch importable) the other tree's PyTorch layer is built too, and
  # each tree's bench/train_step.py runs with its own package and layer, alternately, twice
  # (baseline_train_ROUND.md, current_train_ROUND.md; batch SPARSEGRID_TRAIN_BATCH, 16 by default, and
  # SPARSEGRID_BASELINE_TRAIN_ARGS added, e.g. "--channels 32 64 128 256 --autocast bfloat16"): the step's
  # host time depends on the machine's CPU, so steps compare only within one machine.
  if [ -f "${SPARSEGRID_BASELINE:-}" ]; then
    base_src="$build/baseline-src"
    base_build="$build/baseline"
    rm -rf "$base_src"
    mkdir -p "$base_src"
    tar xzf "$SPARSEGRID_BASELINE" -C "$base_src"
    [ -f "$base_build/build.ninja" ] || step "baseline configure" "$base_src/scripts/configure.sh" "$base_build" \
      -DSPARSEGRID_BUILD_TESTS=OFF -DSPARSEGRID_BUILD_TOOLS=ON -DSPARSEGRID_WITH_TORCH=OFF
    step "baseline build" cmake --build "$base_build" -j "$(nproc)" --target sparsegrid_cli
    for dtype in ${SPARSEGRID_BASELINE_ENGINE:-}; do
      flags=$(dtype_flags $dtype)
      for round in 1 2; do
        for tree in baseline current; do
          tool="$build/tools/sparsegrid"
          [ $tree = baseline ] && tool="$base_build/tools/sparsegrid"
          args="--device cuda $flags --input '$root/data/reference_batch_r64.txt' --members 16 \
            --channels ${SPARSEGRID_ENGINE_CHANNELS:-64,128} --repeats 20 --warmup 5"
          if [ -z "${SPARSEGRID_BASELINE_CONFIGS:-}" ]; then
            step "$tree engine $dtype ($round)" bash -c "'$tool' conv --configs $args | tee '$out/${tree}_engine_${dtype}_$round.md'"
          fi
          for config in ${SPARSEGRID_BASELINE_CONFIGS:-}; do
            step "$tree engine $dtype $config ($round)" bash -c "SPARSEGRID_CONV_CONFIG='$config' '$tool' conv $args \
              | tee '$out/${tree}_engine_${dtype}_${config//\//-}_$round.md'"
          done
        done
      done
    done
    if [ "${SPARSEGRID_BASELINE_TRAIN:-0}" = 1 ] && [ $have_layer = 1 ]; then
      base_layer_build="$build/baseline-layer"
      base_layer_args=(-DSPARSEGRID_BUILD_TESTS=OFF -DSPARSEGRID_BUILD_TOOLS=OFF -DSPARSEGRID_WITH_TORCH=ON)
      [ ${#prefix_path[@]} -gt 0 ] && base_layer_args+=(-DCMAKE_PREFIX_PATH="$(IFS=';'; echo "${prefix_path[*]}")")
      [ -f "$base_layer_build/build.ninja" ] || step "baseline configure (layer)" "$base_src/scripts/configure.sh" \
        "$base_layer_build" "${base_layer_args[@]}"
      step "baseline build (layer)" cmake --build "$base_layer_build" -j "$(nproc)" --target sparsegrid_torch
      for round in 1 2; do
        for tree in baseline current; do
          tree_root="$root" layer_so="$layer"
          [ $tree = baseline ] && tree_root="$base_src" layer_so="$base_layer_build/python/libsparsegrid_torch.so"
          step "$tree train step ($round)" env PYTHONPATH="$tree_root/python" SPARSEGRID_TORCH_LIBRARY="$layer_so" \
            PYTHONDONTWRITEBYTECODE=1 bash -o pipefail -c "python3 '$tree_root/bench/train_step.py' --device cuda \
            --batch ${SPARSEGRID_TRAIN_BATCH:-16} ${SPARSEGRID_BASELINE_TRAIN_ARGS:-} | tee '$out/${tree}_train_$round.md'"
        done
      done
    fi
    [ "${SPARSEGRID_BASELINE_ROUNDS:-}" = engine ] && base_rounds="" || base_rounds="1 2"
    for round in $base_rounds; do
      for tree in baseline current; do
        tool="$build/tools/sparsegrid"
        [ $tree = baseline ] && tool="$base_build/tools/sparsegrid"
        step "$tree bench b16 ($round)" "$tool" bench --device cuda --input "$root/data/reference_batch_r64.txt" \
          --members 16 --repeats "${SPARSEGRID_BENCH_REPEATS:-30}" --warmup 5 --json "$out/${tree}_bench_b16_$round.json"
        for dtype in ${SPARSEGRID_BASELINE_CONV_DTYPES-float32 float16}; do
          step "$tree conv $dtype ($round)" bash -c "'$tool' conv --device cuda --members 16 $(dtype_flags $dtype) \
            --channels ${SPARSEGRID_BASELINE_CONV_CHANNELS:-32,64,128} \
            --input '$root/data/reference_batch_r64.txt' --repeats 20 --warmup 5 | tee '$out/${tree}_conv_${dtype}_$round.md'"
        done
      done
    done
    [ -n "$base_rounds" ] && step "baseline voxel counts" python3 - "$out/baseline_bench_b16_1.json" "$out/current_bench_b16_1.json" <<'PY'
import json, sys
base, current = ({row["operation"]: row for row in json.load(open(p))["rows"]} for p in sys.argv[1:3])
print(f"{'operation':36} {'voxels':>10} {'base ms':>9} {'this ms':>9} {'this/base':>9}")
bad = 0
for name, row in current.items():
    if name not in base:
        print(f"{name:36} {row['output_voxels']:>10} {'(new)':>9} {row['median_ms']:>9.3f}")
        continue
    same = row["output_voxels"] == base[name]["output_voxels"]
    bad += not same
    ratio = row["median_ms"] / base[name]["median_ms"] if base[name]["median_ms"] else float("nan")
    print(f"{name:36} {row['output_voxels']:>10} {base[name]['median_ms']:>9.3f} {row['median_ms']:>9.3f} "
          f"{ratio:>8.2f}x{'' if same else '  VOXEL COUNT DIFFERS: ' + str(base[name]['output_voxels'])}")
sys.exit(1 if bad else 0)
PY
  else
    summary+=("SKIP baseline (SPARSEGRID_BASELINE does not name a .tar.gz of the tree to compare with)")
  fi
fi

{
  echo "==== summary"
  printf '%s\n' "${summary[@]}"
} | tee -a "$log"
cp "$log" "$final/gpu-check.log"
tar czf "$final/results.tar.gz" -C "$out" .
exit $status
