// CUDA voxelisation of triangle meshes: the CPU backend's voxels, bit for bit, because both evaluate the
// same geometry (core/index_triangle.h, core/triangle_box.h) on the same doubles.
//
// Work is spread per candidate, not per triangle: the candidates are the pairs (triangle, voxel of its
// bounding box), numbered through a scan of the per-triangle counts, and a fixed grid of blocks splits
// that range evenly. One triangle with millions of candidates occupies the whole GPU; a million tiny
// triangles pack densely.
//   1. triangles_kernel, one thread per face: the member, the checks (the smallest bad face of each
//      kind), the triangle in index coordinates, its voxel range and candidate count.
//   2. Candidate starts: a saturating exclusive scan of the counts (the total at [F], INT64_MAX when it
//      does not fit int64); the box of the ranges: one reduction.
//   3. count_hits_kernel: block b takes a contiguous slice of [0, total) (the total is read on the
//      device, so nothing waits), finds each candidate's triangle by binary search over the starts and
//      counts the voxels the triangle meets.
//   4. Exclusive scan of the per-block hits. Sync 1: hit count, candidate total, box, bad faces.
//   5. emit_keys_kernel: the same slices and tests; hits written in candidate order at their block's
//      offset (block scan), so the key buffer holds exactly the hits.
//   6. canonical_topology: sort, unique, offsets and exact box. Sync 2.
// Memory: ~150 bytes per face and the hit keys (three copies during the sort), never per candidate.
#include "backend/backend.h"
#include "core/errors.h"
#include "core/geometry.h"
#include "core/index_triangle.h"
#include "cuda/canonical_grid.cuh"
#include "cuda/cuda_common.cuh"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <climits>

