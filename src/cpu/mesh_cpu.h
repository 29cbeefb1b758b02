// CPU voxelisation of triangle meshes (see GridBatch::from_mesh).
#pragma once

#include "core/storage.h"

#include <vector>

namespace sparsegrid::detail::cpu {

/// Preconditions (checked by the front end): triples, offsets consistent, face indices within their
/// member's vertices, one transform per member. Raises Error for voxel indices outside int32.
GridTopology from_mesh(const double* vertices, const std::vector<int64_t>& vertex_offsets, const int32_t* faces,
                       const std::vector<int64_t>& face_offsets, const std::vector<MemberTransform>& transforms,
                       const Context& ctx);

}  // namespace sparsegrid::detail::cpu
