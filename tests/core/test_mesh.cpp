// Mesh voxelisation against a brute-force oracle that clips each triangle against each voxel cube
// (Sutherland-Hodgman in long double): a voxel is certainly hit when the triangle meets the cube shrunk
// by 1e-9, possibly hit when it meets the cube grown by 1e-9; from_mesh must return every certain voxel
// and only possible ones. Touching cases with exact answers are checked separately. These run on every
// backend present. The CPU/CUDA parity tests (a CUDA device needed, skipped without) compare the two
// backends bit for bit on random meshes (degenerate, huge and many tiny triangles, negative and far
// coordinates, empty members, the bundled bunny) and compare their error messages.
#include "test_util.h"

#include <sparsegrid/mesh_io.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>
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
    std::vector<std::vector<Vec3d>> vertices;                // per member
    std::vector<std::vector<std::array<int32_t, 3>>> faces;  // per member, local indices
    std::vector<MemberTransform> transforms;
};

/// The mesh flattened the way from_mesh takes it.
struct FlatMesh {
    std::vector<double> vertices;
    std::vector<int32_t> faces;
    std::vector<int64_t> vertex_offsets{0}, face_offsets{0};
};

FlatMesh flatten_mesh(const Mesh& mesh) {
    FlatMesh flat;
    for (size_t m = 0; m < mesh.vertices.size(); ++m) {
        for (const Vec3d& v : mesh.vertices[m]) flat.vertices.insert(flat.vertices.end(), v.begin(), v.end());
        for (const auto& f : mesh.faces[m]) flat.faces.insert(flat.faces.end(), f.begin(), f.end());
        flat.vertex_offsets.push_back(static_cast<int64_t>(flat.vertices.size() / 3));
        flat.face_offsets.push_back(static_cast<int64_t>(flat.faces.size() / 3));
    }
    return flat;
}

/// from_mesh in `ctx`, the vertices and faces uploaded to its device first.
GridBatch voxelize(const Mesh& mesh, const sparsegrid::Context& ctx = cpu_context()) {
    const FlatMesh flat = flatten_mesh(mesh);
    return GridBatch::from_mesh(to_device(flat.vertices, ctx), flat.vertex_offsets, to_device(flat.faces, ctx),
                                flat.face_offsets, mesh.transforms, ctx);
}

/// The message of the sparsegrid::Error `fn` raises, or nothing when it returns.
std::optional<std::string> error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const sparsegrid::Error& e) {
        return std::string(e.what());
    }
    return std::nullopt;
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
                    tri[v][a] = (static_cast<long double>(mesh.vertices[m][face[v]][a]) - t.origin[a]) /
                        t.voxel_size[a];
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
                            return ::testing::AssertionFailure()
                                << "member " << m << ": voxel " << str(voxel) << " meets a triangle but is missing";
                        if (maybe) possible.insert(voxel);
                    }
        }
        for (const Vec3i& v : hit)
            if (!possible.count(v))
                return ::testing::AssertionFailure()
                    << "member " << m << ": voxel " << str(v) << " is active but meets no triangle";
    }
    return ::testing::AssertionSuccess();
}

Vec3d random_point(Rng& rng, double lo, double hi) {
    return {uniform_real(rng, lo, hi), uniform_real(rng, lo, hi), uniform_real(rng, lo, hi)};
}

class MeshTest : public BackendTest {
protected:
    GridBatch voxelize_here(const Mesh& mesh) const { return voxelize(mesh, ctx()); }
};

INSTANTIATE_TEST_SUITE_P(, MeshTest, ::testing::ValuesIn(available_backends()), backend_name);

TEST_P(MeshTest, RandomTrianglesMatchClippingOracle) {
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
                if (f == 10)
                    mesh.vertices[m][base + 1] = mesh.vertices[m][base + 2] = mesh.vertices[m][base];  // a point
                if (f == 11)  // a sliver: the third vertex almost on the first edge
                    for (int a = 0; a < 3; ++a)
                        mesh.vertices[m][base + 2][a] =
                            0.5 * (mesh.vertices[m][base][a] + mesh.vertices[m][base + 1][a]) + 1e-7;
                mesh.faces[m].push_back({base, base + 1, base + 2});
            }
        }
        const GridBatch grid = voxelize_here(mesh);
        EXPECT_TRUE(grid_is_well_formed(grid, device()));
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

