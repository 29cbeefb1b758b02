// Argument validation and overflow-checked geometry shared by every backend's front end.
#pragma once

#include <sparsegrid/grid_batch.h>
#include <sparsegrid/types.h>

#include "core/keys.h"
#include "core/taps.h"

#include <sstream>
#include <string>
#include <vector>

namespace sparsegrid::detail {

/// Builds an Error message from stream fragments: throw_error("conv_grid: stride[", a, "] must be ...").
template <typename... Parts>
[[noreturn]] void throw_error(const Parts&... parts) {
    std::ostringstream message;
    (message << ... << parts);
    throw Error(message.str());
}

std::string to_string(const Vec3i& v);
std::string to_string(const Vec3d& v);

/// kernel_size[a] >= 1, stride[a] >= 1, kernel volume fits int32.
ConvGeometry make_conv_geometry(const char* op, const Vec3i& kernel_size, const Vec3i& stride);
/// factor[a] >= 1 (name is the argument's name in messages).
void check_positive(const char* op, const char* name, const Vec3i& values);
/// offsets: B+1 >= 2 entries, offsets[0] == 0, non-decreasing, offsets[B] == expected_total.
void check_offsets(const char* op, const char* name, const std::vector<int64_t>& offsets, int64_t expected_total);
/// transforms: empty (-> defaults) or one per member, voxel sizes positive and finite, origins finite.
std::vector<MemberTransform> resolve_transforms(const char* op, const std::vector<MemberTransform>& transforms,
                                                int64_t batch_size, bool allow_empty);
/// a * b for sizes, raising instead of wrapping.
int64_t checked_mul(const char* op, const char* what, int64_t a, int64_t b);

/// Boxes of generated grids, computed in int64 and checked against int32 (the error names the op,
/// the axis and the coordinate that would not fit).
CoordBox conv_grid_box(const char* op, const CoordBox& box, const ConvGeometry& g);
CoordBox conv_transpose_grid_box(const char* op, const CoordBox& box, const ConvGeometry& g);
CoordBox coarsened_box(const CoordBox& box, const Vec3i& factor);
CoordBox refined_box(const char* op, const CoordBox& box, const Vec3i& factor);
CoordBox union_box(const CoordBox& a, const CoordBox& b);

/// The smallest codec covering `box` for a batch of `batch_size` members.
KeyCodec make_codec(const CoordBox& box, int64_t batch_size);

/// Is `factor` the same power of two 2^p on every axis (p returned)? Used for order-preserving paths.
bool uniform_power_of_two(const Vec3i& factor, int32_t* log2_factor);

}  // namespace sparsegrid::detail
