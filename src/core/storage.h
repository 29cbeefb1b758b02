// What a GridBatch holds. Backends produce a GridTopology; the front end adds transforms and context.
#pragma once

#include <sparsegrid/buffer.h>
#include <sparsegrid/types.h>

#include <vector>

namespace sparsegrid::detail {

struct GridTopology {
    std::vector<int64_t> offsets;    ///< host copy, B+1
    Buffer<int64_t> offsets_buffer;  ///< on the device
    Buffer<int32_t> ijk;             ///< N x 3, voxel order
    CoordBox box;                    ///< contains every voxel
};

struct GridStorage {
    GridTopology topology;
    std::vector<MemberTransform> transforms;
    Context context;

    int64_t batch_size() const { return static_cast<int64_t>(topology.offsets.size()) - 1; }
    int64_t num_voxels() const { return topology.offsets.back(); }
};

}  // namespace sparsegrid::detail