TEST_P(MeshTest, TouchingCasesAreClosed) {
    // A triangle in the plane x = 0.5 (between voxels i = 0 and 1) inside one y/z cell: both voxels.
    GridBatch grid = voxelize_here(unit_mesh({{0.5, -0.25, -0.25}, {0.5, 0.25, -0.25}, {0.5, 0.0, 0.25}}));
    EXPECT_EQ(grid.ijk_host(), (std::vector<Vec3i>{{0, 0, 0}, {1, 0, 0}}));
    // A point triangle on the corner shared by eight voxels: all eight.
    grid = voxelize_here(unit_mesh({{0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}}));
    EXPECT_EQ(grid.num_voxels(), 8);
    // A segment along an edge shared by four voxels (x from 0 to 0.25 at y = z = 0.5).
    grid = voxelize_here(unit_mesh({{0.0, 0.5, 0.5}, {0.25, 0.5, 0.5}, {0.25, 0.5, 0.5}}));
    EXPECT_EQ(grid.num_voxels(), 4);
    EXPECT_TRUE(grid_is_well_formed(grid, device()));
}

TEST_P(MeshTest, ThinFeaturesAreNeverMissed) {
    // A needle-thin triangle crossing 20 voxels along i: every crossed voxel is active.
    const GridBatch grid = voxelize_here(unit_mesh({{-0.3, 0.1, 0.1}, {19.3, 0.1, 0.1}, {19.3, 0.1 + 1e-9, 0.1}}));
    std::vector<Vec3i> expected;
    for (int32_t i = 0; i < 20; ++i) expected.push_back({i, 0, 0});
    const std::vector<Vec3i> actual = grid.ijk_host();
    EXPECT_EQ(std::set<Vec3i>(actual.begin(), actual.end()), std::set<Vec3i>(expected.begin(), expected.end()));
}

TEST_P(MeshTest, BatchesWithoutFacesAreEmpty) {
    Mesh mesh;
    for (int m = 0; m < 3; ++m) {
        mesh.vertices.push_back(m == 1 ? std::vector<Vec3d>{{0, 0, 0}} : std::vector<Vec3d>{});
        mesh.faces.emplace_back();
        mesh.transforms.push_back(MemberTransform{});
    }
    const GridBatch grid = voxelize_here(mesh);
    EXPECT_EQ(grid.batch_size(), 3);
    EXPECT_EQ(grid.num_voxels(), 0);
    EXPECT_TRUE(grid.coordinate_box().empty());
    EXPECT_TRUE(grid_is_well_formed(grid, device()));
}

