// Procedural surface shapes. Portability of the voxels is the point of this file: every floating-point
// result must be bit-identical across compilers and platforms, hence raw 64-bit draws turned into
// doubles here, quaternion rotations instead of trigonometry, and no fused multiply-add contraction.
#include <sparsegrid/shapes.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

// GCC never contracts a*b+c into an FMA in ISO mode (-std=c++17); clang does unless told not to.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace sparsegrid {

namespace {

constexpr double kPlacementMargin = 0.02;    // free space between a random shape and the cube's faces
constexpr double kMaxBoundingRadius = 0.47;  // 0.47 + 0.02 < 0.5: a centre position always exists
constexpr int64_t kSlabThickness = 16;       // i-slices per parallel work item of surface_voxels
constexpr double kRotationTolerance = 1e-6;

double square(double x) { return x * x; }

std::string format_double(double value) {
    std::ostringstream out;
    out.precision(17);
    out << value;
    return out.str();
}

// ---- implicit functions (local coordinates) ------------------------------------------------------

Vec3d to_local(const ShapeParams& shape, const Vec3d& point) {
    const Vec3d d{point[0] - shape.centre[0], point[1] - shape.centre[1], point[2] - shape.centre[2]};
    const auto& r = shape.rotation;
    // rotation^T * d: column a of the row-major matrix dotted with d.
    return {r[0] * d[0] + r[3] * d[1] + r[6] * d[2], r[1] * d[0] + r[4] * d[1] + r[7] * d[2],
            r[2] * d[0] + r[5] * d[1] + r[8] * d[2]};
}

double ellipsoid_implicit(const Vec3d& q, const Vec3d& semi_axes) {
    return square(q[0] / semi_axes[0]) + square(q[1] / semi_axes[1]) + square(q[2] / semi_axes[2]) - 1.0;
}

double box_implicit(const Vec3d& q, const Vec3d& half_sides) {
    return std::max(
        {std::fabs(q[0]) - half_sides[0], std::fabs(q[1]) - half_sides[1], std::fabs(q[2]) - half_sides[2]});
}

double torus_implicit(const Vec3d& q, double major_radius, double minor_radius) {
    const double ring_distance = std::sqrt(square(q[0]) + square(q[1])) - major_radius;
    return square(ring_distance) + square(q[2]) - square(minor_radius);
}

double capsule_implicit(const Vec3d& q, double half_length, double radius) {
    const double beyond_segment = std::max(std::fabs(q[2]) - half_length, 0.0);
    return square(q[0]) + square(q[1]) + square(beyond_segment) - square(radius);
}

// ---- validation ----------------------------------------------------------------------------------

void check_resolution(const char* operation, int32_t resolution) {
    if (resolution < 1 || resolution > kMaxShapeResolution)
        throw Error(std::string(operation) + ": resolution must be in [1, " + std::to_string(kMaxShapeResolution) +
                    "], got " + std::to_string(resolution));
}

int num_size_components(ShapeKind kind) { return (kind == ShapeKind::Torus || kind == ShapeKind::Capsule) ? 2 : 3; }

void check_shape(const char* operation, const ShapeParams& shape) {
    const std::string prefix = std::string(operation) + ": shape.";
    if (shape.kind != ShapeKind::Ellipsoid && shape.kind != ShapeKind::Torus && shape.kind != ShapeKind::Box &&
        shape.kind != ShapeKind::Capsule)
        throw Error(prefix + "kind must be Ellipsoid, Torus, Box or Capsule, got " +
                    std::to_string(static_cast<int>(shape.kind)));
    for (int a = 0; a < 3; ++a)
        if (!std::isfinite(shape.centre[a]))
            throw Error(prefix + "centre[" + std::to_string(a) + "] must be finite, got " +
                        format_double(shape.centre[a]));
    for (int a = 0; a < num_size_components(shape.kind); ++a)
        if (!(shape.size[a] > 0.0) || !std::isfinite(shape.size[a]))
            throw Error(prefix + "size[" + std::to_string(a) + "] must be finite and > 0 for a " +
                        shape_kind_name(shape.kind) + ", got " + format_double(shape.size[a]));
    const auto& r = shape.rotation;
    for (int row = 0; row < 3; ++row)
        for (int col = 0; col < 3; ++col) {
            const double dot = r[3 * row] * r[3 * col] + r[3 * row + 1] * r[3 * col + 1] +
                r[3 * row + 2] * r[3 * col + 2];
            const double expected = row == col ? 1.0 : 0.0;
            if (!(std::fabs(dot - expected) <= kRotationTolerance))
                throw Error(prefix + "rotation must be orthonormal (rows " + std::to_string(row) + " and " +
                            std::to_string(col) + " have dot product " + format_double(dot) + ", expected " +
                            format_double(expected) + ")");
        }
}

// ---- voxelisation --------------------------------------------------------------------------------

/// Inclusive voxel index range per axis that may hold surface voxels.
struct IndexRange {
    Vec3i lo{0, 0, 0};
    Vec3i hi{-1, -1, -1};
    bool empty() const { return hi[0] < lo[0] || hi[1] < lo[1] || hi[2] < lo[2]; }
};

IndexRange candidate_range(const ShapeParams& shape, int32_t resolution) {
    // A surface voxel has an inside corner, so it meets the bounding ball: i / R <= centre + radius and
    // (i + 1) / R >= centre - radius. One extra voxel on each side absorbs rounding.
    const double radius = shape_bounding_radius(shape);
    const double last = static_cast<double>(resolution - 1);
    IndexRange range;
    for (int a = 0; a < 3; ++a) {
        const double lo = std::floor((shape.centre[a] - radius) * resolution) - 2.0;
        const double hi = std::floor((shape.centre[a] + radius) * resolution) + 1.0;
        if (hi < 0.0 || lo > last) return IndexRange{};
        range.lo[a] = static_cast<int32_t>(std::max(lo, 0.0));
        range.hi[a] = static_cast<int32_t>(std::min(hi, last));
    }
    return range;
}

/// Per voxel column (j, k) of one corner plane x = i / R: which signs its 2 x 2 corners in that plane
/// take. Bit 0: some corner inside, bit 1: some corner outside.
class CornerPlaneSampler {
public:
    static constexpr uint8_t kInside = 1;
    static constexpr uint8_t kOutside = 2;

