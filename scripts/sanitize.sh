#!/usr/bin/env bash
# The C++ suite on the CPU under AddressSanitizer and UndefinedBehaviorSanitizer: a separate build in
# build/sanitize (no CUDA, no PyTorch layer), every finding fatal. Run by CI after the test command.
# Usage: scripts/sanitize.sh [extra ctest arguments...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
build_dir="$root/build/sanitize"
SPARSEGRID_BUILD_TYPE=RelWithDebInfo "$root/scripts/configure.sh" "$build_dir" -DSPARSEGRID_WITH_CUDA=OFF -DSPARSEGRID_WITH_TORCH=OFF \
  -DSPARSEGRID_BUILD_TESTS=ON -DSPARSEGRID_BUILD_TOOLS=ON -DSPARSEGRID_WARNINGS_AS_ERRORS=ON \
  -DSPARSEGRID_SANITIZE=address,undefined
cmake --build "$build_dir" -j "$(nproc)" --target sparsegrid_tests sparsegrid_cli
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
cd "$build_dir"
ctest --output-on-failure -j "$(nproc)" -E '^(python\.|layout\.)' "$@"
# The tool's benchmark runs every topology operation once more, checked against its naive reference.
"$build_dir/tools/sparsegrid" bench --batch 4 --resolution 32 --repeats 1 --warmup 0 >/dev/null
echo "sanitizer run passed"