TEST_P(MeshTest, BadInputsRaise) {
    const std::vector<double> vertices{0, 0, 0, 1, 0, 0, 0, 1, 0};
    const std::vector<int32_t> faces{0, 1, 3};
    const std::vector<MemberTransform> one(1);
    const std::vector<int32_t> triangle{0, 1, 2};
    const auto from_mesh = [&](const std::vector<double>& v, const std::vector<int64_t>& vertex_offsets,
                               const std::vector<int32_t>& f, const std::vector<int64_t>& face_offsets,
                               const std::vector<MemberTransform>& transforms) {
        return
            [=] { GridBatch::from_mesh(on_device(v), vertex_offsets, on_device(f), face_offsets, transforms, ctx()); };
    };
    EXPECT_TRUE(throws_error(from_mesh(vertices, {0, 3}, faces, {0, 1}, one), "GridBatch::from_mesh",
                             {"face 0 of member 0 refers to vertex 3; member 0 has 3 vertices"}));
    EXPECT_TRUE(throws_error(from_mesh(vertices, {0, 3}, {0, -1, 1}, {0, 1}, one), "GridBatch::from_mesh",
                             {"refers to vertex -1"}));
    EXPECT_TRUE(throws_error(from_mesh(vertices, {0, 3}, faces, {0, 1}, {}), "GridBatch::from_mesh", {"transforms"}));
    EXPECT_TRUE(throws_error(from_mesh(vertices, {0, 3}, triangle, {0, 0, 1}, one), "GridBatch::from_mesh",
                             {"same number of members"}));
    const std::vector<double> nan_vertices{0, 0, 0, std::nan(""), 0, 0, 0, 1, 0};
    EXPECT_TRUE(throws_error(from_mesh(nan_vertices, {0, 3}, triangle, {0, 1}, one), "GridBatch::from_mesh",
                             {"face 0 of member 0 has vertex 1 whose coordinates are not finite"}));
    const std::vector<double> infinite{0, 0, 0, 1, 0, 0, 0, -std::numeric_limits<double>::infinity(), 0};
    EXPECT_TRUE(throws_error(from_mesh(infinite, {0, 3}, triangle, {0, 1}, one), "GridBatch::from_mesh",
                             {"has vertex 2 whose coordinates are not finite"}));
    const std::vector<double> far{0, 0, 0, 3e9, 0, 0, 0, 1, 0};
    EXPECT_TRUE(throws_error(from_mesh(far, {0, 3}, triangle, {0, 1}, one), "GridBatch::from_mesh",
                             {"outside int32 on axis 0"}));
    const std::vector<double> far_below{0, 0, 0, 1, 0, 0, 0, 0, -2.2e9};
    EXPECT_TRUE(throws_error(from_mesh(far_below, {0, 3}, triangle, {0, 1}, one), "GridBatch::from_mesh",
                             {"outside int32 on axis 2"}));
}

