// The mesh parsers on their own (src/api/mesh_formats.cpp): every format and variant on small files with
// known answers, the errors of malformed files, and a fuzz campaign over mutants of real files (cut
// short, bits flipped, bytes and numbers replaced, spans deleted and repeated): each mutant either parses
// into a valid mesh (finite vertices, indices in range, at least one triangle) or raises Error. Under the
// sanitizer build (scripts/sanitize.sh) a read out of bounds or an overflow fails the run.
#include "test_util.h"

#include "api/mesh_formats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <typeinfo>

namespace sparsegrid_test {
namespace {

using sparsegrid::TriangleMesh;
using sparsegrid::detail::MeshFormat;
using sparsegrid::detail::parse_mesh;

::testing::AssertionResult raises(MeshFormat format, const std::string& bytes,
                                  std::initializer_list<const char*> fragments) {
    try {
        parse_mesh(format, bytes);
    } catch (const sparsegrid::Error& error) {
        const std::string message = error.what();
        for (const char* fragment : fragments)
            if (message.find(fragment) == std::string::npos)
                return ::testing::AssertionFailure() << "message '" << message << "' lacks '" << fragment << "'";
        return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "no error";
}

std::string little_endian(float value) {
    uint32_t bits = 0;
    std::memcpy(&bits, &value, 4);
    std::string out(4, '\0');
    for (int i = 0; i < 4; ++i) out[static_cast<size_t>(i)] = static_cast<char>((bits >> (8 * i)) & 0xffu);
    return out;
}

template <typename T>
std::string bytes_of(T value, bool big_endian) {
    std::string out(sizeof(T), '\0');
    std::memcpy(out.data(), &value, sizeof(T));
    if (big_endian) std::reverse(out.begin(), out.end());
    return out;
}

std::string binary_stl(const std::vector<std::array<float, 9>>& triangles, const std::string& header = "binary") {
    std::string out = header;
    out.resize(80, ' ');
    out += bytes_of(static_cast<uint32_t>(triangles.size()), false);
    for (const auto& t : triangles) {
        out += std::string(12, '\0');  // the normal
        for (float v : t) out += little_endian(v);
        out += std::string(2, '\0');
    }
    return out;
}

/// A unit square (two triangles through a quad) and a triangle in binary PLY, with an extra property on
/// each element and an extra element between them.
std::string binary_ply(bool big_endian) {
    std::string out = std::string("ply\nformat ") + (big_endian ? "binary_big_endian" : "binary_little_endian") +
        " 1.0\ncomment made by hand\nelement vertex 5\nproperty double x\nproperty float y\nproperty short z\n"
        "property uchar red\nelement edge 1\nproperty int vertex1\nproperty int vertex2\n"
        "element face 2\nproperty list uchar uint vertex_indices\nproperty float quality\nend_header\n";
    const double xs[5] = {0, 1, 1, 0, 5};
    const float ys[5] = {0, 0, 1, 1, 5};
    const int16_t zs[5] = {0, 0, 0, 0, -7};
    for (int v = 0; v < 5; ++v)
        out += bytes_of(xs[v], big_endian) + bytes_of(ys[v], big_endian) + bytes_of(zs[v], big_endian) + "\x7f";
    out += bytes_of(int32_t{0}, big_endian) + bytes_of(int32_t{1}, big_endian);
    out += bytes_of(uint8_t{4}, big_endian);
    for (uint32_t i : {0u, 1u, 2u, 3u}) out += bytes_of(i, big_endian);
    out += bytes_of(0.5f, big_endian);
    out += bytes_of(uint8_t{3}, big_endian);
    for (uint32_t i : {4u, 0u, 1u}) out += bytes_of(i, big_endian);
    out += bytes_of(0.25f, big_endian);
    return out;
}

TEST(MeshFormats, ObjReferencesTrianglesAndIgnoredStatements) {
    const TriangleMesh mesh = parse_mesh(
        MeshFormat::Obj,
        "# a comment\nmtllib x.mtl\no thing\nv 0 0 0\nv 1 0 0 1.0\nvt 0 0\nvn 0 0 1\nv 1 1 0\nv 0 1 0 # after\n"
        "g side\nusemtl red\ns off\nf 1/1/1 2/1/1 3//1 4\nf -4 -3 -1\nl 1 2\np 3\nf 1 5 2\nv +2.5e0 -1 .5\n");
    ASSERT_EQ(mesh.vertices.size(), 5u);
    EXPECT_EQ(mesh.vertices[4], (Vec3d{2.5, -1, 0.5}));
    // The quad as a fan (0 1 2), (0 2 3); -4 -3 -1 are 0 1 3 at that point; the forward reference 5 is fine.
    const std::vector<std::array<int32_t, 3>> faces{{0, 1, 2}, {0, 2, 3}, {0, 1, 3}, {0, 4, 1}};
    EXPECT_EQ(mesh.faces, faces);
}

TEST(MeshFormats, OffVariants) {
    const TriangleMesh plain = parse_mesh(MeshFormat::Off,
                                          "OFF\n# counts\n4 2 0\n\n0 0 0\n1 0 0\n1 1 0\n0 1 0\n"
                                          "3 0 1 2\n3 0 2 3\n");
    EXPECT_EQ(plain.faces.size(), 2u);
    // Counts on the header line, colours after coordinates and indices, a quad, a CRLF file.
    const TriangleMesh coloured = parse_mesh(MeshFormat::Off,
                                             "COFF 4 1 0\r\n0 0 0 255 0 0 255\r\n1 0 0 1 1 1 1\r\n"
                                             "1 1 0 1 1 1 1\r\n0 1 0 1 1 1 1\r\n4 0 1 2 3 0.5 0.5 0.5\r\n");
    EXPECT_EQ(coloured.faces.size(), 2u);
    EXPECT_EQ(coloured.vertices[1], (Vec3d{1, 0, 0}));
    const TriangleMesh headerless = parse_mesh(MeshFormat::Off, "3 1 0\n0 0 0\n1 0 0\n0 1 0\n3 2 1 0\n");
    EXPECT_EQ(headerless.faces, (std::vector<std::array<int32_t, 3>>{{2, 1, 0}}));
}

TEST(MeshFormats, StlAsciiAndBinary) {
    const TriangleMesh ascii = parse_mesh(
        MeshFormat::Stl,
        "solid a b\n facet normal 0 0 1\n  outer loop\n   vertex 0 0 0\n   vertex 1 0 0\n"
        "   vertex 0 1 0\n  endloop\n endfacet\nendsolid a b\nsolid second\nfacet normal 0 0 1\n"
        "outer loop\nvertex 0 0 1\nvertex 1 0 1\nvertex 0 1 1\nendloop\nendfacet\nendsolid\n");
    EXPECT_EQ(ascii.faces.size(), 2u);
    EXPECT_EQ(ascii.vertices.size(), 6u);
    const std::vector<std::array<float, 9>> triangles{{0, 0, 0, 1, 0, 0, 0, 1, 0}, {0, 0, 2, 1, 0, 2, 0, 1, 2.5f}};
    for (const std::string& header : {std::string("binary"), std::string("solid but binary")}) {
        const TriangleMesh binary = parse_mesh(MeshFormat::Stl, binary_stl(triangles, header));
        ASSERT_EQ(binary.faces.size(), 2u) << header;
        EXPECT_EQ(binary.vertices[5], (Vec3d{0, 1, 2.5})) << header;
    }
}

TEST(MeshFormats, PlyAsciiAndBothBinaryOrders) {
    const TriangleMesh ascii = parse_mesh(
        MeshFormat::Ply,
        "ply\nformat ascii 1.0\ncomment c\nelement vertex 4\nproperty float x\nproperty float y\n"
        "property float z\nproperty list uchar int unused\nelement face 1\n"
        "property list uchar int vertex_index\nend_header\n0 0 0 0\n1 0 0 2 7 7\n1 1 0 0\n0 1 0 1 3\n"
        "4 0 1 2 3\n");
    EXPECT_EQ(ascii.faces, (std::vector<std::array<int32_t, 3>>{{0, 1, 2}, {0, 2, 3}}));
    for (const bool big_endian : {false, true}) {
        const TriangleMesh binary = parse_mesh(MeshFormat::Ply, binary_ply(big_endian));
        ASSERT_EQ(binary.vertices.size(), 5u) << big_endian;
        EXPECT_EQ(binary.vertices[4], (Vec3d{5, 5, -7})) << big_endian;
        EXPECT_EQ(binary.faces, (std::vector<std::array<int32_t, 3>>{{0, 1, 2}, {0, 2, 3}, {4, 0, 1}})) << big_endian;
    }
}

TEST(MeshFormats, MalformedFilesRaiseWithTheReason) {
    using sparsegrid::detail::mesh_format_of;
    EXPECT_TRUE(
        throws_error([] { mesh_format_of("/data/model.3ds"); }, "'.3ds' is not supported", {".obj, .off, .ply, .stl"}));
    EXPECT_TRUE(throws_error([] { mesh_format_of("/data.d/model"); }, "(no extension)", {".obj"}));
    EXPECT_EQ(mesh_format_of("/x/Bunny.PLY"), MeshFormat::Ply);
    // Non-finite and out-of-range vertices and indices, in every format.
    EXPECT_TRUE(
        raises(MeshFormat::Obj, "v 0 0 0\nv 1 0 0\nv 0 nan 0\nf 1 2 3\n", {"vertex 2", "line 3", "not finite"}));
    EXPECT_TRUE(raises(MeshFormat::Obj, "v 0 0 0\nv 1 0 1e999\n", {"line 2", "three numbers"}));
    EXPECT_TRUE(raises(MeshFormat::Obj, "v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 4\n", {"refers to vertex 3 of 3"}));
    EXPECT_TRUE(raises(MeshFormat::Obj, "v 0 0 0\nf 1 -2 1\n", {"line 2", "before the first vertex"}));
    EXPECT_TRUE(raises(MeshFormat::Obj, "v 0 0 0\nf 1 0 1\n", {"line 2", "'0' is not a vertex reference"}));
    EXPECT_TRUE(raises(MeshFormat::Obj, "v 0 0 0\nv 1 0 0\nl 1 2\n", {"no triangles"}));
    EXPECT_TRUE(raises(MeshFormat::Off, "OFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n3 0 1 3\n", {"line 6", "vertex 3 of 3"}));
    EXPECT_TRUE(raises(MeshFormat::Off, "OFF\n3000000000 1 0\n0 0 0\n", {"more than 2^31 - 1"}));
    EXPECT_TRUE(raises(MeshFormat::Off, "OFF\n300 100 0\n0 0 0\n", {"remaining 1 lines"}));
    EXPECT_TRUE(raises(MeshFormat::Off, "4OFF\n1 1 0\n", {"4D or nD"}));
    EXPECT_TRUE(raises(MeshFormat::Off, "OFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n5 0 1 2\n", {"lists 3 of its 5"}));
    EXPECT_TRUE(raises(MeshFormat::Stl, "solid x\nfacet\nouter loop\nvertex 0 0 0\nvertex 1 0 0\nendloop\n",
                       {"line 6", "facet with 2 vertices"}));
    EXPECT_TRUE(raises(MeshFormat::Stl, "plain text", {"neither ASCII STL"}));
    std::string lying = binary_stl({{0, 0, 0, 1, 0, 0, 0, 1, 0}});
    lying[80] = '\x10';  // 16 triangles declared, one present
    EXPECT_TRUE(raises(MeshFormat::Stl, lying, {"declares 16 triangles", "134 bytes"}));
    EXPECT_TRUE(
        raises(MeshFormat::Stl, binary_stl({{0, 0, 0, 1, 0, 0, 0, INFINITY, 0}}), {"triangle 0", "not finite"}));
    const std::string header =
        "ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\n"
        "property float z\nelement face 1\nproperty list uchar int vertex_indices\nend_header\n";
    EXPECT_TRUE(raises(MeshFormat::Ply, header + "0 0 0\n1 0 0\n0 1 0\n3 0 1 3\n", {"face 0 refers to vertex 3 of 3"}));
    EXPECT_TRUE(raises(MeshFormat::Ply, header + "0 0 0\n1 0 0\n0 1 0\n3 0 1.5 2\n", {"not an integer"}));
    EXPECT_TRUE(raises(MeshFormat::Ply, header + "0 0 0\n1 0 0\n0 1 0\n3 0 1\n", {"ends inside element 'face'"}));
    EXPECT_TRUE(raises(MeshFormat::Ply, header + "0 0 0\n1 inf 0\n0 1 0\n3 0 1 2\n", {"vertex 1", "not finite"}));
    EXPECT_TRUE(raises(MeshFormat::Ply,
                       "ply\nformat ascii 1.0\nelement vertex 99999999999\nproperty float x\n"
                       "property float y\nproperty float z\nend_header\n0 0 0\n",
                       {"declares 99999999999 entries"}));
    EXPECT_TRUE(raises(MeshFormat::Ply, "ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nend_header\n0\n",
                       {"lacks one of the properties x, y, z"}));
    EXPECT_TRUE(raises(MeshFormat::Ply, "ply\nformat ascii 1.0\n", {"no 'end_header'"}));
    // An element without properties holds no data whatever its count: skipped at once.
    EXPECT_EQ(
        parse_mesh(MeshFormat::Ply,
                   "ply\nformat ascii 1.0\nelement nothing 999999999999999\n" +
                       header.substr(std::string("ply\nformat ascii 1.0\n").size()) + "0 0 0\n1 0 0\n0 1 0\n3 0 1 2\n")
            .faces.size(),
        1u);
    EXPECT_TRUE(raises(MeshFormat::Off, "OFF\n3 9223372036854775807 0\n0 0 0\n", {"remaining 1 lines"}));
    EXPECT_TRUE(raises(MeshFormat::Ply, "ply\nformat binary 1.0\nend_header\n", {"header line 2", "unknown format"}));
    std::string truncated = binary_ply(false);
    truncated.resize(truncated.size() - 3);
    EXPECT_TRUE(raises(MeshFormat::Ply, truncated, {"ends inside element 'face'"}));
    std::string long_list = binary_ply(true);
    long_list[long_list.find("end_header\n") + 11 + 5 * 15 + 8] = '\xff';  // the quad's length: 255 indices
    EXPECT_TRUE(raises(MeshFormat::Ply, long_list, {"element 'face'"}));
}

// ---- fuzzing -----------------------------------------------------------------------------------------

/// One mutant of `seed`: cut short, bits flipped, bytes replaced by digits or signs, a number replaced by a
/// huge or negative one, a span deleted or repeated.
std::string mutate(const std::string& seed, Rng& rng) {
    std::string out = seed;
    const int edits = static_cast<int>(uniform_int(rng, 1, 4));
    for (int e = 0; e < edits && !out.empty(); ++e) {
        const auto at = static_cast<size_t>(uniform_int(rng, 0, static_cast<int64_t>(out.size()) - 1));
        switch (uniform_int(rng, 0, 5)) {
        case 0:
            out.resize(at);
            break;
        case 1:
            out[at] = static_cast<char>(out[at] ^ (1 << uniform_int(rng, 0, 7)));
            break;
        case 2:
            out[at] = "0123456789-+.eE \n/"[uniform_int(rng, 0, 17)];
            break;
        case 3: {
            static const char* const kNumbers[] = {
                "4294967295", "-1", "2147483648", "99999999999999999999", "1e308", "nan", "-0", "255", "65536"};
            out.insert(at, kNumbers[uniform_int(rng, 0, 8)]);
            break;
        }
        case 4:
            out.erase(at, static_cast<size_t>(uniform_int(rng, 1, 64)));
            break;
        default:
            out.insert(at, out.substr(at, static_cast<size_t>(uniform_int(rng, 1, 64))));
            break;
        }
    }
    return out;
}

struct Outcomes {
    int parsed = 0;
    int raised = 0;
};

/// Parses, and checks what comes back: a valid mesh or an Error (anything else fails).
void parse_and_check(MeshFormat format, const std::string& bytes, const std::string& label, Outcomes& outcomes) {
    TriangleMesh mesh;
    try {
        mesh = parse_mesh(format, bytes);
    } catch (const sparsegrid::Error&) {
        ++outcomes.raised;
        return;
    } catch (const std::exception& other) {
        ADD_FAILURE() << label << ": a " << typeid(other).name() << " instead of sparsegrid::Error: " << other.what();
        return;
    }
    ASSERT_FALSE(mesh.faces.empty()) << label;
    for (const Vec3d& v : mesh.vertices)
        ASSERT_TRUE(std::isfinite(v[0]) && std::isfinite(v[1]) && std::isfinite(v[2])) << label;
    for (const auto& face : mesh.faces)
        for (const int32_t corner : face)
            ASSERT_TRUE(corner >= 0 && static_cast<size_t>(corner) < mesh.vertices.size()) << label;
    ++outcomes.parsed;
}

TEST(MeshFormats, FuzzedFilesParseOrRaise) {
    std::ifstream bunny_file(std::string(SPARSEGRID_SOURCE_DIR) + "/data/bunny.ply", std::ios::binary);
    std::stringstream bunny;
    bunny << bunny_file.rdbuf();
    ASSERT_GT(bunny.str().size(), 1000u) << "data/bunny.ply is missing";
    const std::vector<std::pair<MeshFormat, std::string>> seeds{
        {MeshFormat::Ply, bunny.str()},
        {MeshFormat::Ply, binary_ply(false)},
        {MeshFormat::Ply, binary_ply(true)},
        {MeshFormat::Obj, "v 0 0 0\nv 1 0 0\nv 1 1 0\nv 0 1 0\nvt 0 0\nf 1/1 2/1 3/1 4/1\nf -1 -2 -3\n"},
        {MeshFormat::Off, "OFF\n4 2 0\n0 0 0\n1 0 0\n1 1 0\n0 1 0\n3 0 1 2\n4 0 1 2 3\n"},
        {MeshFormat::Stl,
         "solid s\nfacet normal 0 0 1\nouter loop\nvertex 0 0 0\nvertex 1 0 0\nvertex 0 1 0\n"
         "endloop\nendfacet\nendsolid s\n"},
        {MeshFormat::Stl, binary_stl({{0, 0, 0, 1, 0, 0, 0, 1, 0}, {0, 0, 1, 1, 0, 1, 0, 1, 1}})},
    };
    constexpr uint64_t kSeed = 20261203;
    Rng rng(kSeed);
    SCOPED_TRACE(::testing::Message() << "mutation seed " << kSeed);
    Outcomes outcomes;
    for (size_t s = 0; s < seeds.size(); ++s) {
        const auto& [format, seed] = seeds[s];
        parse_and_check(format, seed, "seed " + std::to_string(s), outcomes);
        // Every prefix of the small seeds, and mutants of all of them.
        if (seed.size() < 2000)
            for (size_t length = 0; length < seed.size(); ++length)
                parse_and_check(format, seed.substr(0, length),
                                "seed " + std::to_string(s) + " cut at " + std::to_string(length), outcomes);
        const int mutants = seed.size() > 10000 ? 100 : 600;
        for (int m = 0; m < mutants; ++m)
            parse_and_check(format, mutate(seed, rng), "seed " + std::to_string(s) + " mutant " + std::to_string(m),
                            outcomes);
    }
    // The campaign reaches both sides: mutants that still parse (the checks of valid meshes ran) and
    // mutants that raise (the error paths ran).
    std::printf("mesh fuzz: %d parsed, %d raised\n", outcomes.parsed, outcomes.raised);
    EXPECT_GT(outcomes.parsed, 300);
    EXPECT_GT(outcomes.raised, 300);
}

}  // namespace
}  // namespace sparsegrid_test
