// CPU voxelisation of triangle meshes (see GridBatch::from_mesh).
#pragma once

#include "core/storage.h"

#include <vector>

namespace sparsegrid::detail::cpu {

/// Preconditions (checked by the front end): triples, offsets consistent, one transform per member.
/// Checks the rest and raises Error, worded and ordered as on every backend (core/index_triangle.h):
/// face indices outside their member's vertices, non-finite vertices, voxel indices outside int32, a
/// candidate count beyond int64.
GridTopology from_mesh(const double* vertices, const std::vector<int64_t>& vertex_offsets, const int32_t* faces,
                       const std::vector<int64_t>& face_offsets, const std::vector<MemberTransform>& transforms,
                       const Context& ctx);

}  // namespace sparsegrid::detail::cpu
