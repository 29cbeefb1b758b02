// Kernel maps: which source voxel feeds which target voxel through which kernel tap.
//
// Taps are numbered t = t0*K1*K2 + t1*K2 + t2 (t0 along i), matching PyTorch's weight layout
// [Cout, Cin, K0, K1, K2]. Per axis pb = (K - 1) / 2 and the edge relation is fine = S*coarse + tap - pb.
//   Forward    (source fine F -> target coarse C): map[c][t] = index of S*c + tap(t) - pb in F, else -1.
//   Transposed (source coarse C -> target fine F): map[f][t] = index of the c in C with
//              S*c + tap(t) - pb = f, else -1.
// Both relations are partial functions in each direction, so the transposed-direction map over (C, F)
// holds exactly the edges of the forward map over (F, C); KernelMap::transposed() converts one into the
// other without any lookup.
#pragma once

#include <sparsegrid/buffer.h>
#include <sparsegrid/grid_batch.h>
#include <sparsegrid/types.h>

#include <vector>

namespace sparsegrid {

class KernelMap {
public:
    KernelMap() = default;

    /// Dense neighbour map [num_target, kernel_volume] int32, row-major, -1 where there is no edge.
    const Buffer<int32_t>& neighbour_map() const { return m_neighbour_map; }
    int64_t num_source() const { return m_num_source; }
    int64_t num_target() const { return m_num_target; }
    const Vec3i& kernel_size() const { return m_kernel_size; }
    const Vec3i& stride() const { return m_stride; }
    MapDirection direction() const { return m_direction; }
    int32_t kernel_volume() const { return m_kernel_size[0] * m_kernel_size[1] * m_kernel_size[2]; }
    Device device() const { return m_neighbour_map.device(); }

    /// Per-tap edge lists. Cost: 2 launches and 1 sync (pair count) on CUDA.
    PairLists pairs_by_tap(const Context& ctx) const;
    PairLists pairs_by_tap() const;

    /// The same edges seen from the other side: source and target swapped, direction flipped. No lookups.
    KernelMap transposed(const Context& ctx) const;
    KernelMap transposed() const;

    /// Number of edges (non-negative entries). Syncs on CUDA.
    int64_t num_edges() const;

    KernelMap(Buffer<int32_t> neighbour_map, int64_t num_source, int64_t num_target, Vec3i kernel_size, Vec3i stride,
              MapDirection direction, Context ctx);

private:
    Buffer<int32_t> m_neighbour_map;
    int64_t m_num_source = 0;
    int64_t m_num_target = 0;
    Vec3i m_kernel_size{1, 1, 1};
    Vec3i m_stride{1, 1, 1};
    MapDirection m_direction = MapDirection::Forward;
    Context m_context;
};

/// The kernel map between two grids of the same batch size and device. Forward: `source` is the fine
/// grid, `target` the coarse one; Transposed: the reverse. Any grids are allowed (edges are looked up,
/// not assumed). Requires source.num_voxels() < 2^31. Cost: one lookup-table build over the source and
/// one launch over target voxels x taps; no sync.
KernelMap neighbour_map(const GridBatch& source, const GridBatch& target, const Vec3i& kernel_size, const Vec3i& stride,
                        MapDirection direction = MapDirection::Forward);

/// A generated grid and the kernel map from its source, built together.
struct GridAndMap {
    GridBatch grid;
    KernelMap map;
};

/// source.conv_transpose_grid(K, S) and neighbour_map(source, that grid, K, S, Transposed) in one
/// build, identical to the two calls. For K = S = 2 on every axis the map comes straight from the
/// subdivision (fine voxel 8n + t is reached from coarse voxel n through tap t): no lookups, no sync.
GridAndMap conv_transpose_grid_and_map(const GridBatch& source, const Vec3i& kernel_size, const Vec3i& stride);

/// source.conv_grid(K, S) and neighbour_map(source, that grid, K, S, Forward), identical to the two calls.
GridAndMap conv_grid_and_map(const GridBatch& source, const Vec3i& kernel_size, const Vec3i& stride);

}  // namespace sparsegrid
