// Mesh files through load_mesh (the parsers themselves: test_mesh_formats.cpp), and the bundled bunny
// voxelised with from_mesh.
#include "test_util.h"

#include <sparsegrid/mesh_io.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

namespace sparsegrid_test {
namespace {

using sparsegrid::TriangleMesh;

class MeshFiles : public ::testing::Test {
protected:
    std::string write(const std::string& name, const std::string& text) {
        const std::string path = ::testing::TempDir() + "sparsegrid_" + name;
        std::ofstream(path) << text;
        return path;
    }
};

TEST_F(MeshFiles, ObjTetrahedronAndTriangulatedQuad) {
    const TriangleMesh tetra = sparsegrid::load_mesh(
        write("tetra.obj", "v 0 0 0\nv 1 0 0\nv 0 1 0\nv 0 0 1\nf 1 3 2\nf 1 2 4\nf 1 4 3\nf 2 3 4\n"));
    EXPECT_EQ(tetra.vertices.size(), 4u);
    EXPECT_EQ(tetra.faces.size(), 4u);
    std::set<Vec3d> corners(tetra.vertices.begin(), tetra.vertices.end());
    EXPECT_EQ(corners, (std::set<Vec3d>{{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {0, 0, 1}}));
    const TriangleMesh quad = sparsegrid::load_mesh(
        write("quad.obj", "v 0 0 0\nv 2 0 0\nv 2 2 0\nv 0 2 0\nf 1 2 3 4\n"));
    EXPECT_EQ(quad.faces.size(), 2u);
}

TEST_F(MeshFiles, NonFiniteVerticesAreRefusedNamingTheFile) {
    for (const char* value : {"nan", "inf", "-inf"}) {
        const std::string path = write(std::string("nonfinite_") + value + ".obj",
                                       std::string("v ") + value + " 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n");
        EXPECT_TRUE(throws_error([&] { sparsegrid::load_mesh(path); }, "load_mesh", {"is not finite"})) << value;
        EXPECT_TRUE(throws_error([&] { sparsegrid::load_mesh(path); }, path, {"vertex 0"})) << value;
    }
}

TEST_F(MeshFiles, AsciiStlAndOff) {
    const TriangleMesh stl = sparsegrid::load_mesh(
        write("triangle.stl",
              "solid t\nfacet normal 0 0 1\nouter loop\nvertex 0 0 0\nvertex 1 0 0\nvertex 0 1 0\n"
              "endloop\nendfacet\nendsolid t\n"));
    EXPECT_EQ(stl.faces.size(), 1u);
    const TriangleMesh off = sparsegrid::load_mesh(write("triangle.off", "OFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n3 0 1 2\n"));
    EXPECT_EQ(off.faces.size(), 1u);
}

TEST_F(MeshFiles, BadFilesNameTheFile) {
    EXPECT_TRUE(
        throws_error([] { sparsegrid::load_mesh("/nonexistent/bunny.ply"); }, "load_mesh", {"/nonexistent/bunny.ply"}));
    const std::string garbage = write("garbage.ply", "this is not a mesh\n");
    EXPECT_TRUE(throws_error([&] { sparsegrid::load_mesh(garbage); }, "load_mesh", {"garbage.ply"}));
    const std::string scene = write("scene.3ds", "not read");
    EXPECT_TRUE(throws_error([&] { sparsegrid::load_mesh(scene); }, "load_mesh",
                             {"scene.3ds", "'.3ds' is not supported", ".obj, .off, .ply, .stl"}));
    const std::string lines_only = write("lines.obj", "v 0 0 0\nv 1 0 0\nl 1 2\n");
    EXPECT_TRUE(throws_error([&] { sparsegrid::load_mesh(lines_only); }, "load_mesh", {"lines.obj"}));
}

TEST_F(MeshFiles, BundledBunnyVoxelises) {
    const TriangleMesh bunny = sparsegrid::load_mesh(std::string(SPARSEGRID_SOURCE_DIR) + "/data/bunny.ply");
    EXPECT_EQ(bunny.faces.size(), 3674u);
    Vec3d lo = bunny.vertices.front(), hi = lo;
    for (const Vec3d& v : bunny.vertices)
        for (int a = 0; a < 3; ++a) {
            lo[a] = std::min(lo[a], v[a]);
            hi[a] = std::max(hi[a], v[a]);
        }
    // 32 voxels across the largest extent.
    const double h = std::max({hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]}) / 32.0;
    std::vector<double> vertices;
    for (const Vec3d& v : bunny.vertices) vertices.insert(vertices.end(), v.begin(), v.end());
    std::vector<int32_t> faces;
    for (const auto& f : bunny.faces) faces.insert(faces.end(), f.begin(), f.end());
    const std::vector<int64_t> vertex_offsets{0, static_cast<int64_t>(bunny.vertices.size())};
    const std::vector<int64_t> face_offsets{0, static_cast<int64_t>(bunny.faces.size())};
    const GridBatch grid = GridBatch::from_mesh(vertices, vertex_offsets, faces, face_offsets,
                                                {MemberTransform{{h, h, h}, lo}});
    EXPECT_TRUE(grid_is_well_formed(grid, sparsegrid::Device::cpu()));
    // A closed surface at 32 voxels across covers well over a thousand voxels, all inside the box.
    EXPECT_GT(grid.num_voxels(), 1000);
    const sparsegrid::CoordBox& box = grid.coordinate_box();
    for (int a = 0; a < 3; ++a) {
        EXPECT_GE(box.lo[a], 0);
        EXPECT_LE(box.hi[a], 33);
    }
}

}  // namespace
}  // namespace sparsegrid_test
