// CUDA voxelisation of triangle meshes (see GridBatch::from_mesh): the CPU backend's result, bit for bit.
#pragma once

#include "core/storage.h"

#include <vector>

namespace sparsegrid::detail::cuda {

/// `vertices` and `faces` in ctx.device memory. Preconditions (checked by the front end): triples,
/// offsets consistent, one transform per member. Checks the rest on the device and raises Error worded
/// and ordered as on the CPU (core/index_triangle.h). Output in voxel order with the exact box.
/// Cost: 2 syncs (the hit count with the checks and the range box; then the member offsets), work
/// proportional to the voxels of the triangles' bounding boxes; the error path adds a few small copies.
GridTopology from_mesh(const double* vertices, const std::vector<int64_t>& vertex_offsets, const int32_t* faces,
                       const std::vector<int64_t>& face_offsets, const std::vector<MemberTransform>& transforms,
                       const Context& ctx);

}  // namespace sparsegrid::detail::cuda
