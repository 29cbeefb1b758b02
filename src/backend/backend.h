// The backend seam: every entry point a backend implements, in one list with one signature each.
//
// CpuBackend (src/cpu) and CudaBackend (src/cuda, when built) declare exactly this list as static
// members, and tests/core/test_backend_seam.cpp takes the address of every entry of both, so a backend
// that misses one does not link. Front ends (src/api) validate the arguments, choose the algorithm
// (fast paths, symmetry, row order, scatter), size the output, and then make one call through
// dispatch.h. Preconditions are the front end's: backends check nothing it has checked and carry no
// operation names; the errors they do raise (data-dependent ones, such as a bad face index, and CUDA
// failures) are prefixed with the user's operation by the dispatch.
#pragma once

#include <sparsegrid/batch_norm.h>
#include <sparsegrid/buffer.h>
#include <sparsegrid/types.h>

#include "core/storage.h"
#include "core/taps.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sparsegrid::detail {

/// One convolution over a neighbour map, output stationary: out[r, :] = sum_t A_t . x[map[r][t], :] for
/// the `rows` output rows, A_t = W[:, :, t] (forward) or W[:, :, t]^T (transpose_weight, the input
/// gradient). W is [Cout, Cin, volume]; x has x_channels columns, out out_channels. A null map is the
/// identity (volume 1, row r reads x[r]). Every output row is a sum in the order (tap, channel), so
/// results do not depend on threads, blocks or `order`.
struct MapConvolution {
    const int32_t* map = nullptr;
    /// Rows visited in this order (a permutation of [0, rows) from row_order), or null: voxel order.
    const int32_t* order = nullptr;
    int64_t rows = 0;
    int32_t volume = 1;
    /// `map` has rows = the input's (`rows` of them) and each of the `out_rows` output rows has at most
    /// one edge (the fine side of a K = S plan): out[map[r][t], :] = A_t . x[r, :], every other output
    /// row zero. The same products as the gathering form. CUDA only (the CPU backend always gathers).
    bool scatter = false;
    int64_t out_rows = 0;
    /// Scatter mode over a map with an edge at every (row, tap) and rows x volume == out_rows: every
    /// output row has exactly one edge, so the kernels write all of them and the output is not zeroed
    /// first (the generated target of a transposed plan with K = S).
    bool covers_output = false;
    const void* x = nullptr;
    /// Rows of x: `rows` in scatter mode, the source side's voxels when gathering. 0 when unknown; the
    /// CUDA engine's TF32 passes read it to round x once (conv_implicit_gemm.cu, rounds_x_once).
    int64_t x_rows = 0;
    const void* weight = nullptr;
    bool transpose_weight = false;
    /// Tap t of the map takes the weight's tap volume - 1 - t: the other map of a plan on one grid with
    /// stride 1 and odd kernel sizes, whose rows of sources are its rows of targets with the taps mirrored.
    bool reverse_taps = false;
    void* out = nullptr;
    int64_t x_channels = 0;
    int64_t out_channels = 0;
    DType dtype = DType::Float32;
    /// The weight's dtype: `dtype`, or Float32 with a Float16 / BFloat16 `dtype` (CUDA only), whose
    /// weights are rounded to `dtype` as they are packed: the results of converting them first.
    DType weight_dtype = DType::Float32;
};

/// grad_weight[co, ci, t] = sum_r grad[r, co] * x[map[r][t], ci] over a map with rows = target voxels,
/// or with `rows_are_source` over the transposed map (rows = source voxels): sum_s x[s, ci] *
/// grad[map[s][t], co]. Partial sums are added in an order fixed by the problem's shape, so results
/// are bitwise reproducible. rows_are_source is CUDA only (the CPU backend sums over target rows).
struct MapWeightGradient {
    const int32_t* map = nullptr;
    /// Optional: the same map tap by tap (tap_major[t * rows + r] == map[r * volume + t]), which the CUDA
    /// engine reads contiguously where `map` costs it a sector per entry.
    const int32_t* tap_major = nullptr;
    int64_t rows = 0;
    int32_t volume = 1;
    bool rows_are_source = false;
    /// Rows of the operand the map gathers from (the other side's voxels); 0 when unknown. A hint for
    /// the order of the CUDA engine's blocks, no part of the sums.
    int64_t gathered_rows = 0;
    const void* x = nullptr;
    const void* grad = nullptr;
    void* grad_weight = nullptr;
    int64_t in_channels = 0;
    int64_t out_channels = 0;
    DType dtype = DType::Float32;
    /// grad_weight's dtype: `dtype`, or Float32 with a Float16 / BFloat16 `dtype` (CUDA only): the
    /// float32 sums as they are, which rounded to `dtype` are the 16-bit result.
    DType grad_weight_dtype = DType::Float32;
};

