#include <sparsegrid/mesh_io.h>

#include "core/errors.h"

#include <cmath>
#include <filesystem>

#if defined(SPARSEGRID_WITH_ASSIMP)
#include <assimp/postprocess.h>
#include <assimp/scene.h>
#include <assimp/Importer.hpp>
#endif

namespace sparsegrid {

using detail::throw_error;

bool mesh_loading_available() {
#if defined(SPARSEGRID_WITH_ASSIMP)
    return true;
#else
    return false;
#endif
}

TriangleMesh load_mesh(const std::string& path) {
    constexpr const char* op = "load_mesh";
#if defined(SPARSEGRID_WITH_ASSIMP)
    std::error_code error;
    if (!std::filesystem::is_regular_file(path, error))
        throw_error(op, ": '", path, "' is not a readable file (missing, or not a regular file)");
    Assimp::Importer importer;
    // Pre-transforming flattens the node hierarchy into world coordinates; sorting by primitive type
    // lets points and lines be skipped.
    const aiScene* scene = importer.ReadFile(path,
                                             aiProcess_Triangulate | aiProcess_JoinIdenticalVertices |
                                                 aiProcess_PreTransformVertices | aiProcess_SortByPType);
    if (!scene || (scene->mFlags & AI_SCENE_FLAGS_INCOMPLETE) || !scene->mRootNode)
        throw_error(op, ": cannot read '", path, "': ", importer.GetErrorString());
    TriangleMesh mesh;
    for (unsigned m = 0; m < scene->mNumMeshes; ++m) {
        const aiMesh* part = scene->mMeshes[m];
        if (!(part->mPrimitiveTypes & aiPrimitiveType_TRIANGLE)) continue;
        const size_t base = mesh.vertices.size();
        if (base + part->mNumVertices > static_cast<size_t>(INT32_MAX))
            throw_error(op, ": '", path, "' has more than 2^31 - 1 vertices");
        for (unsigned v = 0; v < part->mNumVertices; ++v) {
            const aiVector3D& p = part->mVertices[v];
            if (!(std::isfinite(p.x) && std::isfinite(p.y) && std::isfinite(p.z)))
                throw_error(op, ": '", path, "': vertex ", v, " of mesh ", m, " is not finite (", p.x, ", ", p.y, ", ",
                            p.z, ")");
            mesh.vertices.push_back({p.x, p.y, p.z});
        }
        for (unsigned f = 0; f < part->mNumFaces; ++f) {
            const aiFace& face = part->mFaces[f];
            if (face.mNumIndices != 3) continue;
            for (unsigned corner = 0; corner < 3; ++corner)
                if (face.mIndices[corner] >= part->mNumVertices)
                    throw_error(op, ": '", path, "': face ", f, " of mesh ", m, " refers to vertex ",
                                face.mIndices[corner], " of ", part->mNumVertices);
            mesh.faces.push_back({static_cast<int32_t>(base + face.mIndices[0]),
                                  static_cast<int32_t>(base + face.mIndices[1]),
                                  static_cast<int32_t>(base + face.mIndices[2])});
        }
    }
    if (mesh.faces.empty()) throw_error(op, ": '", path, "' holds no triangles");
    return mesh;
#else
    throw_error(op, ": cannot read '", path, "': this build of sparsegrid has no mesh loading (assimp was not found)");
#endif
}

}  // namespace sparsegrid
