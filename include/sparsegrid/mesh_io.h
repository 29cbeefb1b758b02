// Triangle meshes from files: Wavefront OBJ, OFF, STL (ASCII and binary) and PLY (ASCII and binary),
// read by the library's own parsers (src/api/mesh_formats.cpp), which check every count and index
// against the file before they use it.
#pragma once

#include <sparsegrid/types.h>

#include <array>
#include <string>
#include <vector>

namespace sparsegrid {

struct TriangleMesh {
    std::vector<Vec3d> vertices;
    std::vector<std::array<int32_t, 3>> faces;  ///< vertex indices
};

/// Always true: every build reads the formats of load_mesh (kept for callers that checked it).
bool mesh_loading_available();

/// Every triangle of the file, polygons triangulated as fans (points and lines are left out). The format
/// comes from the extension, in any case: .obj, .off, .ply, .stl; any other is refused with the list.
/// Throws Error naming the file and the reason when it is missing, unreadable, malformed (a line or
/// entry is named where that helps), holds a non-finite vertex, an index out of range or no triangle.
/// STL repeats each triangle's corners (its format shares none); OBJ ignores texture coordinates,
/// normals, groups and materials.
TriangleMesh load_mesh(const std::string& path);

}  // namespace sparsegrid