namespace sparsegrid::detail::cuda {

namespace {

struct MeshTriangle {
    IndexTriangle tri;
    int32_t member;
};

/// Voxel range of one triangle, or the union of several.
struct VoxelRange {
    int32_t lo[3], hi[3];
};

SG_HD VoxelRange empty_range() { return {{INT32_MAX, INT32_MAX, INT32_MAX}, {INT32_MIN, INT32_MIN, INT32_MIN}}; }

struct RangeUnion {
    SG_HD VoxelRange operator()(const VoxelRange& a, const VoxelRange& b) const {
        VoxelRange out;
        for (int axis = 0; axis < 3; ++axis) {
            out.lo[axis] = a.lo[axis] < b.lo[axis] ? a.lo[axis] : b.lo[axis];
            out.hi[axis] = a.hi[axis] > b.hi[axis] ? a.hi[axis] : b.hi[axis];
        }
        return out;
    }
};

/// Addition of counts saturating at INT64_MAX: associative on non-negative values, so a scan with it
/// gives exact prefix sums while they fit and INT64_MAX from the first that does not.
struct SaturatingSum {
    SG_HD int64_t operator()(int64_t a, int64_t b) const { return saturating_add(a, b); }
};

/// No bad face (the initial value of the atomicMin targets).
constexpr unsigned long long kNoFace = ~0ull;

/// Per face (f < num_faces): the checks, the triangle, its candidate count and range. counts[num_faces]
/// = 0, so the exclusive scan of counts ends with the total. bad_faces[0] / [1]: the smallest face with
/// a vertex index outside its member / with a value problem (index_triangle). Bad faces count 0.
__global__ void triangles_kernel(const double* vertices, const int64_t* vertex_offsets, const int32_t* faces,
                                 const int64_t* face_offsets, int64_t batch_size, int64_t num_faces,
                                 const double* transforms, MeshTriangle* triangles, int64_t* counts, VoxelRange* ranges,
                                 unsigned long long* bad_faces) {
    SG_GRID_STRIDE_LOOP(f, num_faces + 1) {
        counts[f] = 0;
        if (f == num_faces) continue;
        ranges[f] = empty_range();
        const int64_t member = member_of(face_offsets, batch_size, f);
        const int32_t face[3] = {faces[3 * f], faces[3 * f + 1], faces[3 * f + 2]};
        if (first_bad_vertex(face, vertex_offsets[member + 1] - vertex_offsets[member]) >= 0) {
            atomicMin(&bad_faces[0], static_cast<unsigned long long>(f));
            continue;
        }
        const double* member_vertices = vertices + 3 * vertex_offsets[member];
        const double* transform = transforms + 6 * member;  // voxel size (3), origin (3)
        MeshTriangle out;
        out.member = static_cast<int32_t>(member);
        const TriangleProblem problem = index_triangle(
            member_vertices + 3 * static_cast<int64_t>(face[0]), member_vertices + 3 * static_cast<int64_t>(face[1]),
            member_vertices + 3 * static_cast<int64_t>(face[2]), transform, transform + 3, out.tri);
        if (problem.kind != TriangleProblem::kNone) {
            atomicMin(&bad_faces[1], static_cast<unsigned long long>(f));
            continue;
        }
        triangles[f] = out;
        counts[f] = candidate_count(out.tri);
        ranges[f] = {{out.tri.lo[0], out.tri.lo[1], out.tri.lo[2]}, {out.tri.hi[0], out.tri.hi[1], out.tri.hi[2]}};
    }
}

/// This block's contiguous slice [begin, end) of the candidates [0, total): equal shares, the last ones
/// possibly shorter or empty. Unsigned: per_block * blockIdx.x <= total + gridDim.x cannot wrap.
__device__ __forceinline__ void block_slice(int64_t total, uint64_t* begin, uint64_t* end) {
    const uint64_t count = static_cast<uint64_t>(total);
    const uint64_t per_block = (count + gridDim.x - 1) / gridDim.x;
    const uint64_t first = per_block * blockIdx.x;
    *begin = first < count ? first : count;
    *end = count - *begin > per_block ? *begin + per_block : count;
}

/// Candidate n: the voxel and member it stands for, and whether its triangle meets that voxel. Zero-count
/// triangles (bad faces) never own a candidate: the search returns the last face starting at or before n.
__device__ __forceinline__ bool test_candidate(const MeshTriangle* triangles, const int64_t* starts, int64_t num_faces,
                                               int64_t n, int32_t ijk[3], int32_t* member) {
    const int64_t f = member_of(starts, num_faces, n);
    const MeshTriangle& triangle = triangles[f];
    candidate_voxel(triangle.tri, static_cast<uint64_t>(n - starts[f]), ijk);
    *member = triangle.member;
    return triangle_meets_voxel(triangle.tri, ijk);
}

/// block_hits[b] = the hits of block b's slice; block_hits[gridDim.x] = 0 (for the exclusive scan).
/// Skips the work when a face is bad or the total overflowed: the host raises that after the sync.
__global__ void __launch_bounds__(kThreads)
    count_hits_kernel(const MeshTriangle* triangles, const int64_t* starts, int64_t num_faces,
                      const unsigned long long* bad_faces, int64_t* block_hits) {
    using BlockReduce = cub::BlockReduce<int64_t, kThreads>;
    __shared__ typename BlockReduce::TempStorage reduce_storage;
    const int64_t total = starts[num_faces];
    int64_t hits = 0;
    if (total != INT64_MAX && bad_faces[0] == kNoFace && bad_faces[1] == kNoFace) {
        uint64_t begin = 0, end = 0;
        block_slice(total, &begin, &end);
        for (uint64_t n = begin + threadIdx.x; n < end; n += blockDim.x) {
            int32_t ijk[3];
            int32_t member = 0;
            hits += test_candidate(triangles, starts, num_faces, static_cast<int64_t>(n), ijk, &member) ? 1 : 0;
        }
    }
    const int64_t block_total = BlockReduce(reduce_storage).Sum(hits);
    if (threadIdx.x == 0) block_hits[blockIdx.x] = block_total;
    if (blockIdx.x == 0 && threadIdx.x == 0) block_hits[gridDim.x] = 0;
}

/// Keys of the hits of block b's slice, in candidate order, at keys[block_offsets[b] ...]. Same grid as
/// count_hits_kernel, so the slices and the counts agree; `capacity` only guards the writes.
template <typename KeyT>
__global__ void __launch_bounds__(kThreads)
    emit_keys_kernel(const MeshTriangle* triangles, const int64_t* starts, int64_t num_faces,
                     const int64_t* block_offsets, KeyCodec codec, KeyT* keys, int64_t capacity) {
    using BlockScan = cub::BlockScan<int32_t, kThreads>;
    __shared__ typename BlockScan::TempStorage scan_storage;
    uint64_t begin = 0, end = 0;
    block_slice(starts[num_faces], &begin, &end);
    int64_t position = block_offsets[blockIdx.x];
    // Every thread of the block runs every round (the block scan needs them all).
    for (uint64_t base = begin; base < end; base += blockDim.x) {
        const uint64_t n = base + threadIdx.x;
        int32_t ijk[3] = {0, 0, 0};
        int32_t member = 0;
        const bool hit = n < end && test_candidate(triangles, starts, num_faces, static_cast<int64_t>(n), ijk, &member);
        int32_t rank = 0, round_hits = 0;
        BlockScan(scan_storage).ExclusiveSum(hit ? 1 : 0, rank, round_hits);
        if (hit && position + rank < capacity)
            keys[position + rank] = encode_key<KeyT>(codec, member, ijk[0], ijk[1], ijk[2]);
        position += round_hits;
        __syncthreads();  // scan_storage is reused by the next round
    }
}

/// Blocks of the candidate kernels: enough to fill the device; each owns an equal slice.
unsigned candidate_blocks(const Context& ctx) {
    int multiprocessors = 0;
    SPARSEGRID_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, ctx.device.index));
    constexpr int kBlocksPerMultiprocessor = 8;
    return static_cast<unsigned>(std::max(1, multiprocessors) * kBlocksPerMultiprocessor);
}

