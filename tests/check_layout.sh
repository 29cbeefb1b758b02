#!/usr/bin/env bash
# The layer rules of docs/ARCHITECTURE.md, checked on the source tree:
#   include/sparsegrid  public API: includes only <sparsegrid/...> and standard headers
#   src/core            shared primitives: includes only core/ and the public headers
#   src/backend         the seam: backend/ and core/
#   src/cpu, src/cuda   backends: their own folder, backend/ and core/; never each other, never api/
#   src/api             front ends: api/, backend/ and core/; never a backend's internals
#   src/torch           the PyTorch layer: its own headers, the public ones (and torch's)
# and: no torch header outside src/torch, no operation names in string literals of the backends (the
# front end names the operation in every error), and the code style of .clang-format.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
status=0

# check DIR ALLOWED_REGEX: every quoted include of DIR must match ALLOWED_REGEX.
check() {
    local dir=$1 allowed=$2 bad
    bad=$(grep -rn --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' '#include "' "$dir" |
          grep -Ev "#include \"($allowed)/")
    if [ -n "$bad" ]; then
        echo "layout: $dir may include only $allowed:"
        echo "$bad"
        status=1
    fi
}

check src/core 'core'
check src/backend 'backend|core'
check src/cpu 'cpu|backend|core'
check src/cuda 'cuda|backend|core'
check src/api 'api|backend|core'
# The PyTorch layer includes its own headers by their bare names (it is built without src/ on the path).
bad=$(grep -rn '#include "' src/torch | grep -Ev '#include "[a-z_]+\.h"')
[ -z "$bad" ] || { echo "layout: src/torch may include only its own headers and the public ones:"; echo "$bad"; status=1; }
bad=$(grep -rn '#include "' include/sparsegrid)
[ -z "$bad" ] || { echo "layout: include/sparsegrid must include only <sparsegrid/...> headers:"; echo "$bad"; status=1; }

bad=$(grep -rln -E '#include <(torch|ATen|c10)/' include src tools tests/core | grep -v '^src/torch/')
[ -z "$bad" ] || { echo "layout: torch headers outside src/torch:"; echo "$bad"; status=1; }

ops='conv_grid|conv_transpose_grid|coarsened_grid|refined_grid|dilated_grid|pruned_grid|merged_grid|clipped_grid|bbox|from_ijk|from_points|from_mesh|ijk_to_index|neighbour_map|GridBatch|KernelMap|ConvolutionPlan'
bad=$(grep -rn -E "\"[^\"]*($ops)[^\"]*\"" src/cpu src/cuda | grep -v '^[^:]*:[0-9]*: *//')
[ -z "$bad" ] || { echo "layout: operation names in backend strings (the front end names the operation):"; echo "$bad"; status=1; }

# The code style: every C++ and CUDA file as .clang-format (clang-format 14, Debian 12's) writes it.
if command -v clang-format >/dev/null 2>&1 && [[ $(clang-format --version) == *" 14."* ]]; then
    bad=$(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | xargs clang-format --dry-run 2>&1 | grep -oE '^[^ :]+:[0-9]+:[0-9]+: (warning|error)' | cut -d: -f1 | sort -u)
    [ -z "$bad" ] || { echo "layout: not formatted with .clang-format (run clang-format -i):"; echo "$bad"; status=1; }
else
    echo "layout: clang-format 14 not found, the code style is not checked"
fi

[ "$status" -eq 0 ] && echo "layout: every layer rule holds"
exit "$status"
