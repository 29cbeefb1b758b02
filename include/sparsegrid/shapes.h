// Procedural closed shapes voxelised as surface shells: deterministic synthetic workloads for tests,
// benchmarks and examples. The same seed gives the same voxels with every compiler, standard library,
// thread count and platform: random numbers come from std::mt19937_64 (whose output the C++ standard
// fixes) turned into doubles by explicit code, and the shapes are evaluated with +, -, *, / and sqrt
// only (all correctly rounded in IEEE 754), never with library trigonometry.
#pragma once

#include <sparsegrid/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace sparsegrid {

enum class ShapeKind : int8_t { Ellipsoid = 0, Torus = 1, Box = 2, Capsule = 3 };

/// "ellipsoid", "torus", "box" or "capsule".
std::string shape_kind_name(ShapeKind kind);

/// A closed shape in normalised space. A grid of resolution R covers the unit cube: voxel (i, j, k) of
/// [0, R)^3 is the cube [i/R, (i+1)/R] x [j/R, (j+1)/R] x [k/R, (k+1)/R], so one ShapeParams gives the
/// same shape at every resolution.
///
/// A point p of normalised space has local coordinates q = rotation^T (p - centre), and the shape is
/// defined in local coordinates by `size`:
///   Ellipsoid: semi-axes (a, b, c) along the local axes.
///   Box:       half side lengths (a, b, c).
///   Torus:     (major radius, minor radius, unused); the ring lies in the local x-y plane.
///   Capsule:   (half length of the axis segment, radius, unused); the segment lies on the local z axis.
struct ShapeParams {
    ShapeKind kind = ShapeKind::Ellipsoid;
    Vec3d centre{0.5, 0.5, 0.5};
    Vec3d size{0.25, 0.25, 0.25};
    /// Orthonormal 3x3 matrix, row-major, mapping local to normalised coordinates.
    std::array<double, 9> rotation{1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0};
};

/// Implicit function of the shape at a point of normalised space: negative strictly inside, positive
/// outside, zero on the boundary. Only its sign is meaningful (it is not a distance).
double shape_implicit(const ShapeParams& shape, const Vec3d& point);

/// Radius of a ball around shape.centre that contains the whole shape.
double shape_bounding_radius(const ShapeParams& shape);

/// The surface voxels of `shape` in the grid [0, resolution)^3.
///
/// Definition: a voxel is a surface voxel when the implicit function changes sign among its 8 corners:
/// at least one corner strictly inside (shape_implicit < 0) and at least one not. These are the voxels
/// the boundary passes through, a shell without holes (no 26-connected path leads from an interior
/// voxel to an exterior one around it); a shape cut by the grid boundary is open there.
///
/// Output: lexicographic (i, j, k) order, no duplicates. Deterministic (independent of thread count).
/// Preconditions (Error otherwise): resolution in [1, 4096]; centre, size and rotation finite; size
/// components used by the kind > 0; rotation orthonormal (tolerance 1e-6).
/// Cost: one implicit evaluation per voxel corner in the shape's bounding box, in parallel over slabs
/// of the box with OpenMP (serial when already inside a parallel region); about 0.4 s at resolution
/// 512 on 2 cores.
std::vector<Vec3i> surface_voxels(const ShapeParams& shape, int32_t resolution);

/// Shape number `index` (>= 0) of the random sequence `seed`: an ellipsoid, torus, box or capsule (each
/// with probability 1/4) with random proportions and a uniformly random orientation, placed so that
/// it lies inside the unit cube with a margin of 0.02 (bounding radius at most 0.47). Shapes of one
/// seed are independent of each other: random_shape(s, i) does not depend on the other indices.
ShapeParams random_shape(uint64_t seed, int64_t index);

/// Member m of the result is surface_voxels(random_shape(seed, m), resolution), for m in
/// [0, batch_size). Preconditions: batch_size >= 0, resolution in [1, 4096] (Error otherwise).
/// Cost: parallel over members with OpenMP. At resolution 64 a member has about 3k to 13k voxels
/// (seed 0: 114,472 voxels for 16 members, 348,645 for 48; about 50 ms on 2 cores).
std::vector<std::vector<Vec3i>> synthetic_surface_batch(int64_t batch_size, int32_t resolution, uint64_t seed);

/// Largest resolution surface_voxels and synthetic_surface_batch accept.
constexpr int32_t kMaxShapeResolution = 4096;

}  // namespace sparsegrid
