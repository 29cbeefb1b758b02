// Triangle meshes from files, through the Open Asset Import Library (assimp): OBJ, PLY, STL, OFF, glTF
// and the other formats it reads.
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

/// True when the library was built with assimp (load_mesh works).
bool mesh_loading_available();

/// Every triangle of the file's scene, with node transforms applied and polygons triangulated
/// (points and lines are dropped). Throws Error naming the file when it is missing, unreadable,
/// malformed or holds no triangles, or when the library was built without assimp.
TriangleMesh load_mesh(const std::string& path);

}  // namespace sparsegrid
