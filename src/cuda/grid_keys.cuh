// Keys of an existing grid on the device, shared by the CUDA topology and kernel-map code (the canonical
// grid of a set of keys is in canonical_grid.cuh).
#pragma once

#include "core/storage.h"
#include "cuda/cuda_common.cuh"

namespace sparsegrid::detail::cuda {

template <typename KeyT>
__global__ void encode_grid_keys_kernel(const int32_t* ijk, const int64_t* offsets, int64_t batch_size, int64_t count,
                                        KeyCodec codec, KeyT* keys) {
    SG_GRID_STRIDE_LOOP(n, count) {
        keys[n] = encode_key<KeyT>(codec, member_of(offsets, batch_size, n), ijk[3 * n], ijk[3 * n + 1],
                                   ijk[3 * n + 2]);
    }
}

/// Writes the keys of every voxel of `grid` (ascending, voxel order) to `keys`. The codec must cover
/// the grid's box.
template <typename KeyT>
void encode_grid_keys(const GridStorage& grid, const KeyCodec& codec, KeyT* keys) {
    const int64_t n = grid.num_voxels();
    if (n == 0) return;
    const cudaStream_t stream = stream_of(grid.context);
    encode_grid_keys_kernel<KeyT><<<blocks_for(n), kThreads, 0, stream>>>(
        grid.topology.ijk.data(), grid.topology.offsets_buffer.data(), grid.batch_size(), n, codec, keys);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

}  // namespace sparsegrid::detail::cuda
