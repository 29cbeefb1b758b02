// Mesh voxelisation against a brute-force oracle that clips each triangle against each voxel cube
// (Sutherland-Hodgman in long double): a voxel is certainly hit when the triangle meets the cube shrunk
// by 1e-9, possibly hit when it meets the cube grown by 1e-9; from_mesh must return every certain voxel
// and only possible ones. Touching cases with exact answers are checked separately.
#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

namespace sparsegrid_test {
namespace {

using Point = std::array<long double, 3>;
using Triangle = std::array<Point, 3>;

/// Does the triangle meet the box [lo, hi] (closed)? Clips the polygon against the six planes.
bool clip_intersects(const Triangle& tri, const Point& lo, const Point& hi) {
    std::vector<Point> polygon(tri.begin(), tri.end());
    for (int axis = 0; axis < 3; ++axis)
        for (int side = 0; side < 2; ++side) {
            // Keep the half-space: side 0: p[axis] >= lo[axis]; side 1: p[axis] <= hi[axis].
            auto inside = [&](const Point& p) { return side == 0 ? p[axis] >= lo[axis] : p[axis] <= hi[axis]; };
            auto distance = [&](const Point& p) { return side == 0 ? p[axis] - lo[axis] : hi[axis] - p[axis]; };
            std::vector<Point> next;
            for (size_t i = 0; i < polygon.size(); ++i) {
                const Point& a = polygon[i];
                const Point& b = polygon[(i + 1) % polygon.size()];
                if (inside(a)) next.push_back(a);
                if (inside(a) != inside(b)) {
                    const long double t = distance(a) / (distance(a) - distance(b));
                    Point p;
                    for (int d = 0; d < 3; ++d) p[d] = a[d] + t * (b[d] - a[d]);
                    p[axis] = side == 0 ? lo[axis] : hi[axis];
                    next.push_back(p);
                }
            }
            polygon = std::move(next);
            if (polygon.empty()) return false;
        }
    return true;
}

struct Mesh {
    std::vector<std::vector<Vec3d>> vertices;           // per member
    std::vector<std::vector<std::array<int32_t, 3>>> faces;  // per member, local indices
    std::vector<MemberTransform> transforms;
};

GridBatch voxelize(const Mesh& mesh) {
    std::vector<double> vertices;
    std::vector<int32_t> faces;
    std::vector<int64_t> vertex_offsets{0}, face_offsets{0};
    for (size_t m = 0; m < mesh.vertices.size(); ++m) {
        for (const Vec3d& v : mesh.vertices[m]) vertices.insert(vertices.end(), v.begin(), v.end());
        for (const auto& f : mesh.faces[m]) faces.insert(faces.end(), f.begin(), f.end());
        vertex_offsets.push_back(static_cast<int64_t>(vertices.size() / 3));
        face_offsets.push_back(static_cast<int64_t>(faces.size() / 3));
    }
    return GridBatch::from_mesh(vertices, vertex_offsets, faces, face_offsets, mesh.transforms);
}

/// Checks every voxel near member m's triangles against the oracle band.
::testing::AssertionResult matches_oracle(const GridBatch& grid, const Mesh& mesh) {
    const MemberLists result = member_lists(grid);
    for (size_t m = 0; m < mesh.vertices.size(); ++m) {
        const std::set<Vec3i> hit(result[m].begin(), result[m].end());
        std::set<Vec3i> possible;
        const MemberTransform& t = mesh.transforms[m];
        for (const auto& face : mesh.faces[m]) {
            Triangle tri;
            for (int v = 0; v < 3; ++v)
                for (int a = 0; a < 3; ++a)
                    tri[v][a] = (static_cast<long double>(mesh.vertices[m][face[v]][a]) - t.origin[a]) / t.voxel_size[a];
            int64_t lo[3], hi[3];
            for (int a = 0; a < 3; ++a) {
                const long double mn = std::min({tri[0][a], tri[1][a], tri[2][a]});
                const long double mx = std::max({tri[0][a], tri[1][a], tri[2][a]});
                lo[a] = static_cast<int64_t>(std::floor(mn)) - 1;
                hi[a] = static_cast<int64_t>(std::ceil(mx)) + 1;
            }
            for (int64_t i = lo[0]; i <= hi[0]; ++i)
                for (int64_t j = lo[1]; j <= hi[1]; ++j)
                    for (int64_t k = lo[2]; k <= hi[2]; ++k) {
                        const Vec3i voxel{static_cast<int32_t>(i), static_cast<int32_t>(j), static_cast<int32_t>(k)};
                        const long double e = 1e-9L;
                        const Point c{static_cast<long double>(i), static_cast<long double>(j),
                                      static_cast<long double>(k)};
                        const bool certain = clip_intersects(tri, {c[0] - 0.5L + e, c[1] - 0.5L + e, c[2] - 0.5L + e},
                                                             {c[0] + 0.5L - e, c[1] + 0.5L - e, c[2] + 0.5L - e});
                        const bool maybe = clip_intersects(tri, {c[0] - 0.5L - e, c[1] - 0.5L - e, c[2] - 0.5L - e},
                                                           {c[0] + 0.5L + e, c[1] + 0.5L + e, c[2] + 0.5L + e});
                        if (certain && !hit.count(voxel))
                            return ::testing::AssertionFailure() << "member " << m << ": voxel " << str(voxel)
                                                                 << " meets a triangle but is missing";
                        if (maybe) possible.insert(voxel);
                    }
        }
        for (const Vec3i& v : hit)
            if (!possible.count(v))
                return ::testing::AssertionFailure() << "member " << m << ": voxel " << str(v)
                                                     << " is active but meets no triangle";
    }
    return ::testing::AssertionSuccess();
}

Vec3d random_point(Rng& rng, double lo, double hi) {
    return {uniform_real(rng, lo, hi), uniform_real(rng, lo, hi), uniform_real(rng, lo, hi)};
}

TEST(Mesh, RandomTrianglesMatchClippingOracle) {
    for (uint64_t seed : test_seeds()) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        Rng rng(seed + 11000);
        Mesh mesh;
        const int64_t members = 1 + static_cast<int64_t>(seed % 4);
        for (int64_t m = 0; m < members; ++m) {
            MemberTransform t;
            for (int a = 0; a < 3; ++a) {
                t.voxel_size[a] = uniform_real(rng, 0.3, 2.0);
                t.origin[a] = uniform_real(rng, -5.0, 5.0);
            }
            mesh.transforms.push_back(t);
            mesh.vertices.emplace_back();
            mesh.faces.emplace_back();
            if (m == 1) continue;  // an empty member
            for (int f = 0; f < 12; ++f) {
                const int32_t base = static_cast<int32_t>(mesh.vertices[m].size());
                const double reach = f < 4 ? 15.0 : 3.0;  // a few large triangles
                const Vec3d anchor = random_point(rng, -10.0, 10.0);
                for (int v = 0; v < 3; ++v) {
                    Vec3d p = random_point(rng, -reach, reach);
                    for (int a = 0; a < 3; ++a) p[a] += anchor[a];
                    mesh.vertices[m].push_back(p);
                }
                if (f == 9) mesh.vertices[m][base + 2] = mesh.vertices[m][base + 1];  // a segment
                if (f == 10) mesh.vertices[m][base + 1] = mesh.vertices[m][base + 2] = mesh.vertices[m][base];  // a point
                if (f == 11)  // a sliver: the third vertex almost on the first edge
                    for (int a = 0; a < 3; ++a)
                        mesh.vertices[m][base + 2][a] = 0.5 * (mesh.vertices[m][base][a] + mesh.vertices[m][base + 1][a]) + 1e-7;
                mesh.faces[m].push_back({base, base + 1, base + 2});
            }
        }
        const GridBatch grid = voxelize(mesh);
        EXPECT_TRUE(grid_is_well_formed(grid, sparsegrid::Device::cpu()));
        EXPECT_TRUE(matches_oracle(grid, mesh));
        EXPECT_EQ(grid.num_voxels(1 % members), members > 1 ? 0 : grid.num_voxels(0));
    }
}

Mesh unit_mesh(std::vector<Vec3d> vertices) {
    Mesh mesh;
    mesh.vertices.push_back(std::move(vertices));
    mesh.faces.push_back({{0, 1, 2}});
    mesh.transforms.push_back(MemberTransform{});
    return mesh;
}

TEST(Mesh, TouchingCasesAreClosed) {
    // A triangle in the plane x = 0.5 (between voxels i = 0 and 1) inside one y/z cell: both voxels.
    GridBatch grid = voxelize(unit_mesh({{0.5, -0.25, -0.25}, {0.5, 0.25, -0.25}, {0.5, 0.0, 0.25}}));
    EXPECT_EQ(grid.ijk_host(), (std::vector<Vec3i>{{0, 0, 0}, {1, 0, 0}}));
    // A point triangle on the corner shared by eight voxels: all eight.
    grid = voxelize(unit_mesh({{0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}}));
    EXPECT_EQ(grid.num_voxels(), 8);
    // A segment along an edge shared by four voxels (x from 0 to 0.25 at y = z = 0.5).
    grid = voxelize(unit_mesh({{0.0, 0.5, 0.5}, {0.25, 0.5, 0.5}, {0.25, 0.5, 0.5}}));
    EXPECT_EQ(grid.num_voxels(), 4);
}

TEST(Mesh, ThinFeaturesAreNeverMissed) {
    // A needle-thin triangle crossing 20 voxels along i: every crossed voxel is active.
    const GridBatch grid = voxelize(unit_mesh({{-0.3, 0.1, 0.1}, {19.3, 0.1, 0.1}, {19.3, 0.1 + 1e-9, 0.1}}));
    std::vector<Vec3i> expected;
    for (int32_t i = 0; i < 20; ++i) expected.push_back({i, 0, 0});
    const std::vector<Vec3i> actual = grid.ijk_host();
    EXPECT_EQ(std::set<Vec3i>(actual.begin(), actual.end()), std::set<Vec3i>(expected.begin(), expected.end()));
}

TEST(Mesh, BadInputsRaise) {
    const std::vector<double> vertices{0, 0, 0, 1, 0, 0, 0, 1, 0};
    const std::vector<int32_t> faces{0, 1, 3};
    const std::vector<MemberTransform> one(1);
    const std::vector<int32_t> triangle{0, 1, 2};
    EXPECT_TRUE(throws_error([&] { GridBatch::from_mesh(vertices, {0, 3}, faces, {0, 1}, one); },
                             "GridBatch::from_mesh", {"refers to vertex 3"}));
    EXPECT_TRUE(throws_error([&] { GridBatch::from_mesh(vertices, {0, 3}, faces, {0, 1}, {}); },
                             "GridBatch::from_mesh", {"transforms"}));
    EXPECT_TRUE(throws_error([&] { GridBatch::from_mesh(vertices, {0, 3}, triangle, {0, 0, 1}, one); },
                             "GridBatch::from_mesh", {"same number of members"}));
    const std::vector<double> nan_vertices{0, 0, 0, std::nan(""), 0, 0, 0, 1, 0};
    EXPECT_TRUE(throws_error([&] { GridBatch::from_mesh(nan_vertices, {0, 3}, triangle, {0, 1}, one); },
                             "GridBatch::from_mesh", {"not finite"}));
    const std::vector<double> far{0, 0, 0, 3e9, 0, 0, 0, 1, 0};
    EXPECT_TRUE(throws_error([&] { GridBatch::from_mesh(far, {0, 3}, triangle, {0, 1}, one); },
                             "GridBatch::from_mesh", {"int32"}));
}

}  // namespace
}  // namespace sparsegrid_test
