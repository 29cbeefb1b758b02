// Exact-predicate triangle / axis-aligned box overlap by the separating axis theorem, shared by every
// backend. Closed sets: a triangle touching a box face, edge or corner overlaps it. Degenerate
// triangles (segments, points) are handled: axes that degenerate to zero never separate.
//
// Every backend must round every step identically (CPU and CUDA results are equal bit for bit), so no
// product may be fused with a sum into an FMA: device code uses the _rn intrinsics, which nvcc never
// fuses (it fuses a * b + c by default), and the CPU sources that evaluate these predicates are compiled
// with -ffp-contract=off (CMakeLists.txt).
#pragma once

#include "core/keys.h"

namespace sparsegrid::detail {

struct Point3 {
    double x, y, z;
};

/// IEEE products, sums and differences, each rounded on its own (never contracted into an FMA).
SG_HD double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}
SG_HD double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}
SG_HD double sub_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}

SG_HD double component(const Point3& p, int axis) { return axis == 0 ? p.x : (axis == 1 ? p.y : p.z); }
SG_HD Point3 sub(const Point3& a, const Point3& b) { return {sub_rn(a.x, b.x), sub_rn(a.y, b.y), sub_rn(a.z, b.z)}; }
SG_HD Point3 cross(const Point3& a, const Point3& b) {
    return {sub_rn(mul_rn(a.y, b.z), mul_rn(a.z, b.y)), sub_rn(mul_rn(a.z, b.x), mul_rn(a.x, b.z)),
            sub_rn(mul_rn(a.x, b.y), mul_rn(a.y, b.x))};
}
SG_HD double dot(const Point3& a, const Point3& b) {
    return add_rn(add_rn(mul_rn(a.x, b.x), mul_rn(a.y, b.y)), mul_rn(a.z, b.z));
}
SG_HD double abs_of(double v) { return v < 0 ? -v : v; }
SG_HD double min3(double a, double b, double c) { return a < b ? (a < c ? a : c) : (b < c ? b : c); }
SG_HD double max3(double a, double b, double c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }
/// h.x |v.x| + h.y |v.y| + h.z |v.z|: the half-width of the box [-h, h] projected onto v.
SG_HD double box_radius(const Point3& h, const Point3& v) { return dot(h, {abs_of(v.x), abs_of(v.y), abs_of(v.z)}); }

/// Does the triangle (a, b, c), given relative to the box centre, overlap the box [-h, h] (per axis)?
SG_HD bool triangle_overlaps_box(const Point3& a, const Point3& b, const Point3& c, const Point3& h) {
    // Box face normals: the triangle's extent along each axis against the box's.
    if (min3(a.x, b.x, c.x) > h.x || max3(a.x, b.x, c.x) < -h.x) return false;
    if (min3(a.y, b.y, c.y) > h.y || max3(a.y, b.y, c.y) < -h.y) return false;
    if (min3(a.z, b.z, c.z) > h.z || max3(a.z, b.z, c.z) < -h.z) return false;
    // Cross products of the triangle's edges with the box axes.
    const Point3 edges[3] = {sub(b, a), sub(c, b), sub(a, c)};
    const Point3 axes[3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
    // Unrolled on the device, so that edges[] and axes[] live in registers, not in local memory.
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (const Point3& e : edges)
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
        for (const Point3& u : axes) {
            const Point3 axis = cross(e, u);
            const double pa = dot(a, axis), pb = dot(b, axis), pc = dot(c, axis);
            const double radius = box_radius(h, axis);
            if (min3(pa, pb, pc) > radius || max3(pa, pb, pc) < -radius) return false;
        }
    // The triangle's plane.
    const Point3 normal = cross(edges[0], edges[1]);
    const double distance = dot(normal, a);
    const double radius = box_radius(h, normal);
    return !(distance > radius || distance < -radius);
}

}  // namespace sparsegrid::detail