    CornerPlaneSampler(const ShapeParams& shape, int32_t resolution, const IndexRange& range)
        : m_shape(shape),
          m_resolution(resolution),
          m_range(range),
          m_num_j(static_cast<int64_t>(range.hi[1]) - range.lo[1] + 1),
          m_num_k(static_cast<int64_t>(range.hi[2]) - range.lo[2] + 1) {}

    /// Position of voxel column (j, k) in a plane.
    int64_t column(int64_t j, int64_t k) const { return (j - m_range.lo[1]) * m_num_k + (k - m_range.lo[2]); }

    /// Fills `signs` for the corner plane at corner index i; `corners` is scratch space.
    void sample(int64_t i, std::vector<uint8_t>& corners, std::vector<uint8_t>& signs) const {
        const int64_t corner_row = m_num_k + 1;
        corners.resize(static_cast<std::size_t>((m_num_j + 1) * corner_row));
        const double x = corner_coordinate(i);
        for (int64_t dj = 0; dj <= m_num_j; ++dj) {
            const double y = corner_coordinate(m_range.lo[1] + dj);
            for (int64_t dk = 0; dk <= m_num_k; ++dk) {
                const Vec3d point{x, y, corner_coordinate(m_range.lo[2] + dk)};
                corners[dj * corner_row + dk] = shape_implicit(m_shape, point) < 0.0 ? kInside : kOutside;
            }
        }
        signs.resize(static_cast<std::size_t>(m_num_j * m_num_k));
        for (int64_t dj = 0; dj < m_num_j; ++dj)
            for (int64_t dk = 0; dk < m_num_k; ++dk) {
                const int64_t c = dj * corner_row + dk;
                signs[dj * m_num_k + dk] = corners[c] | corners[c + 1] | corners[c + corner_row] |
                    corners[c + corner_row + 1];
            }
    }

private:
    double corner_coordinate(int64_t index) const { return static_cast<double>(index) / m_resolution; }

