// Argument validation and overflow-checked output geometry of the front ends. Every check names the
// operation the user called; nothing below the front ends validates again.
#pragma once

#include <sparsegrid/buffer.h>
#include <sparsegrid/types.h>

#include "core/errors.h"
#include "core/geometry.h"

#include <string>
#include <vector>

namespace sparsegrid::detail {

/// kernel_size[a] >= 1, stride[a] >= 1, kernel volume fits int32.
ConvGeometry make_conv_geometry(const char* op, const Vec3i& kernel_size, const Vec3i& stride);
/// values[a] >= 1 (name is the argument's name in messages).
void check_positive(const char* op, const char* name, const Vec3i& values);
/// offsets: B+1 >= 2 entries, offsets[0] == 0, non-decreasing, offsets[B] == expected_total.
void check_offsets(const char* op, const char* name, const std::vector<int64_t>& offsets, int64_t expected_total);
/// transforms: empty (-> defaults) or one per member, voxel sizes positive and finite, origins finite.
std::vector<MemberTransform> resolve_transforms(const char* op, const std::vector<MemberTransform>& transforms,
                                                int64_t batch_size, bool allow_empty);
/// The most voxels a grid holds: 2^31 - 1 (its kernel maps index voxels with int32).
constexpr int64_t kMaxGridVoxels = 2147483647;
/// Raises, naming `op`, when a grid of `count` voxels (`what`: "input", "output") exceeds kMaxGridVoxels.
void check_grid_voxels(const char* op, const char* what, int64_t count);
/// A mask of one byte per voxel, with data when non-empty.
void check_mask(const char* op, Span<const uint8_t> mask, int64_t num_voxels);
/// Boxes of generated grids, computed in int64 and checked against int32 (the error names the op,
/// the axis and the coordinate that would not fit).
CoordBox conv_grid_box(const char* op, const CoordBox& box, const ConvGeometry& g);
CoordBox conv_transpose_grid_box(const char* op, const CoordBox& box, const ConvGeometry& g);
CoordBox coarsened_box(const CoordBox& box, const Vec3i& factor);
CoordBox refined_box(const char* op, const CoordBox& box, const Vec3i& factor);

}  // namespace sparsegrid::detail
