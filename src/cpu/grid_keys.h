// Keys of an existing grid and the canonical grid of a key set, shared by the CPU topology and
// kernel-map code.
#pragma once

#include "core/storage.h"
#include "cpu/parallel.h"

namespace sparsegrid::detail::cpu {

/// Keys of every voxel of `grid` in voxel order (hence ascending). The codec must cover grid's box.
template <typename KeyT>
std::vector<KeyT> encode_grid_keys(const GridStorage& grid, const KeyCodec& codec) {
    const int32_t* ijk = grid.topology.ijk.data();
    std::vector<KeyT> keys(static_cast<size_t>(grid.num_voxels()));
    parallel_chunks(grid.num_voxels(), [&](int64_t begin, int64_t end, int, int) {
        for_each_voxel(grid.topology.offsets, begin, end, [&](int64_t member, int64_t n) {
            const int32_t* v = ijk + 3 * n;
            keys[n] = encode_key<KeyT>(codec, member, v[0], v[1], v[2]);
        });
    });
    return keys;
}

/// Sorts and deduplicates `keys` and decodes them into a grid of `batch_size` members on ctx.device.
template <typename KeyT>
GridTopology canonical_topology(std::vector<KeyT>& keys, const KeyCodec& codec, int64_t batch_size, const Context& ctx);

/// Offsets, box and device buffers of a grid whose voxel-order ijk is already in `ijk`.
GridTopology finish_topology(Buffer<int32_t> ijk, std::vector<int64_t> offsets, const Context& ctx);

}  // namespace sparsegrid::detail::cpu