    const ShapeParams& m_shape;
    int32_t m_resolution;
    IndexRange m_range;
    int64_t m_num_j;
    int64_t m_num_k;
};

/// Surface voxels with i in [i_first, i_last], lexicographic order. A voxel's corners lie in the two
/// corner planes i and i + 1, so two planes of sign summaries are kept.
std::vector<Vec3i> slab_surface(const CornerPlaneSampler& sampler, const IndexRange& range, int64_t i_first,
                                int64_t i_last) {
    constexpr uint8_t kBothSigns = CornerPlaneSampler::kInside | CornerPlaneSampler::kOutside;
    std::vector<uint8_t> corners, lower, upper;
    sampler.sample(i_first, corners, lower);
    std::vector<Vec3i> voxels;
    for (int64_t i = i_first; i <= i_last; ++i) {
        sampler.sample(i + 1, corners, upper);
        for (int64_t j = range.lo[1]; j <= range.hi[1]; ++j)
            for (int64_t k = range.lo[2]; k <= range.hi[2]; ++k) {
                const int64_t c = sampler.column(j, k);
                if ((lower[c] | upper[c]) == kBothSigns)
                    voxels.push_back({static_cast<int32_t>(i), static_cast<int32_t>(j), static_cast<int32_t>(k)});
            }
        std::swap(lower, upper);
    }
    return voxels;
}

// ---- random shapes -------------------------------------------------------------------------------

/// splitmix64's finaliser: decorrelates (seed, index) pairs before they seed the engine.
uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/// Random numbers whose values the C++ standard pins down: mt19937_64's output sequence is specified,
/// the distributions of <random> are not, so they are written out here.
class PortableRandom {
public:
    explicit PortableRandom(uint64_t seed) : m_engine(seed) {}
    /// Uniform in [0, 1) with 53 random bits.
    double uniform01() { return static_cast<double>(m_engine() >> 11) * 0x1.0p-53; }
    double uniform(double lo, double hi) { return lo + (hi - lo) * uniform01(); }
    /// Uniform in [0, n) for small n (bias below 2^-60).
    uint64_t below(uint64_t n) { return m_engine() % n; }

private:
    std::mt19937_64 m_engine;
};

/// A uniformly distributed rotation: a random unit quaternion by rejection from the 4-cube.
std::array<double, 9> random_rotation(PortableRandom& random) {
    double w, x, y, z, norm2;
    do {
        w = random.uniform(-1.0, 1.0);
        x = random.uniform(-1.0, 1.0);
        y = random.uniform(-1.0, 1.0);
        z = random.uniform(-1.0, 1.0);
        norm2 = w * w + x * x + y * y + z * z;
    } while (norm2 > 1.0 || norm2 < 1e-6);
    const double norm = std::sqrt(norm2);
    w /= norm;
    x /= norm;
    y /= norm;
    z /= norm;
    return {1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - w * z),       2.0 * (x * z + w * y),
            2.0 * (x * y + w * z),       1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - w * x),
            2.0 * (x * z - w * y),       2.0 * (y * z + w * x),       1.0 - 2.0 * (x * x + y * y)};
}

Vec3d random_size(ShapeKind kind, PortableRandom& random) {
    switch (kind) {
    case ShapeKind::Ellipsoid: {
        const double a = random.uniform(0.22, 0.46), b = random.uniform(0.22, 0.46);
        return {a, b, random.uniform(0.22, 0.46)};
    }
    case ShapeKind::Torus: {
        const double major = random.uniform(0.26, 0.37);
        return {major, random.uniform(0.07, 0.10), 0.0};
    }
    case ShapeKind::Box: {
        const double a = random.uniform(0.16, 0.34), b = random.uniform(0.16, 0.34);
        return {a, b, random.uniform(0.16, 0.34)};
    }
    case ShapeKind::Capsule: {
        const double half_length = random.uniform(0.20, 0.32);
        return {half_length, random.uniform(0.13, 0.17), 0.0};
    }
    }
    return {0.25, 0.25, 0.25};
}

}  // namespace

std::string shape_kind_name(ShapeKind kind) {
    switch (kind) {
    case ShapeKind::Ellipsoid:
        return "ellipsoid";
    case ShapeKind::Torus:
        return "torus";
    case ShapeKind::Box:
        return "box";
    case ShapeKind::Capsule:
        return "capsule";
    }
    return "unknown shape kind " + std::to_string(static_cast<int>(kind));
}