// clang-format off
// X(return type, name, parameters...). Preconditions and costs are documented per entry; "grid" is
// always on the backend's device, and outputs live on the grid's (or the context's) device and stream.
#define SPARSEGRID_BACKEND_ENTRY_POINTS(X)                                                                            \
    /* ---- runtime ---- */                                                                                        \
    /* The device's default allocator (host: 64-byte aligned; CUDA: stream-ordered cudaMallocAsync). */           \
    X(Allocator&, default_allocator, void)                                                                         \
    /* Devices of this backend usable by the process (CPU: 1). */                                                 \
    X(int, device_count, void)                                                                                     \
    /* Copies between the host and this backend's devices; returns after the copy when dst is the host. */       \
    X(void, copy_bytes, void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes,       \
      void* stream)                                                                                                \
    X(void, fill_bytes, void* dst, Device device, int value, std::size_t bytes, void* stream)                      \
    /* Waits for the context's stream (an explicit request: not counted as a host synchronisation). */           \
    X(void, synchronize, const Context& ctx)                                                                       \
    /* Timing events on the context's stream (CPU: a steady-clock reading). */                                    \
    X(void*, create_event, Device device)                                                                          \
    X(void, destroy_event, void* event)                                                                            \
    X(void, record_event, void* event, const Context& ctx)                                                         \
    /* Milliseconds between two recorded events; waits for the second. */                                        \
    X(double, elapsed_ms, void* start, void* stop)                                                                 \
    /* ---- topology ---- */                                                                                       \
    /* Canonical grid of arbitrary coordinates, member m owning [offsets[m], offsets[m+1]). */                    \
    X(GridTopology, build_from_ijk, const int32_t* ijk, const std::vector<int64_t>& offsets, const Context& ctx)    \
    /* ijk of world points (point_to_index per axis). *first_bad: the smallest point index whose voxel is not */ \
    /* finite and in int32 range, else -1 (then the returned coordinates are not meaningful). */                  \
    X(Buffer<int32_t>, points_to_ijk, const double* xyz, const std::vector<int64_t>& offsets,                      \
      const std::vector<MemberTransform>& transforms, int64_t* first_bad, const Context& ctx)                      \
    /* Voxels met by triangles; raises the errors of core/index_triangle.h for bad faces and vertices. */        \
    X(GridTopology, from_mesh, const double* vertices, const std::vector<int64_t>& vertex_offsets,                 \
      const int32_t* faces, const std::vector<int64_t>& face_offsets,                                              \
      const std::vector<MemberTransform>& transforms, const Context& ctx)                                          \
    /* General paths of generated grids: candidates, sort, unique. out_box covers the output and fits the */     \
    /* key codec; the front end has checked the candidate count (voxels x per-voxel candidates) for int64. */     \
    X(GridTopology, conv_grid, const GridStorage& grid, const ConvGeometry& g, const CoordBox& out_box)            \
    /* conv_grid of each geometry (out_boxes[i] for gs[i]), built together: CUDA syncs once for all. */          \
    X(std::vector<GridTopology>, conv_grids, const GridStorage& grid, const std::vector<ConvGeometry>& gs,         \
      const std::vector<CoordBox>& out_boxes)                                                                      \
    X(GridTopology, conv_transpose_grid, const GridStorage& grid, const ConvGeometry& g, const CoordBox& out_box)  \
    X(GridTopology, coarsened_grid, const GridStorage& grid, const Vec3i& factor, const CoordBox& out_box)         \
    X(GridTopology, refined_grid, const GridStorage& grid, const Vec3i& factor, const CoordBox& out_box)           \
    /* Order-preserving paths for a factor 2^p on every axis: no sort. out_box is the exact output box. */      \
    X(GridTopology, coarsened_by_power_of_two, const GridStorage& grid, int32_t log2_factor,                       \
      const CoordBox& out_box)                                                                                     \
    X(GridTopology, refined_by_power_of_two, const GridStorage& grid, int32_t log2_factor, const CoordBox& out_box) \
    /* Voxels with a nonzero mask byte, order preserved. */                                                      \
    X(GridTopology, pruned_grid, const GridStorage& grid, const uint8_t* mask, Buffer<int64_t>* kept_index)        \
    /* Per-member union; equal batch sizes, out_box covers both. */                                              \
    X(GridTopology, merged_grid, const GridStorage& a, const GridStorage& b, const CoordBox& out_box)              \
    /* Voxels of member m inside boxes[6m .. 6m+6) = (lo, hi) inclusive (on the grid's device), order */          \
    /* preserved; *kept_index gets each kept voxel's index in `grid`. */                                         \
    X(GridTopology, clipped_grid, const GridStorage& grid, const int32_t* boxes, Buffer<int64_t>* kept_index)      \
    /* [B, 6] per-member bounds (lo, hi) on the grid's device; empty members (0, 0, 0, -1, -1, -1). */            \
    X(Buffer<int32_t>, bbox, const GridStorage& grid)                                                              \
    /* ---- lookups and kernel maps ---- */                                                                        \
    X(Buffer<int64_t>, ijk_to_index, const GridStorage& grid, const int32_t* query_ijk,                            \
      const std::vector<int64_t>& query_offsets)                                                                   \
    /* [target voxels, volume] map; source has < 2^31 voxels. `symmetric` (same grid, stride 1, odd */            \
    /* kernels): only the taps below the centre are looked up, the rest mirrored. */                             \
    X(Buffer<int32_t>, neighbour_map, const GridStorage& source, const GridStorage& target, const ConvGeometry& g, \
      MapDirection direction, bool symmetric)                                                                      \
    /* Transposed-direction map of the K = S = 2 subdivision of `coarse`: row 8n + t holds n at tap t. */        \
    X(Buffer<int32_t>, subdivision_map, const GridStorage& coarse)                                                 \
    X(PairLists, pairs_by_tap, const Buffer<int32_t>& map, int64_t num_target, int32_t kernel_volume,              \
      const Context& ctx)                                                                                          \
    /* num_target < 2^31. */                                                                                       \
    X(Buffer<int32_t>, transpose_map, const Buffer<int32_t>& map, int64_t num_target, int64_t num_source,          \
      int32_t kernel_volume, const Context& ctx)                                                                   \
    X(int64_t, count_edges, const Buffer<int32_t>& map, const Context& ctx)                                        \
    /* ---- convolution ---- */                                                                                    \
    /* A permutation of the map's rows stably sorted by the set of taps at which each has an edge. */            \
    /* 1 < volume <= 64, rows < 2^31. */                                                                           \
    X(Buffer<int32_t>, row_order, const int32_t* map, int64_t rows, int32_t volume, const Context& ctx)            \
    /* The map with taps as rows: out[t * rows + r] = map[r * volume + t]. */                                     \
    X(Buffer<int32_t>, tap_major_map, const int32_t* map, int64_t rows, int32_t volume, const Context& ctx)        \
    X(void, map_convolution, const MapConvolution& args, const Context& ctx)                                       \
    X(void, map_weight_gradient, const MapWeightGradient& args, const Context& ctx)                               \
    /* The tile configurations of the tensor-core convolution engine (CPU: none); all sum alike. */               \
    X(std::vector<std::string>, engine_configurations, void)                                                       \
    /* Forces the engine onto a configuration for the process: a name from the list, "auto" (the */              \
    /* automatic choice) or "off" (the tiled kernels instead of the engine). */                                    \
    X(void, force_engine_configuration, const std::string& name)                                                   \
    /* Tuning of the engine's configuration per shape, and the file of recorded choices ("": none). */            \
    X(void, set_engine_tuning, bool enabled, const std::string& file)                                              \
    /* ---- feature normalization ---- */                                                                          \
    /* Sums in the order of core/batch_norm_math.h; the front end checked shapes, dtypes and pointers. */        \
    X(void, batch_norm_forward, const BatchNormForward& args, const Context& ctx)                                  \
    X(void, batch_norm_backward, const BatchNormBackward& args, const Context& ctx)

// clang-format on

#define SPARSEGRID_DECLARE_ENTRY_POINT(ReturnType, name, ...) static ReturnType name(__VA_ARGS__);

struct CpuBackend {
    SPARSEGRID_BACKEND_ENTRY_POINTS(SPARSEGRID_DECLARE_ENTRY_POINT)
};

#if defined(SPARSEGRID_WITH_CUDA)
struct CudaBackend {
    SPARSEGRID_BACKEND_ENTRY_POINTS(SPARSEGRID_DECLARE_ENTRY_POINT)
};
#endif

}  // namespace sparsegrid::detail
