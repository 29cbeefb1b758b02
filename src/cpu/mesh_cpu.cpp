// CPU voxelisation of triangle meshes: every voxel whose closed cube meets a triangle, found by testing
// the voxels of each triangle's bounding box with the separating-axis predicate, then sorted into a
// grid like every generated topology. The geometry and the checks are shared with the CUDA backend
// (core/index_triangle.h); this file is compiled with -ffp-contract=off (see triangle_box.h).
#include "backend/backend.h"
#include "core/geometry.h"
#include "core/index_triangle.h"
#include "cpu/grid_keys.h"
#include "cpu/parallel.h"

#include <algorithm>
#include <climits>

namespace sparsegrid::detail {

using namespace cpu;

GridTopology CpuBackend::from_mesh(const double* vertices, const std::vector<int64_t>& vertex_offsets,
                                   const int32_t* faces, const std::vector<int64_t>& face_offsets,
                                   const std::vector<MemberTransform>& transforms, const Context& ctx) {
    const int64_t batch_size = static_cast<int64_t>(face_offsets.size()) - 1;
    const int64_t num_faces = face_offsets.back();
    auto triangle_of = [&](int64_t member, int64_t f, IndexTriangle& tri) {
        const double* member_vertices = vertices + 3 * vertex_offsets[member];
        const int32_t* face = faces + 3 * f;
        return index_triangle(member_vertices + 3 * static_cast<int64_t>(face[0]),
                              member_vertices + 3 * static_cast<int64_t>(face[1]),
                              member_vertices + 3 * static_cast<int64_t>(face[2]), transforms[member].voxel_size.data(),
                              transforms[member].origin.data(), tri);
    };
    // Pass 1: checks, voxel ranges, the box of all of them (for the key codec) and the candidate count.
    // Errors are collected per chunk (the smallest bad face) and raised after the parallel region, in
    // the order every backend uses (index_triangle.h).
    const size_t chunks = static_cast<size_t>(threads_for(num_faces));
    std::vector<CoordBox> chunk_boxes(chunks);
    std::vector<int64_t> chunk_candidates(chunks, 0);
    std::vector<int64_t> first_bad_index(chunks, INT64_MAX), first_bad_value(chunks, INT64_MAX);
    parallel_chunks(num_faces, [&](int64_t begin, int64_t end, int chunk, int) {
        CoordBox box;
        int64_t candidates = 0;
        for_each_voxel(face_offsets, begin, end, [&](int64_t member, int64_t f) {
            if (first_bad_vertex(faces + 3 * f, vertex_offsets[member + 1] - vertex_offsets[member]) >= 0) {
                first_bad_index[chunk] = std::min(first_bad_index[chunk], f);
                return;
            }
            IndexTriangle tri;
            if (triangle_of(member, f, tri).kind != TriangleProblem::kNone) {
                first_bad_value[chunk] = std::min(first_bad_value[chunk], f);
                return;
            }
            box = union_box(box, CoordBox{{tri.lo[0], tri.lo[1], tri.lo[2]}, {tri.hi[0], tri.hi[1], tri.hi[2]}});
            candidates = saturating_add(candidates, candidate_count(tri));
        });
        chunk_boxes[chunk] = box;
        chunk_candidates[chunk] = candidates;
    });
    auto member_of_face = [&](int64_t f) {
        return static_cast<int64_t>(std::upper_bound(face_offsets.begin(), face_offsets.end(), f) -
                                    face_offsets.begin()) -
            1;
    };
    const int64_t bad_index = *std::min_element(first_bad_index.begin(), first_bad_index.end());
    if (bad_index != INT64_MAX) {
        const int64_t member = member_of_face(bad_index);
        throw_mesh_vertex_index(member, bad_index - face_offsets[member], faces + 3 * bad_index,
                                vertex_offsets[member + 1] - vertex_offsets[member]);
    }
    const int64_t bad_value = *std::min_element(first_bad_value.begin(), first_bad_value.end());
    if (bad_value != INT64_MAX) {
        const int64_t member = member_of_face(bad_value);
        IndexTriangle tri;
        throw_mesh_triangle(member, bad_value - face_offsets[member], faces + 3 * bad_value,
                            triangle_of(member, bad_value, tri));
    }
    int64_t total_candidates = 0;
    for (int64_t c : chunk_candidates) total_candidates = saturating_add(total_candidates, c);
    if (total_candidates == INT64_MAX) throw_mesh_candidate_overflow();
    CoordBox box;
    for (const CoordBox& b : chunk_boxes) box = union_box(box, b);
    const KeyCodec codec = make_codec(box, batch_size);
    // Pass 2: test every voxel of every triangle's range; keep those the triangle meets.
    return with_key_type(codec, [&](auto key_tag) {
        using KeyT = decltype(key_tag);
        std::vector<std::vector<KeyT>> per_chunk(chunks);
        parallel_chunks(num_faces, [&](int64_t begin, int64_t end, int chunk, int) {
            std::vector<KeyT>& out = per_chunk[chunk];
            out.reserve(static_cast<size_t>(std::min<int64_t>(chunk_candidates[chunk], int64_t{1} << 24)));
            for_each_voxel(face_offsets, begin, end, [&](int64_t member, int64_t f) {
                IndexTriangle tri;
                triangle_of(member, f, tri);
                for (int64_t i = tri.lo[0]; i <= tri.hi[0]; ++i)
                    for (int64_t j = tri.lo[1]; j <= tri.hi[1]; ++j)
                        for (int64_t k = tri.lo[2]; k <= tri.hi[2]; ++k) {
                            const int32_t ijk[3] = {static_cast<int32_t>(i), static_cast<int32_t>(j),
                                                    static_cast<int32_t>(k)};
                            if (triangle_meets_voxel(tri, ijk))
                                out.push_back(encode_key<KeyT>(codec, member, ijk[0], ijk[1], ijk[2]));
                        }
            });
        });
        std::vector<KeyT> keys;
        for (auto& part : per_chunk) keys.insert(keys.end(), part.begin(), part.end());
        return canonical_topology(keys, codec, batch_size, ctx);
    });
}

}  // namespace sparsegrid::detail