double shape_implicit(const ShapeParams& shape, const Vec3d& point) {
    const Vec3d q = to_local(shape, point);
    switch (shape.kind) {
    case ShapeKind::Ellipsoid:
        return ellipsoid_implicit(q, shape.size);
    case ShapeKind::Box:
        return box_implicit(q, shape.size);
    case ShapeKind::Torus:
        return torus_implicit(q, shape.size[0], shape.size[1]);
    case ShapeKind::Capsule:
        return capsule_implicit(q, shape.size[0], shape.size[1]);
    }
    return 1.0;
}

double shape_bounding_radius(const ShapeParams& shape) {
    const Vec3d& s = shape.size;
    switch (shape.kind) {
    case ShapeKind::Ellipsoid:
        return std::max({s[0], s[1], s[2]});
    case ShapeKind::Box:
        return std::sqrt(square(s[0]) + square(s[1]) + square(s[2]));
    case ShapeKind::Torus:
        return s[0] + s[1];
    case ShapeKind::Capsule:
        return s[0] + s[1];
    }
    return 0.0;
}

std::vector<Vec3i> surface_voxels(const ShapeParams& shape, int32_t resolution) {
    check_resolution("surface_voxels", resolution);
    check_shape("surface_voxels", shape);
    const IndexRange range = candidate_range(shape, resolution);
    if (range.empty()) return {};

    const CornerPlaneSampler sampler(shape, resolution, range);
    const int64_t num_slices = static_cast<int64_t>(range.hi[0]) - range.lo[0] + 1;
    const int64_t num_slabs = (num_slices + kSlabThickness - 1) / kSlabThickness;
    // Slabs are fixed by the range, not by the thread count, and concatenated in order: deterministic.
    std::vector<std::vector<Vec3i>> slab_voxels(static_cast<std::size_t>(num_slabs));
#pragma omp parallel for schedule(dynamic, 1) if (num_slabs > 1)
    for (int64_t slab = 0; slab < num_slabs; ++slab) {
        const int64_t i_first = range.lo[0] + slab * kSlabThickness;
        const int64_t i_last = std::min<int64_t>(i_first + kSlabThickness - 1, range.hi[0]);
        slab_voxels[slab] = slab_surface(sampler, range, i_first, i_last);
    }

    std::size_t total = 0;
    for (const auto& voxels : slab_voxels) total += voxels.size();
    std::vector<Vec3i> result;
    result.reserve(total);
    for (const auto& voxels : slab_voxels) result.insert(result.end(), voxels.begin(), voxels.end());
    return result;
}

ShapeParams random_shape(uint64_t seed, int64_t index) {
    if (index < 0) throw Error("random_shape: index must be >= 0, got " + std::to_string(index));
    PortableRandom random(mix64(seed ^ mix64(static_cast<uint64_t>(index))));
    ShapeParams shape;
    shape.kind = static_cast<ShapeKind>(random.below(4));
    shape.size = random_size(shape.kind, random);
    const double radius = shape_bounding_radius(shape);
    if (radius > kMaxBoundingRadius) {
        const double scale = kMaxBoundingRadius / radius;
        for (double& component : shape.size) component *= scale;
    }
    shape.rotation = random_rotation(random);
    const double placed_radius = shape_bounding_radius(shape);
    for (int a = 0; a < 3; ++a)
        shape.centre[a] = random.uniform(placed_radius + kPlacementMargin, 1.0 - placed_radius - kPlacementMargin);
    return shape;
}

std::vector<std::vector<Vec3i>> synthetic_surface_batch(int64_t batch_size, int32_t resolution, uint64_t seed) {
    if (batch_size < 0)
        throw Error("synthetic_surface_batch: batch_size must be >= 0, got " + std::to_string(batch_size));
    check_resolution("synthetic_surface_batch", resolution);
    std::vector<std::vector<Vec3i>> members(static_cast<std::size_t>(batch_size));
    // Members are independent; whole members per thread keeps each shape's slabs serial (no nesting).
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t member = 0; member < batch_size; ++member)
        members[member] = surface_voxels(random_shape(seed, member), resolution);
    return members;
}

}  // namespace sparsegrid
