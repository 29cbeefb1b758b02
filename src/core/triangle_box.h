// Exact-predicate triangle / axis-aligned box overlap by the separating axis theorem, shared by every
// backend. Closed sets: a triangle touching a box face, edge or corner overlaps it. Degenerate
// triangles (segments, points) are handled: axes that degenerate to zero never separate.
#pragma once

#include "core/keys.h"

namespace sparsegrid::detail {

struct Point3 {
    double x, y, z;
};

SG_HD double component(const Point3& p, int axis) { return axis == 0 ? p.x : (axis == 1 ? p.y : p.z); }
SG_HD Point3 sub(const Point3& a, const Point3& b) { return {a.x - b.x, a.y - b.y, a.z - b.z}; }
SG_HD Point3 cross(const Point3& a, const Point3& b) {
    return {a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x};
}
SG_HD double dot(const Point3& a, const Point3& b) { return a.x * b.x + a.y * b.y + a.z * b.z; }
SG_HD double abs_of(double v) { return v < 0 ? -v : v; }
SG_HD double min3(double a, double b, double c) { return a < b ? (a < c ? a : c) : (b < c ? b : c); }
SG_HD double max3(double a, double b, double c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

/// Does the triangle (a, b, c), given relative to the box centre, overlap the box [-h, h] (per axis)?
SG_HD bool triangle_overlaps_box(const Point3& a, const Point3& b, const Point3& c, const Point3& h) {
    // Box face normals: the triangle's extent along each axis against the box's.
    if (min3(a.x, b.x, c.x) > h.x || max3(a.x, b.x, c.x) < -h.x) return false;
    if (min3(a.y, b.y, c.y) > h.y || max3(a.y, b.y, c.y) < -h.y) return false;
    if (min3(a.z, b.z, c.z) > h.z || max3(a.z, b.z, c.z) < -h.z) return false;
    // Cross products of the triangle's edges with the box axes.
    const Point3 edges[3] = {sub(b, a), sub(c, b), sub(a, c)};
    const Point3 axes[3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
    for (const Point3& e : edges)
        for (const Point3& u : axes) {
            const Point3 axis = cross(e, u);
            const double pa = dot(a, axis), pb = dot(b, axis), pc = dot(c, axis);
            const double radius = h.x * abs_of(axis.x) + h.y * abs_of(axis.y) + h.z * abs_of(axis.z);
            if (min3(pa, pb, pc) > radius || max3(pa, pb, pc) < -radius) return false;
        }
    // The triangle's plane.
    const Point3 normal = cross(edges[0], edges[1]);
    const double distance = dot(normal, a);
    const double radius = h.x * abs_of(normal.x) + h.y * abs_of(normal.y) + h.z * abs_of(normal.z);
    return !(distance > radius || distance < -radius);
}

}  // namespace sparsegrid::detail