TEST_P(MeshTest, SmallestBadFaceIsReportedIndicesFirst) {
    // Member 0: a non-finite vertex in face 1; member 1: bad indices in faces 3 and 1 (member-local);
    // member 2: an out-of-range vertex in face 0. Index errors of any face come first.
    Mesh mesh;
    for (int m = 0; m < 3; ++m) {
        mesh.vertices.push_back({{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {0, 0, 1}});
        mesh.faces.push_back({{0, 1, 2}, {1, 2, 3}, {0, 2, 3}, {0, 1, 3}});
        mesh.transforms.push_back(MemberTransform{});
    }
    mesh.vertices[0][3][1] = std::numeric_limits<double>::quiet_NaN();
    mesh.faces[1][3] = {0, 1, 9};
    mesh.faces[1][1] = {4, 1, -2};
    mesh.vertices[2][2] = {0, 1e12, 0};
    EXPECT_TRUE(throws_error([&] { voxelize_here(mesh); }, "GridBatch::from_mesh",
                             {"face 1 of member 1 refers to vertex 4; member 1 has 4 vertices"}));
    mesh.faces[1][1] = {1, 2, 3};
    mesh.faces[1][3] = {0, 1, 3};
    EXPECT_TRUE(throws_error([&] { voxelize_here(mesh); }, "GridBatch::from_mesh",
                             {"face 1 of member 0 has vertex 3 whose coordinates are not finite"}));
    mesh.vertices[0][3][1] = 0.0;
    EXPECT_TRUE(throws_error([&] { voxelize_here(mesh); }, "GridBatch::from_mesh",
                             {"face 0 of member 2 reaches voxel indices outside int32 on axis 1"}));
}

TEST_P(MeshTest, ErrorsAmongManyFaces) {
    // Enough faces for the CPU's parallel pass (errors are raised after it, never inside it).
    Mesh mesh;
    mesh.transforms.push_back(MemberTransform{{0.5, 0.5, 0.5}, {-3, -3, -3}});
    mesh.vertices.emplace_back();
    mesh.faces.emplace_back();
    Rng rng(31);
    for (int32_t f = 0; f < 40000; ++f) {
        const Vec3d anchor = random_point(rng, -20.0, 20.0);
        for (int v = 0; v < 3; ++v) {
            Vec3d p = random_point(rng, -0.4, 0.4);
            for (int a = 0; a < 3; ++a) p[a] += anchor[a];
            mesh.vertices[0].push_back(p);
        }
        mesh.faces[0].push_back({3 * f, 3 * f + 1, 3 * f + 2});
    }
    const GridBatch grid = voxelize_here(mesh);
    EXPECT_GT(grid.num_voxels(), 10000);
    EXPECT_TRUE(grid_is_well_formed(grid, device()));
    mesh.vertices[0][3 * 30001 + 1][2] = std::numeric_limits<double>::infinity();
    mesh.vertices[0][3 * 17002][0] = -std::numeric_limits<double>::infinity();
    EXPECT_TRUE(throws_error([&] { voxelize_here(mesh); }, "GridBatch::from_mesh",
                             {"face 17002 of member 0 has vertex 51006 whose coordinates are not finite"}));
    mesh.faces[0][39999][1] = 120000;
    EXPECT_TRUE(throws_error([&] { voxelize_here(mesh); }, "GridBatch::from_mesh",
                             {"face 39999 of member 0 refers to vertex 120000"}));
}

TEST_P(MeshTest, CandidateCountBeyondInt64Raises) {
    // One face whose range holds ~8e27 voxels, then three faces of ~3.4e18 each (their sum overflows).
    EXPECT_TRUE(throws_error(
        [&] {
            voxelize_here(unit_mesh({{-1e9, -1e9, -1e9}, {1e9, 1e9, 1e9}, {1e9, -1e9, 0}}));
        },
        "GridBatch::from_mesh", {"candidate voxels"}));
    Mesh mesh = unit_mesh({{0, 0, 0}, {1.5e6, 1.5e6, 0}, {1.5e6, 0, 1.5e6}});
    mesh.faces[0] = {{0, 1, 2}, {0, 2, 1}, {1, 2, 0}};
    EXPECT_TRUE(throws_error([&] { voxelize_here(mesh); }, "GridBatch::from_mesh", {"candidate voxels"}));
}

TEST(MeshWithoutCudaBackend, CudaRequestsRaise) {
    if (sparsegrid::cuda_backend_available()) GTEST_SKIP() << "built with CUDA";
    sparsegrid::Context ctx;
    ctx.device = sparsegrid::Device::cuda();
    const std::vector<double> vertices{0, 0, 0, 1, 0, 0, 0, 1, 0};  // never read: the request fails first
    const std::vector<int32_t> faces{0, 1, 2};
    EXPECT_TRUE(throws_error(
        [&] {
            GridBatch::from_mesh(vertices, {0, 3}, faces, {0, 1}, {MemberTransform{}}, ctx);
        },
        "GridBatch::from_mesh", {"no CUDA backend"}));
}

// ---- CPU / CUDA parity ----------------------------------------------------------------------------------

class MeshParity : public ::testing::Test {
protected:
    void SetUp() override {
        if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device: CPU/CUDA parity needs one";
    }
};

/// Offsets (host and device copies), ijk, box and transforms of the two grids are identical.
::testing::AssertionResult same_grid(const GridBatch& cpu, const GridBatch& cuda) {
    if (!cpu.device().is_cpu() || !cuda.device().is_cuda())
        return ::testing::AssertionFailure() << "grids on " << cpu.device().str() << " and " << cuda.device().str();
    if (cpu.voxel_offsets() != cuda.voxel_offsets())
        return ::testing::AssertionFailure()
            << "voxel_offsets() differ: CUDA " << cuda.num_voxels() << " voxels, CPU " << cpu.num_voxels();
    if (cuda.voxel_offsets_buffer().to_host() != cpu.voxel_offsets())
        return ::testing::AssertionFailure() << "CUDA voxel_offsets_buffer() differs from voxel_offsets()";
    const std::vector<int32_t> cpu_ijk = cpu.ijk().to_host(), cuda_ijk = cuda.ijk().to_host();
    if (cpu_ijk != cuda_ijk) {
        const auto at = std::mismatch(cpu_ijk.begin(), cpu_ijk.end(), cuda_ijk.begin()).first - cpu_ijk.begin();
        return ::testing::AssertionFailure() << "ijk() differs first at voxel " << at / 3 << " of " << cpu.num_voxels();
    }
    const sparsegrid::CoordBox &a = cpu.coordinate_box(), &b = cuda.coordinate_box();
    if (a.lo != b.lo || a.hi != b.hi)
        return ::testing::AssertionFailure() << "coordinate_box(): CUDA " << str(b.lo) << ".." << str(b.hi) << ", CPU "
                                             << str(a.lo) << ".." << str(a.hi);
    if (cpu.transforms().size() != cuda.transforms().size() ||
        (!cpu.transforms().empty() &&
         std::memcmp(cpu.transforms().data(), cuda.transforms().data(),
                     cpu.transforms().size() * sizeof(MemberTransform)) != 0))
        return ::testing::AssertionFailure() << "transforms() differ";
    return ::testing::AssertionSuccess() << cpu.num_voxels() << " voxels";
}

/// from_mesh on both backends: the same grid, or the same error message.
void expect_same_voxelisation(const std::string& what, const Mesh& mesh) {
    SCOPED_TRACE(what);
    std::optional<GridBatch> cpu, cuda;
    const std::optional<std::string> cpu_error = error_of([&] { cpu = voxelize(mesh, cpu_context()); });
    const std::optional<std::string> cuda_error = error_of([&] { cuda = voxelize(mesh, cuda_context()); });
    EXPECT_EQ(cpu_error.value_or("(no error)"), cuda_error.value_or("(no error)"));
    if (cpu && cuda) {
        EXPECT_TRUE(grid_is_well_formed(*cuda, sparsegrid::Device::cuda(0)));
        const ::testing::AssertionResult same = same_grid(*cpu, *cuda);
        EXPECT_TRUE(same);
        std::cout << "[   NOTE   ] " << what << ": " << same.message() << std::endl;
    }
}

/// A point of index space (i, j, k as doubles) in member m's world frame.
Vec3d to_world(const MemberTransform& t, const Vec3d& index) {
    return {t.origin[0] + t.voxel_size[0] * index[0], t.origin[1] + t.voxel_size[1] * index[1],
            t.origin[2] + t.voxel_size[2] * index[2]};
}

/// Random meshes that exercise every path: per member its own transform; shared vertices with random
/// (possibly repeated) indices; tiny, medium and one huge diagonal triangle; segments, points,
/// collinear and sliver triangles; vertices on voxel faces and corners (exact ties); negative
/// coordinates; empty members; optionally one member near +-2^30 (128-bit keys).
Mesh random_parity_mesh(Rng& rng, int64_t members, bool far_member) {
    Mesh mesh;
    for (int64_t m = 0; m < members; ++m) {
        MemberTransform t;
        for (int a = 0; a < 3; ++a) {
            t.voxel_size[a] = uniform_real(rng, 0.05, 2.0);
            t.origin[a] = uniform_real(rng, -50.0, 50.0);
        }
        if (m % 3 == 2) t = MemberTransform{};  // unit voxels: index = world, ties stay exact
        mesh.transforms.push_back(t);
        std::vector<Vec3d> index_points;  // in index space, converted below
        std::vector<std::array<int32_t, 3>> faces;
        if (m == 1) {  // an empty member (vertices but no faces)
            mesh.vertices.push_back({to_world(t, {1, 2, 3})});
            mesh.faces.emplace_back();
            continue;
        }
        const Vec3d centre = far_member && m == members - 1
            ? Vec3d{static_cast<double>(kTwoPow30) - 40, -static_cast<double>(kTwoPow30) + 9, 5}
            : random_point(rng, -200.0, 200.0);
        auto add = [&](const Vec3d& a, const Vec3d& b, const Vec3d& c) {
            const int32_t base = static_cast<int32_t>(index_points.size());
            index_points.insert(index_points.end(), {a, b, c});
            faces.push_back({base, base + 1, base + 2});
        };
        auto around = [&](double reach) {
            Vec3d p = random_point(rng, -reach, reach);
            for (int a = 0; a < 3; ++a) p[a] += centre[a];
            return p;
        };
        // Shared vertices, faces with random (possibly repeated) indices.
        const int32_t shared = 60;
        for (int32_t v = 0; v < shared; ++v) index_points.push_back(around(12.0));
        for (int f = 0; f < 150; ++f)
            faces.push_back({static_cast<int32_t>(uniform_int(rng, 0, shared - 1)),
                             static_cast<int32_t>(uniform_int(rng, 0, shared - 1)),
                             static_cast<int32_t>(uniform_int(rng, 0, shared - 1))});
        for (int f = 0; f < 300; ++f) {  // tiny and medium triangles
            const Vec3d anchor = around(30.0);
            const double reach = f % 4 == 0 ? 4.0 : 0.4;
            Vec3d p[3];
            for (auto& q : p) {
                q = random_point(rng, -reach, reach);
                for (int a = 0; a < 3; ++a) q[a] += anchor[a];
            }
            add(p[0], p[1], p[2]);
        }
        // One huge diagonal triangle (a range of ~200 voxels per axis).
        add(around(4.0), {centre[0] + 100, centre[1] + 95, centre[2] - 90},
            {centre[0] - 97, centre[1] + 60, centre[2] + 99});
        // Degenerate triangles.
        const Vec3d a = around(20.0), b = around(20.0);
        add(a, b, b);                                                                       // a segment
        add(a, a, a);                                                                       // a point
        add(a, b, {2 * b[0] - a[0], 2 * b[1] - a[1], 2 * b[2] - a[2]});                     // collinear
        add(a, b, {0.5 * (a[0] + b[0]) + 1e-9, 0.5 * (a[1] + b[1]), 0.5 * (a[2] + b[2])});  // a sliver
        // Vertices on voxel faces, edges and corners (half-integers in index space): exact ties.
        auto half_integer = [&] {
            Vec3d p = around(6.0);
            for (double& c : p) c = std::floor(c) + 0.5;
            return p;
        };
        for (int f = 0; f < 20; ++f) {
            const Vec3d p = half_integer(), q = half_integer();
            add(p, q, f % 2 == 0 ? Vec3d{p[0], q[1], p[2]} : half_integer());
        }
        const Vec3d corner = half_integer();
        add(corner, corner, corner);  // a point on a corner: eight voxels
        add(corner, {corner[0] + 3, corner[1], corner[2]}, {corner[0] + 3, corner[1], corner[2]});  // along an edge
        std::vector<Vec3d> world;
        for (const Vec3d& p : index_points) world.push_back(to_world(t, p));
        mesh.vertices.push_back(std::move(world));
        mesh.faces.push_back(std::move(faces));
    }
    return mesh;
}

TEST_F(MeshParity, RandomMeshesAreIdentical) {
    for (uint64_t seed : {1, 2, 3, 4}) {
        std::cout << "[   SEED   ] random parity mesh: seed " << seed << std::endl;
        Rng rng(seed + 12000);
        const Mesh mesh = random_parity_mesh(rng, 2 + static_cast<int64_t>(seed), seed % 2 == 0);
        expect_same_voxelisation("seed " + std::to_string(seed), mesh);
    }
}

TEST_F(MeshParity, ManyTinyTrianglesAndOneHugeOne) {
    std::cout << "[   SEED   ] many tiny triangles: seed 41" << std::endl;
    Rng rng(41);
    Mesh mesh;
    mesh.transforms = {MemberTransform{{0.01, 0.01, 0.01}, {-0.5, -0.5, -0.5}}, MemberTransform{}};
    mesh.vertices.resize(2);
    mesh.faces.resize(2);
    for (int32_t f = 0; f < 200000; ++f) {  // ~1-3 voxels each, all over [-1, 1]^3
        const Vec3d anchor = random_point(rng, -1.0, 1.0);
        for (int v = 0; v < 3; ++v) {
            Vec3d p = random_point(rng, -0.012, 0.012);
            for (int a = 0; a < 3; ++a) p[a] += anchor[a];
            mesh.vertices[0].push_back(p);
        }
        mesh.faces[0].push_back({3 * f, 3 * f + 1, 3 * f + 2});
    }
    // Member 1: a single triangle whose range spans ~400 x 400 x 400 voxels (64M candidates).
    mesh.vertices[1] = {{-200.3, -180.2, 190.7}, {199.6, -170.1, -201.2}, {10.2, 203.9, 5.5}};
    mesh.faces[1] = {{0, 1, 2}};
    expect_same_voxelisation("200000 tiny triangles + one huge triangle", mesh);
}

TEST_F(MeshParity, BundledBunny) {
    const sparsegrid::TriangleMesh bunny = sparsegrid::load_mesh(std::string(SPARSEGRID_SOURCE_DIR) +
                                                                 "/data/bunny.ply");
    Vec3d lo = bunny.vertices.front(), hi = lo;
    for (const Vec3d& v : bunny.vertices)
        for (int a = 0; a < 3; ++a) {
            lo[a] = std::min(lo[a], v[a]);
            hi[a] = std::max(hi[a], v[a]);
        }
    const double extent = std::max({hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]});
    Mesh mesh;
    for (double resolution : {16.0, 64.0, 0.0, 256.0}) {  // 0: an empty member
        const double h = extent / (resolution > 0 ? resolution : 1.0);
        mesh.transforms.push_back(MemberTransform{{h, h, h}, {lo[0] + 0.37 * h, hi[1], lo[2] - 3 * h}});
        mesh.vertices.push_back(resolution > 0 ? bunny.vertices : std::vector<Vec3d>{});
        mesh.faces.push_back(resolution > 0 ? bunny.faces : std::vector<std::array<int32_t, 3>>{});
    }
    expect_same_voxelisation("bunny at 16, 64 and 256 voxels across", mesh);
}

