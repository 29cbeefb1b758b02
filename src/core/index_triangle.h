// Mesh voxelisation logic shared by every backend (GridBatch::from_mesh): a triangle in the continuous
// index coordinates of its member, the voxels its bounding box meets (the candidates tested with
// triangle_overlaps_box), the candidate count, and the wording of every from_mesh error. Both backends
// evaluate the same expressions in the same order, so they compute the same doubles and accept the same
// voxels (triangle_box.h explains why nothing is contracted into an FMA).
#pragma once

#include "core/errors.h"
#include "core/triangle_box.h"

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>

namespace sparsegrid::detail {

struct IndexTriangle {
    Point3 corner[3];      ///< (xyz - origin) / voxel_size, per axis
    int32_t lo[3], hi[3];  ///< voxels whose closed cubes meet the triangle's bounding box, per axis
};

/// The first problem index_triangle finds with a face, in the order it checks them.
struct TriangleProblem {
    enum Kind : int32_t { kNone = 0, kNotFinite = 1, kOutsideInt32 = 2 };
    int32_t kind;
    int32_t which;  ///< kNotFinite: the face corner (0..2); kOutsideInt32: the axis
};

SG_HD bool is_finite(double v) { return abs_of(v) <= DBL_MAX; }  // false for NaN and infinities

/// The face (p0, p1, p2) (world points) in index coordinates of a member with voxel size `voxel_size`
/// and origin `origin` (3 values each), with its candidate voxel range, checked: every corner finite,
/// then (axis by axis) the range within int32. On a problem the range is left empty.
SG_HD TriangleProblem index_triangle(const double* p0, const double* p1, const double* p2, const double* voxel_size,
                                     const double* origin, IndexTriangle& tri) {
    for (int a = 0; a < 3; ++a) {  // an empty range until every check has passed
        tri.lo[a] = 0;
        tri.hi[a] = -1;
    }
    const double* p[3] = {p0, p1, p2};
    for (int v = 0; v < 3; ++v)
        tri.corner[v] = {(p[v][0] - origin[0]) / voxel_size[0], (p[v][1] - origin[1]) / voxel_size[1],
                         (p[v][2] - origin[2]) / voxel_size[2]};
    for (int v = 0; v < 3; ++v)
        for (int a = 0; a < 3; ++a)
            if (!is_finite(component(tri.corner[v], a))) return {TriangleProblem::kNotFinite, v};
    for (int a = 0; a < 3; ++a) {
        const double c0 = component(tri.corner[0], a), c1 = component(tri.corner[1], a),
                     c2 = component(tri.corner[2], a);
        // Voxel n's cube is [n - 1/2, n + 1/2]; within int32 range c +- 1/2 is exact.
        const double lo = ::ceil(min3(c0, c1, c2) - 0.5), hi = ::floor(max3(c0, c1, c2) + 0.5);
        if (!(lo >= static_cast<double>(INT32_MIN) && hi <= static_cast<double>(INT32_MAX)))
            return {TriangleProblem::kOutsideInt32, a};
        tri.lo[a] = static_cast<int32_t>(lo);
        tri.hi[a] = static_cast<int32_t>(hi);
    }
    return {TriangleProblem::kNone, 0};
}

/// a + b for counts a, b >= 0, saturating at INT64_MAX.
SG_HD int64_t saturating_add(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }

/// Voxels of the triangle's range (each axis holds at most 2^32), saturating at INT64_MAX.
SG_HD int64_t candidate_count(const IndexTriangle& tri) {
    uint64_t count = 1;
    for (int a = 0; a < 3; ++a) {
        const uint64_t extent = static_cast<uint64_t>(int64_t{tri.hi[a]} - tri.lo[a] + 1);
        if (count > static_cast<uint64_t>(INT64_MAX) / extent) return INT64_MAX;
        count *= extent;
    }
    return static_cast<int64_t>(count);
}

/// Candidate `local` (0 <= local < candidate_count(tri)) of the triangle's range, i-major.
SG_HD void candidate_voxel(const IndexTriangle& tri, uint64_t local, int32_t ijk[3]) {
    const uint64_t extent1 = static_cast<uint64_t>(int64_t{tri.hi[1]} - tri.lo[1] + 1);
    const uint64_t extent2 = static_cast<uint64_t>(int64_t{tri.hi[2]} - tri.lo[2] + 1);
    const uint64_t row = local / extent2;
    ijk[2] = static_cast<int32_t>(tri.lo[2] + static_cast<int64_t>(local - row * extent2));
    ijk[1] = static_cast<int32_t>(tri.lo[1] + static_cast<int64_t>(row % extent1));
    ijk[0] = static_cast<int32_t>(tri.lo[0] + static_cast<int64_t>(row / extent1));
}

/// Does the triangle meet the closed cube of voxel ijk?
SG_HD bool triangle_meets_voxel(const IndexTriangle& tri, const int32_t ijk[3]) {
    const Point3 centre{static_cast<double>(ijk[0]), static_cast<double>(ijk[1]), static_cast<double>(ijk[2])};
    const Point3 half{0.5, 0.5, 0.5};
    return triangle_overlaps_box(sub(tri.corner[0], centre), sub(tri.corner[1], centre), sub(tri.corner[2], centre),
                                 half);
}

// ---- errors, worded once (host only) -------------------------------------------------------------------
// Precedence on every backend: vertex indices of all faces first, then per face the values
// (index_triangle's order), the smallest face first; then the candidate count.

/// The first of a face's three vertex indices outside [0, member_vertices), or -1 when all are valid.
SG_HD int32_t first_bad_vertex(const int32_t* vertices, int64_t member_vertices) {
    for (int32_t v = 0; v < 3; ++v)
        if (vertices[v] < 0 || vertices[v] >= member_vertices) return v;
    return -1;
}

/// `face` counts within `member`; `vertices` points at the face's three vertex indices, one invalid.
[[noreturn]] inline void throw_mesh_vertex_index(int64_t member, int64_t face, const int32_t* vertices,
                                                 int64_t member_vertices) {
    const int32_t bad = first_bad_vertex(vertices, member_vertices);
    throw_error("face ", face, " of member ", member, " refers to vertex ", vertices[bad < 0 ? 0 : bad], "; member ",
                member, " has ", member_vertices, " vertices (indices are member-local)");
}

[[noreturn]] inline void throw_mesh_triangle(int64_t member, int64_t face, const int32_t* vertices,
                                             const TriangleProblem& problem) {
    if (problem.kind == TriangleProblem::kNotFinite)
        throw_error("face ", face, " of member ", member, " has vertex ", vertices[problem.which],
                    " whose coordinates are not finite (after the member's transform)");
    throw_error("face ", face, " of member ", member, " reaches voxel indices outside int32 on axis ", problem.which);
}

[[noreturn]] inline void throw_mesh_candidate_overflow() {
    throw_error(
        "the candidate voxels (those of every triangle's bounding box) must number "
        "less than 2^63 - 1 (int64), got more; use larger voxels or smaller triangles");
}

}  // namespace sparsegrid::detail