/// A batch without faces: every member empty, nothing launched, no sync.
GridTopology empty_topology(int64_t batch_size, const Context& ctx) {
    GridTopology topology;
    topology.offsets.assign(static_cast<size_t>(batch_size) + 1, 0);
    topology.offsets_buffer = Buffer<int64_t>::from_host(topology.offsets, ctx);
    topology.ijk = Buffer<int32_t>::allocate(0, ctx);
    return topology;
}

template <typename T>
std::vector<T> copy_to_host(const T* device_data, int64_t count, const Context& ctx) {
    std::vector<T> out(static_cast<size_t>(count));
    CudaBackend::copy_bytes(out.data(), Device::cpu(), device_data, ctx.device, static_cast<size_t>(count) * sizeof(T),
                            ctx.stream);
    return out;
}

/// Raises the error of a bad face found on the device, with the CPU's wording: reads the face (and its
/// vertices) back and repeats the check on the host, which computes the same doubles.
[[noreturn]] void throw_bad_face(int64_t f, bool bad_index, const double* vertices,
                                 const std::vector<int64_t>& vertex_offsets, const int32_t* faces,
                                 const std::vector<int64_t>& face_offsets,
                                 const std::vector<MemberTransform>& transforms, const Context& ctx) {
    const int64_t member =
        static_cast<int64_t>(std::upper_bound(face_offsets.begin(), face_offsets.end(), f) - face_offsets.begin()) - 1;
    const int64_t local_face = f - face_offsets[member];
    const std::vector<int32_t> face = copy_to_host(faces + 3 * f, 3, ctx);
    if (bad_index)
        throw_mesh_vertex_index(member, local_face, face.data(), vertex_offsets[member + 1] - vertex_offsets[member]);
    std::vector<double> corners;
    for (int v = 0; v < 3; ++v) {
        const std::vector<double> p = copy_to_host(vertices + 3 * (vertex_offsets[member] + face[v]), 3, ctx);
        corners.insert(corners.end(), p.begin(), p.end());
    }
    IndexTriangle tri;
    const TriangleProblem problem = index_triangle(corners.data(), corners.data() + 3, corners.data() + 6,
                                                   transforms[member].voxel_size.data(),
                                                   transforms[member].origin.data(), tri);
    throw_mesh_triangle(member, local_face, face.data(), problem);
}

}  // namespace

}  // namespace sparsegrid::detail::cuda

// ---- backend entry point --------------------------------------------------------------------------

