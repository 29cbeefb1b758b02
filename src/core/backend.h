// The operations every backend implements, with identical signatures in namespace cpu and cuda.
// Front ends (grid_batch.cpp, kernel_map.cpp) validate arguments, compute output boxes and transforms,
// and then call exactly one of these. Preconditions are checked by the front end, not here.
#pragma once

#include <sparsegrid/kernel_map.h>

#include "core/keys.h"
#include "core/storage.h"
#include "core/taps.h"

namespace sparsegrid::detail {

#define SPARSEGRID_BACKEND_FUNCTIONS                                                                                   \
    /* Canonical grid of arbitrary coordinates, member m owning [offsets[m], offsets[m+1]). */                         \
    GridTopology build_from_ijk(const int32_t* ijk, const std::vector<int64_t>& offsets, const Context& ctx);          \
    /* ijk of world points; throws Error for non-finite or out-of-range points. */                                     \
    Buffer<int32_t> points_to_ijk(const double* xyz, const std::vector<int64_t>& offsets,                              \
                                  const std::vector<MemberTransform>& transforms, const Context& ctx);                 \
    GridTopology conv_grid(const GridStorage& grid, const ConvGeometry& geometry, const CoordBox& out_box);            \
    GridTopology conv_transpose_grid(const GridStorage& grid, const ConvGeometry& geometry, const CoordBox& out_box);  \
    GridTopology coarsened_grid(const GridStorage& grid, const Vec3i& factor, const CoordBox& out_box);                \
    GridTopology refined_grid(const GridStorage& grid, const Vec3i& factor, const CoordBox& out_box);                  \
    GridTopology pruned_grid(const GridStorage& grid, const uint8_t* mask);                                            \
    GridTopology merged_grid(const GridStorage& a, const GridStorage& b, const CoordBox& out_box);                     \
    Buffer<int64_t> ijk_to_index(const GridStorage& grid, const int32_t* query_ijk,                                    \
                                 const std::vector<int64_t>& query_offsets);                                           \
    Buffer<int32_t> neighbour_map(const GridStorage& source, const GridStorage& target, const ConvGeometry& geometry,  \
                                  MapDirection direction);                                                             \
    PairLists pairs_by_tap(const Buffer<int32_t>& map, int64_t num_target, int32_t kernel_volume, const Context& ctx); \
    Buffer<int32_t> transpose_map(const Buffer<int32_t>& map, int64_t num_target, int64_t num_source,                  \
                                  int32_t kernel_volume, const Context& ctx);                                          \
    int64_t count_edges(const Buffer<int32_t>& map, const Context& ctx);                                               \
    /* Transposed-direction map of the K = S = 2 subdivision of `coarse`: row 8n + t holds n at tap t. */              \
    Buffer<int32_t> subdivision_map(const GridStorage& coarse);

namespace cpu {
SPARSEGRID_BACKEND_FUNCTIONS
}  // namespace cpu

#if defined(SPARSEGRID_WITH_CUDA)
namespace cuda {
SPARSEGRID_BACKEND_FUNCTIONS
}  // namespace cuda
#endif

/// Raises the uniform "not compiled" error for a device without a backend in this build.
[[noreturn]] void throw_backend_unavailable(const char* op, Device device);

/// Runs `cpu_call` or `cuda_call` for the context's device.
#if defined(SPARSEGRID_WITH_CUDA)
#define SPARSEGRID_DISPATCH(op, ctx, call) \
    ((ctx).device.is_cpu() ? ::sparsegrid::detail::cpu::call : ::sparsegrid::detail::cuda::call)
#else
#define SPARSEGRID_DISPATCH(op, ctx, call) \
    ((ctx).device.is_cpu()                 \
         ? ::sparsegrid::detail::cpu::call \
         : (::sparsegrid::detail::throw_backend_unavailable(op, (ctx).device), ::sparsegrid::detail::cpu::call))
#endif

}  // namespace sparsegrid::detail
