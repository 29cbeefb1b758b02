// Value types of the sparsegrid API: coordinates, per-member transforms and boxes, map directions, edge
// lists and element types. Plain data, shared by the public classes, the front ends and both backends.
#pragma once

#include <sparsegrid/buffer.h>
#include <sparsegrid/context.h>

#include <array>
#include <cstdint>
#include <vector>

namespace sparsegrid {

/// Integer voxel coordinate (i, j, k), also used for per-axis kernel sizes, strides and factors.
using Vec3i = std::array<int32_t, 3>;
/// World-space vector (x, y, z) or per-axis voxel size.
using Vec3d = std::array<double, 3>;

/// World transform of one member: xyz = origin + voxel_size * ijk (component-wise); the origin is the
/// world position of the centre of voxel (0, 0, 0).
struct MemberTransform {
    Vec3d voxel_size{1.0, 1.0, 1.0};
    Vec3d origin{0.0, 0.0, 0.0};
    bool operator==(const MemberTransform& o) const { return voxel_size == o.voxel_size && origin == o.origin; }
    bool operator!=(const MemberTransform& o) const { return !(*this == o); }
};

/// Axis-aligned integer box [lo, hi] (inclusive). The default box is empty (hi < lo).
struct CoordBox {
    Vec3i lo{0, 0, 0};
    Vec3i hi{-1, -1, -1};
    bool empty() const { return hi[0] < lo[0]; }
    bool operator==(const CoordBox& o) const { return lo == o.lo && hi == o.hi; }
    bool operator!=(const CoordBox& o) const { return !(*this == o); }
};

/// Direction of a kernel map: Forward from the fine source to the coarse target, Transposed the reverse
/// (see kernel_map.h).
enum class MapDirection : int8_t { Forward = 0, Transposed = 1 };

/// Edges grouped by tap (CSR): edges of tap t are [tap_offsets[t], tap_offsets[t+1]) of
/// source_index / target_index, in increasing target index. Built from the neighbour map.
struct PairLists {
    std::vector<int64_t> tap_offsets;  ///< host, kernel_volume + 1 entries
    Buffer<int32_t> source_index;      ///< on the map's device
    Buffer<int32_t> target_index;      ///< on the map's device
    int64_t num_pairs() const { return tap_offsets.empty() ? 0 : tap_offsets.back(); }
};

/// Element type of features and weights. Float16 and BFloat16 run on CUDA only and accumulate in
/// float32.
enum class DType : int8_t { Float32 = 0, Float64 = 1, Float16 = 2, BFloat16 = 3 };

/// Bytes of one element of `dtype`.
constexpr int64_t dtype_size(DType dtype) { return dtype == DType::Float64 ? 8 : dtype == DType::Float32 ? 4 : 2; }

}  // namespace sparsegrid