namespace sparsegrid::detail {

using namespace cuda;

// `vertices` and `faces` in ctx.device memory; the front end has checked the shapes, the offsets and
// the transforms. The rest is checked on the device, raising the errors of core/index_triangle.h with
// the CPU's wording and precedence. Output in voxel order with the exact box. Cost: 2 syncs (the hit
// count with the checks and the range box; then the member offsets), work proportional to the voxels
// of the triangles' bounding boxes; the error path adds a few small copies.
GridTopology CudaBackend::from_mesh(const double* vertices, const std::vector<int64_t>& vertex_offsets,
                                    const int32_t* faces, const std::vector<int64_t>& face_offsets,
                                    const std::vector<MemberTransform>& transforms, const Context& ctx) {
    DeviceGuard guard(ctx);
    const cudaStream_t stream = stream_of(ctx);
    const int64_t batch_size = static_cast<int64_t>(face_offsets.size()) - 1;
    const int64_t num_faces = face_offsets.back();
    if (num_faces == 0) return empty_topology(batch_size, ctx);

    // 1-2. Triangles, candidate starts, the box of their ranges.
    std::vector<double> packed_transforms;
    packed_transforms.reserve(transforms.size() * 6);
    for (const MemberTransform& t : transforms) {
        packed_transforms.insert(packed_transforms.end(), t.voxel_size.begin(), t.voxel_size.end());
        packed_transforms.insert(packed_transforms.end(), t.origin.begin(), t.origin.end());
    }
    Buffer<MeshTriangle> triangles = Buffer<MeshTriangle>::allocate(num_faces, ctx);
    Buffer<int64_t> starts = Buffer<int64_t>::allocate(num_faces + 1, ctx);
    Buffer<VoxelRange> range_box = Buffer<VoxelRange>::allocate(1, ctx);
    Buffer<unsigned long long> bad_faces = Buffer<unsigned long long>::allocate(2, ctx);
    fill_bytes(bad_faces.data(), ctx.device, 0xff, 2 * sizeof(unsigned long long), ctx.stream);
    {
        const Buffer<int64_t> vertex_offsets_buffer = Buffer<int64_t>::from_host(vertex_offsets, ctx);
        const Buffer<int64_t> face_offsets_buffer = Buffer<int64_t>::from_host(face_offsets, ctx);
        const Buffer<double> transforms_buffer = Buffer<double>::from_host(packed_transforms, ctx);
        Buffer<int64_t> counts = Buffer<int64_t>::allocate(num_faces + 1, ctx);
        Buffer<VoxelRange> ranges = Buffer<VoxelRange>::allocate(num_faces, ctx);
        triangles_kernel<<<blocks_for(num_faces + 1), kThreads, 0, stream>>>(
            vertices, vertex_offsets_buffer.data(), faces, face_offsets_buffer.data(), batch_size, num_faces,
            transforms_buffer.data(), triangles.data(), counts.data(), ranges.data(), bad_faces.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
        cub_call(ctx, [&](void* temp, size_t& bytes) {
            return cub::DeviceScan::ExclusiveScan(temp, bytes, counts.data(), starts.data(), SaturatingSum{},
                                                  int64_t{0}, num_faces + 1, stream);
        });
        cub_call(ctx, [&](void* temp, size_t& bytes) {
            return cub::DeviceReduce::Reduce(temp, bytes, ranges.data(), range_box.data(), num_faces, RangeUnion{},
                                             empty_range(), stream);
        });
    }

    // 3-4. Hits per block and their offsets.
    const unsigned num_blocks = candidate_blocks(ctx);
    Buffer<int64_t> block_offsets = Buffer<int64_t>::allocate(num_blocks + 1, ctx);
    {
        Buffer<int64_t> block_hits = Buffer<int64_t>::allocate(num_blocks + 1, ctx);
        count_hits_kernel<<<num_blocks, kThreads, 0, stream>>>(triangles.data(), starts.data(), num_faces,
                                                               bad_faces.data(), block_hits.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
        cub_call(ctx, [&](void* temp, size_t& bytes) {
            return cub::DeviceScan::ExclusiveSum(temp, bytes, block_hits.data(), block_offsets.data(), num_blocks + 1,
                                                 stream);
        });
    }

    // Sync 1.
    Readback readback(ctx);
    const size_t hits_slot = readback.enqueue(block_offsets.data() + num_blocks, 1);
    const size_t total_slot = readback.enqueue(starts.data() + num_faces, 1);
    const size_t box_slot = readback.enqueue(range_box.data(), 1);
    const size_t bad_slot = readback.enqueue(bad_faces.data(), 2);
    readback.wait();
    const std::vector<unsigned long long> bad = readback.get<unsigned long long>(bad_slot, 2);
    // Index errors of any face come before value errors (the CPU's order).
    if (bad[0] != kNoFace)
        throw_bad_face(static_cast<int64_t>(bad[0]), true, vertices, vertex_offsets, faces, face_offsets, transforms,
                       ctx);
    if (bad[1] != kNoFace)
        throw_bad_face(static_cast<int64_t>(bad[1]), false, vertices, vertex_offsets, faces, face_offsets, transforms,
                       ctx);
    if (readback.get<int64_t>(total_slot, 1)[0] == INT64_MAX) throw_mesh_candidate_overflow();
    const int64_t num_hits = readback.get<int64_t>(hits_slot, 1)[0];
    const VoxelRange range = readback.get<VoxelRange>(box_slot, 1)[0];
    // Every face is valid here, so the range box is not empty; it covers every hit.
    const CoordBox box{{range.lo[0], range.lo[1], range.lo[2]}, {range.hi[0], range.hi[1], range.hi[2]}};
    const KeyCodec codec = make_codec(box, batch_size);

    // 5-6. The hits' keys, then the canonical grid (sync 2).
    return with_key_type(codec, [&](auto key_tag) {
        using KeyT = decltype(key_tag);
        Buffer<KeyT> keys = Buffer<KeyT>::allocate(num_hits, ctx);
        if (num_hits > 0) {
            emit_keys_kernel<KeyT><<<num_blocks, kThreads, 0, stream>>>(
                triangles.data(), starts.data(), num_faces, block_offsets.data(), codec, keys.data(), num_hits);
            SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
        }
        // Freed in stream order, after the launch that reads them.
        triangles = Buffer<MeshTriangle>();
        starts = Buffer<int64_t>();
        return canonical_topology(keys, codec, batch_size, box, false, ctx);
    });
}

}  // namespace sparsegrid::detail
