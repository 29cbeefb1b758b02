// Naive, single-threaded reference implementations of the topology operations and kernel maps, written
// from the semantics in DESIGN.md without any of the library's machinery: emit every candidate, then
// sort + unique packed 64-bit keys; look neighbours up in a std::unordered_map. `sparsegrid bench` times
// a few of them as an in-run baseline and compares every library result against them.
#pragma once

#include <sparsegrid/grid_batch.h>
#include <sparsegrid/kernel_map.h>
#include <sparsegrid/types.h>

#include <cstdint>
#include <vector>

namespace sparsegrid_tool {

using sparsegrid::Vec3i;

/// Voxels of a batch on the host, member-major: member m owns voxels [offsets[m], offsets[m + 1]).
struct HostBatch {
    std::vector<Vec3i> voxels;
    std::vector<int64_t> offsets{0};

    int64_t batch_size() const { return static_cast<int64_t>(offsets.size()) - 1; }
    int64_t num_voxels() const { return static_cast<int64_t>(voxels.size()); }
};

HostBatch flatten(const std::vector<std::vector<Vec3i>>& members);
/// The grid's voxels in its voxel order (syncs on CUDA).
HostBatch host_copy(const sparsegrid::GridBatch& grid);

/// Sorted, duplicate-free packed keys: 16 bits of member index, then 16 bits per coordinate biased by
/// 2^15, so numeric order is member-major, then lexicographic (i, j, k).
using KeySet = std::vector<uint64_t>;

/// Whether packed keys can represent `batch` and every result of the reference operations on it
/// (coordinates within +-16000 before an operation, at most 2^16 members).
bool keys_can_represent(const HostBatch& batch);

KeySet packed_keys(const HostBatch& batch);
/// Per axis pb = (K - 1) / 2; conv_grid keeps every c with S*c + tap - pb in the batch.
KeySet naive_conv_grid(const HostBatch& batch, const Vec3i& kernel_size, const Vec3i& stride);
/// {S*c + tap - pb}: the generative transposed output (dilated_grid(d) is the case K = 2d + 1, S = 1).
KeySet naive_conv_transpose_grid(const HostBatch& batch, const Vec3i& kernel_size, const Vec3i& stride);
KeySet naive_coarsened_grid(const HostBatch& batch, int32_t factor);
KeySet naive_refined_grid(const HostBatch& batch, int32_t factor);

/// Dense neighbour map [target.num_voxels(), kernel volume] with source and target in their voxel order.
std::vector<int32_t> naive_neighbour_map(const HostBatch& source, const HostBatch& target, const Vec3i& kernel_size,
                                         const Vec3i& stride, sparsegrid::MapDirection direction);

/// Per-tap edge lists derived from a dense map, laid out like sparsegrid::PairLists.
struct HostPairLists {
    std::vector<int64_t> tap_offsets;
    std::vector<int32_t> source_index;
    std::vector<int32_t> target_index;
    bool operator==(const HostPairLists& other) const {
        return tap_offsets == other.tap_offsets && source_index == other.source_index &&
            target_index == other.target_index;
    }
};
HostPairLists naive_pairs_by_tap(const std::vector<int32_t>& neighbour_map, int32_t kernel_volume);

/// True when every member's voxels are strictly increasing in the Morton order documented in
/// grid_batch.h (which also rules out duplicates).
bool is_morton_ordered(const HostBatch& batch);

}  // namespace sparsegrid_tool