TEST_F(MeshParity, ErrorsAreIdentical) {
    Mesh base;
    for (int m = 0; m < 3; ++m) {
        base.vertices.push_back({{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {0, 0, 1}});
        base.faces.push_back({{0, 1, 2}, {1, 2, 3}, {0, 2, 3}, {0, 1, 3}});
        base.transforms.push_back(MemberTransform{{0.5, 0.25, 2.0}, {-1, 2, 3}});
    }
    Mesh mesh = base;
    mesh.faces[2][3] = {0, 4, 1};
    mesh.faces[1][2] = {-7, 4, 1};
    mesh.vertices[0][1][0] = std::numeric_limits<double>::infinity();
    expect_same_voxelisation("bad indices and a bad vertex", mesh);
    mesh = base;
    mesh.vertices[1][2][2] = std::numeric_limits<double>::quiet_NaN();
    mesh.vertices[2][0][0] = std::numeric_limits<double>::quiet_NaN();
    expect_same_voxelisation("non-finite vertices", mesh);
    mesh = base;
    mesh.vertices[1][3] = {0, 0, -5e9};
    expect_same_voxelisation("outside int32", mesh);
    mesh = base;  // index coordinates +-1e9 on every axis: ~8e27 candidates
    const MemberTransform& t = base.transforms[0];
    mesh.vertices[0] = {to_world(t, {-1e9, -1e9, -1e9}), to_world(t, {1e9, 1e9, 1e9}), to_world(t, {1e9, -1e9, 0}),
                        to_world(t, {0, 0, 1})};
    expect_same_voxelisation("one face beyond int64 candidates", mesh);
    mesh = base;  // ~3.4e18 candidates per face
    mesh.vertices[2] = {to_world(t, {0, 0, 0}), to_world(t, {1.5e6, 1.5e6, 0}), to_world(t, {1.5e6, 0, 1.5e6}),
                        to_world(t, {0, 0, 1})};
    mesh.faces[2] = {{0, 1, 2}, {0, 2, 1}, {1, 2, 0}};
    expect_same_voxelisation("three faces beyond int64 candidates together", mesh);
}

}  // namespace
}  // namespace sparsegrid_test
