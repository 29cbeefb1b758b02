// CPU voxelisation of triangle meshes: every voxel whose closed cube meets a triangle, found by testing
// the voxels of each triangle's bounding box with the separating-axis predicate, then sorted into a
// grid like every generated topology.
#include "cpu/mesh_cpu.h"

#include "core/checks.h"
#include "core/triangle_box.h"
#include "cpu/grid_keys.h"
#include "cpu/parallel.h"

#include <climits>
#include <cmath>

namespace sparsegrid::detail::cpu {

namespace {

struct IndexTriangle {
    Point3 corner[3];
    int64_t lo[3], hi[3];  ///< voxels whose cubes meet the triangle's bounding box
};

/// The triangle in continuous index coordinates of its member, with its voxel range; the range is
/// checked against int32 (the error names the member and face).
IndexTriangle index_triangle(const double* vertices, const int32_t* face, const MemberTransform& t, int64_t member,
                             int64_t face_index) {
    IndexTriangle tri;
    for (int v = 0; v < 3; ++v) {
        const double* p = vertices + 3 * static_cast<int64_t>(face[v]);
        tri.corner[v] = {(p[0] - t.origin[0]) / t.voxel_size[0], (p[1] - t.origin[1]) / t.voxel_size[1],
                         (p[2] - t.origin[2]) / t.voxel_size[2]};
    }
    for (int v = 0; v < 3; ++v)
        for (int a = 0; a < 3; ++a)
            if (!std::isfinite(component(tri.corner[v], a)))
                throw_error("GridBatch::from_mesh: face ", face_index, " of member ", member, " has vertex ", face[v],
                            " whose coordinates are not finite (after the member's transform)");
    for (int a = 0; a < 3; ++a) {
        const double c0 = component(tri.corner[0], a), c1 = component(tri.corner[1], a),
                     c2 = component(tri.corner[2], a);
        const double lo = std::ceil(min3(c0, c1, c2) - 0.5), hi = std::floor(max3(c0, c1, c2) + 0.5);
        if (!(lo >= static_cast<double>(INT32_MIN) && hi <= static_cast<double>(INT32_MAX)))
            throw_error("GridBatch::from_mesh: face ", face_index, " of member ", member,
                        " reaches voxel indices outside int32 on axis ", a);
        tri.lo[a] = static_cast<int64_t>(lo);
        tri.hi[a] = static_cast<int64_t>(hi);
    }
    return tri;
}

}  // namespace

GridTopology from_mesh(const double* vertices, const std::vector<int64_t>& vertex_offsets, const int32_t* faces,
                       const std::vector<int64_t>& face_offsets, const std::vector<MemberTransform>& transforms,
                       const Context& ctx) {
    const int64_t batch_size = static_cast<int64_t>(face_offsets.size()) - 1;
    const int64_t num_faces = face_offsets.back();
    // Pass 1: voxel ranges, the box of all of them (for the key codec) and the candidate count.
    std::vector<CoordBox> chunk_boxes(static_cast<size_t>(threads_for(num_faces)));
    std::vector<int64_t> chunk_candidates(chunk_boxes.size(), 0);
    parallel_chunks(num_faces, [&](int64_t begin, int64_t end, int chunk, int) {
        CoordBox box;
        int64_t candidates = 0;
        for_each_voxel(face_offsets, begin, end, [&](int64_t member, int64_t f) {
            const IndexTriangle tri = index_triangle(vertices + 3 * vertex_offsets[member], faces + 3 * f,
                                                     transforms[member], member, f - face_offsets[member]);
            CoordBox range;
            for (int a = 0; a < 3; ++a) {
                range.lo[a] = static_cast<int32_t>(tri.lo[a]);
                range.hi[a] = static_cast<int32_t>(tri.hi[a]);
            }
            box = union_box(box, range);
            candidates += (tri.hi[0] - tri.lo[0] + 1) * (tri.hi[1] - tri.lo[1] + 1) * (tri.hi[2] - tri.lo[2] + 1);
        });
        chunk_boxes[chunk] = box;
        chunk_candidates[chunk] = candidates;
    });
    CoordBox box;
    for (const CoordBox& b : chunk_boxes) box = union_box(box, b);
    const KeyCodec codec = make_codec(box, batch_size);
    // Pass 2: test every voxel of every triangle's range; keep those the triangle meets.
    return with_key_type(codec, [&](auto key_tag) {
        using KeyT = decltype(key_tag);
        std::vector<std::vector<KeyT>> per_chunk(chunk_boxes.size());
        parallel_chunks(num_faces, [&](int64_t begin, int64_t end, int chunk, int) {
            std::vector<KeyT>& out = per_chunk[chunk];
            out.reserve(static_cast<size_t>(std::min<int64_t>(chunk_candidates[chunk], int64_t{1} << 24)));
            const Point3 half{0.5, 0.5, 0.5};
            for_each_voxel(face_offsets, begin, end, [&](int64_t member, int64_t f) {
                const IndexTriangle tri = index_triangle(vertices + 3 * vertex_offsets[member], faces + 3 * f,
                                                         transforms[member], member, f - face_offsets[member]);
                for (int64_t i = tri.lo[0]; i <= tri.hi[0]; ++i)
                    for (int64_t j = tri.lo[1]; j <= tri.hi[1]; ++j)
                        for (int64_t k = tri.lo[2]; k <= tri.hi[2]; ++k) {
                            const Point3 centre{static_cast<double>(i), static_cast<double>(j), static_cast<double>(k)};
                            if (!triangle_overlaps_box(sub(tri.corner[0], centre), sub(tri.corner[1], centre),
                                                       sub(tri.corner[2], centre), half))
                                continue;
                            out.push_back(encode_key<KeyT>(codec, member, static_cast<int32_t>(i),
                                                           static_cast<int32_t>(j), static_cast<int32_t>(k)));
                        }
            });
        });
        std::vector<KeyT> keys;
        for (auto& part : per_chunk) keys.insert(keys.end(), part.begin(), part.end());
        return canonical_topology(keys, codec, batch_size, ctx);
    });
}

}  // namespace sparsegrid::detail::cpu
