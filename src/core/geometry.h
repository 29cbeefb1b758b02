// Backend-independent geometry of grids: key codecs, boxes, the fast-path tests and candidate counts.
// Used by the front ends (to choose an algorithm and size its output) and by both backends (to run it).
#pragma once

#include <sparsegrid/types.h>

#include "core/keys.h"
#include "core/taps.h"

#include <cmath>
#include <cstdint>

namespace sparsegrid::detail {

/// The smallest codec covering `box` for a batch of `batch_size` members.
KeyCodec make_codec(const CoordBox& box, int64_t batch_size);

/// The smallest box containing both (either may be empty).
CoordBox union_box(const CoordBox& a, const CoordBox& b);

/// Is `factor` the same power of two 2^p on every axis (p returned)? Those factors keep voxel order
/// under refinement and coarsening, so the sort can be skipped.
bool uniform_power_of_two(const Vec3i& factor, int32_t* log2_factor);

/// Candidate output voxels one fine voxel emits in conv_grid: the per-axis coarse ranges multiplied,
/// ceil(K / S) per axis.
SG_HD int64_t conv_grid_candidates_per_voxel(const ConvGeometry& g) {
    int64_t per_voxel = 1;
    for (int a = 0; a < 3; ++a) per_voxel *= (g.kernel[a] + g.stride[a] - 1) / g.stride[a];
    return per_voxel;
}

/// The voxel index of world coordinate x on one axis, floor((x - origin) / voxel_size + 1/2), as a
/// double; valid when it lies in int32 range (NaN and infinities do not).
SG_HD double point_to_index(double x, double origin, double voxel_size) {
    return floor((x - origin) / voxel_size + 0.5);
}
SG_HD bool index_in_int32(double index) { return index >= -2147483648.0 && index <= 2147483647.0; }

}  // namespace sparsegrid::detail
