// CUDA backend of the topology operations that generate grids: from world points, convolution grids,
// coarsening, refinement and merging. The same algorithms as the CPU backend, over the whole batch in a
// few launches. Output sizes the host can compute (subdivision by 2^p) cost no sync; every
// data-dependent size costs exactly one, a single pinned readback of the member offsets (and of the
// box where it is data dependent). The front end picks the order-preserving paths for factors 2^p
// (coarsened_by_power_of_two / refined_by_power_of_two) and checks every candidate count for int64.
#include "backend/backend.h"
#include "core/geometry.h"
#include "cuda/canonical_grid.cuh"
#include "cuda/cuda_common.cuh"
#include "cuda/grid_keys.cuh"

#include <climits>

namespace sparsegrid::detail::cuda {

// ---- kernels --------------------------------------------------------------------------------------

namespace {

/// The conv_grid candidates of fine voxel x (coordinates of `member`) into slots first .. first +
/// per_voxel - 1 of `sink`, the unused ones padded. A voxel whose box is that of its predecessor
/// `previous` (same member; null for a member's first voxel) leaves all its slots to the padding: the
/// predecessor emits the same keys. Only with a stride of at least 2 on every axis can the boxes of two
/// distinct voxels agree; at a coarse output most fine voxels share their predecessor's box (voxel
/// order keeps the voxels of a coarse cell together), and a bitmap sink would otherwise see them all
/// write the same few words at once.
template <typename KeyT, typename Sink>
__device__ __forceinline__ void emit_conv_grid_candidates(const ConvGeometry& g, const KeyCodec& codec, int64_t member,
                                                          const int32_t x[3], const int32_t* previous, Sink sink,
                                                          int64_t first, int32_t per_voxel) {
    int64_t lo[3], hi[3];
    for (int a = 0; a < 3; ++a) g.coarse_range(a, x[a], &lo[a], &hi[a]);
    bool repeated = previous != nullptr && g.stride[0] >= 2 && g.stride[1] >= 2 && g.stride[2] >= 2;
    for (int a = 0; a < 3 && repeated; ++a) {
        int64_t previous_lo, previous_hi;
        g.coarse_range(a, previous[a], &previous_lo, &previous_hi);
        repeated = previous_lo == lo[a] && previous_hi == hi[a];
    }
    int32_t written = 0;
    if (!repeated)
        for (int64_t c0 = lo[0]; c0 <= hi[0]; ++c0)
            for (int64_t c1 = lo[1]; c1 <= hi[1]; ++c1)
                for (int64_t c2 = lo[2]; c2 <= hi[2]; ++c2)
                    sink.put(first + written++,
                             encode_key<KeyT>(codec, member, static_cast<int32_t>(c0), static_cast<int32_t>(c1),
                                              static_cast<int32_t>(c2)));
    for (; written < per_voxel; ++written) sink.pad(first + written);
}

/// conv_grid candidates: each fine voxel emits the coarse coordinates of its box into `per_voxel`
/// fixed slots (emit_conv_grid_candidates).
template <typename KeyT, typename Sink>
__global__ void conv_grid_candidates_kernel(const int32_t* ijk, const int64_t* offsets, int64_t batch_size,
                                            int64_t count, ConvGeometry g, int32_t per_voxel, KeyCodec codec,
                                            Sink sink) {
    SG_GRID_STRIDE_LOOP(n, count) {
        const int64_t member = member_of(offsets, batch_size, n);
        emit_conv_grid_candidates<KeyT>(g, codec, member, ijk + 3 * n,
                                        n > offsets[member] ? ijk + 3 * (n - 1) : nullptr, sink, n * per_voxel,
                                        per_voxel);
    }
}

/// Several conv_grids of one grid into bitmaps side by side (begin_conv_grids_in_bitmaps).
struct ConvGridsInBitmaps {
    int32_t count;
    ConvGeometry g[kMaxBitmaps];
    KeyCodec codec[kMaxBitmaps];
    unsigned long long* words[kMaxBitmaps];
};

/// conv_grid candidates of every grid of `grids`: one thread per (grid, fine voxel), grid-major, so that
/// a warp shares its geometry and reads consecutive voxels.
__global__ void conv_grids_candidates_kernel(const int32_t* ijk, const int64_t* offsets, int64_t batch_size,
                                             int64_t count, ConvGridsInBitmaps grids) {
    SG_GRID_STRIDE_LOOP(e, grids.count * count) {
        const int64_t i = divide(e, count);
        const int64_t n = e - i * count;
        const int64_t member = member_of(offsets, batch_size, n);
        emit_conv_grid_candidates<uint64_t>(grids.g[i], grids.codec[i], member, ijk + 3 * n,
                                            n > offsets[member] ? ijk + 3 * (n - 1) : nullptr,
                                            BitmapSink{grids.words[i]}, 0, 0);
    }
}

/// conv_transpose_grid candidates: one key per (coarse voxel, tap).
template <typename KeyT, typename Sink>
__global__ void conv_transpose_candidates_kernel(const int32_t* ijk, const int64_t* offsets, int64_t batch_size,
                                                 int64_t count, ConvGeometry g, KeyCodec codec, Sink sink) {
    const int32_t volume = g.kernel_volume();
    SG_GRID_STRIDE_LOOP(slot, count * volume) {
        const int64_t n = divide(slot, volume);
        int32_t tap[3];
        g.tap_of(static_cast<int32_t>(slot - n * volume), tap);
        sink.put(slot,
                 encode_key<KeyT>(codec, member_of(offsets, batch_size, n),
                                  static_cast<int32_t>(g.fine_of(0, ijk[3 * n], tap[0])),
                                  static_cast<int32_t>(g.fine_of(1, ijk[3 * n + 1], tap[1])),
                                  static_cast<int32_t>(g.fine_of(2, ijk[3 * n + 2], tap[2]))));
    }
}

/// Keys of floor(ijk / factor) (general coarsening).
template <typename KeyT, typename Sink>
__global__ void coarsen_candidates_kernel(const int32_t* ijk, const int64_t* offsets, int64_t batch_size, int64_t count,
                                          int3 factor, KeyCodec codec, Sink sink) {
    SG_GRID_STRIDE_LOOP(n, count) {
        sink.put(n,
                 encode_key<KeyT>(codec, member_of(offsets, batch_size, n),
                                  static_cast<int32_t>(floor_div(ijk[3 * n], factor.x)),
                                  static_cast<int32_t>(floor_div(ijk[3 * n + 1], factor.y)),
                                  static_cast<int32_t>(floor_div(ijk[3 * n + 2], factor.z))));
    }
}

/// Keys of the f-blocks of every voxel (general refinement).
template <typename KeyT, typename Sink>
__global__ void refine_candidates_kernel(const int32_t* ijk, const int64_t* offsets, int64_t batch_size, int64_t count,
                                         int3 factor, KeyCodec codec, Sink sink) {
    const int64_t children = int64_t{factor.x} * factor.y * factor.z;
    SG_GRID_STRIDE_LOOP(slot, count * children) {
        const int64_t n = slot / children;
        const int64_t r = slot - n * children;
        const int32_t a2 = static_cast<int32_t>(r % factor.z);
        const int32_t a1 = static_cast<int32_t>((r / factor.z) % factor.y);
        const int32_t a0 = static_cast<int32_t>(r / (int64_t{factor.y} * factor.z));
        sink.put(slot,
                 encode_key<KeyT>(codec, member_of(offsets, batch_size, n), factor.x * ijk[3 * n] + a0,
                                  factor.y * ijk[3 * n + 1] + a1, factor.z * ijk[3 * n + 2] + a2));
    }
}

/// Subdivision by 2^p on every axis, children written in voxel order (see the CPU backend).
__global__ void subdivide_kernel(const int32_t* ijk, int64_t count, int32_t log2_factor, int32_t* out) {
    const int32_t child_bits = 3 * log2_factor;
    SG_GRID_STRIDE_LOOP(slot, count << child_bits) {
        const int64_t n = slot >> child_bits;
        const uint64_t code = static_cast<uint64_t>(slot & ((int64_t{1} << child_bits) - 1));
        out[3 * slot] = (ijk[3 * n] << log2_factor) + static_cast<int32_t>(compact_bits3(code >> 2));
        out[3 * slot + 1] = (ijk[3 * n + 1] << log2_factor) + static_cast<int32_t>(compact_bits3(code >> 1));
        out[3 * slot + 2] = (ijk[3 * n + 2] << log2_factor) + static_cast<int32_t>(compact_bits3(code));
    }
}

__global__ void scale_offsets_kernel(const int64_t* in, int64_t entries, int64_t factor, int64_t* out) {
    SG_GRID_STRIDE_LOOP(m, entries) { out[m] = in[m] * factor; }
}

/// 1 when voxel n begins a new parent under coarsening by 2^p (first of its member, or a parent
/// different from the previous voxel's), 0 otherwise and at n = count, so that the scan of these flags
/// ends with the total.
template <typename IndexT>
struct CoarsenStart {
    const int32_t* ijk;
    const int64_t* offsets;
    int64_t batch_size;
    int64_t count;
    int32_t log2_factor;

    __device__ IndexT operator()(int64_t n) const {
        if (n == count) return 0;
        const int64_t member = member_of(offsets, batch_size, n);
        bool start = n == offsets[member];
        for (int a = 0; a < 3 && !start; ++a)
            start = (ijk[3 * n + a] >> log2_factor) != (ijk[3 * n - 3 + a] >> log2_factor);
        return start;
    }
};

/// Voxel n begins a parent exactly when the scan steps after it.
template <typename IndexT>
__global__ void coarsen_scatter_kernel(const int32_t* ijk, const IndexT* position, int64_t count, int32_t log2_factor,
                                       int32_t* out) {
    SG_GRID_STRIDE_LOOP(n, count) {
        const IndexT at = position[n];
        if (position[n + 1] == at) continue;
        for (int a = 0; a < 3; ++a) out[3 * static_cast<int64_t>(at) + a] = ijk[3 * n + a] >> log2_factor;
    }
}

/// ijk of world points (core/geometry.h's point_to_index); `bad` receives the smallest index of a point
/// that is not finite or leaves int32 (atomicMin: the smallest wins whatever the order).
__global__ void points_to_ijk_kernel(const double* xyz, const int64_t* offsets, int64_t batch_size, int64_t count,
                                     const double* transforms, int32_t* ijk, unsigned long long* bad) {
    SG_GRID_STRIDE_LOOP(n, count) {
        const int64_t member = member_of(offsets, batch_size, n);
        const double* t = transforms + 6 * member;  // voxel size (3), origin (3)
        for (int a = 0; a < 3; ++a) {
            const double index = point_to_index(xyz[3 * n + a], t[3 + a], t[a]);
            // NaN fails both comparisons, so it is caught here too.
            if (!index_in_int32(index)) {
                atomicMin(bad, static_cast<unsigned long long>(n));
                ijk[3 * n + a] = 0;
            } else {
                ijk[3 * n + a] = static_cast<int32_t>(index);
            }
        }
    }
}

// ---- order-preserving paths for factors 2^p -------------------------------------------------------

/// Subdivision by 2^p: the output size is known (the front end has checked it for int64), so nothing
/// waits.
GridTopology subdivide_sorted(const GridStorage& grid, int32_t log2_factor, const CoordBox& out_box) {
    const Context& ctx = grid.context;
    const cudaStream_t stream = stream_of(ctx);
    const int64_t children = int64_t{1} << (3 * log2_factor);
    const int64_t n = grid.num_voxels();
    GridTopology topology;
    topology.ijk = Buffer<int32_t>::allocate(3 * n * children, ctx);
    if (n > 0) {
        subdivide_kernel<<<blocks_for(n * children), kThreads, 0, stream>>>(grid.topology.ijk.data(), n, log2_factor,
                                                                            topology.ijk.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    const int64_t entries = grid.batch_size() + 1;
    topology.offsets_buffer = Buffer<int64_t>::allocate(entries, ctx);
    scale_offsets_kernel<<<blocks_for(entries), kThreads, 0, stream>>>(grid.topology.offsets_buffer.data(), entries,
                                                                       children, topology.offsets_buffer.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    topology.offsets.resize(static_cast<size_t>(entries));
    for (int64_t m = 0; m < entries; ++m) topology.offsets[m] = grid.topology.offsets[m] * children;
    topology.box = out_box;
    return topology;
}

/// Coarsening by 2^p of a grid in voxel order: parents are non-decreasing, so a scan of "new parent"
/// flags places them (scan_flag_function). One sync (offsets).
template <typename IndexT>
GridTopology coarsen_sorted_impl(const GridStorage& grid, int32_t log2_factor, const CoordBox& out_box) {
    const Context& ctx = grid.context;
    const cudaStream_t stream = stream_of(ctx);
    const int64_t n = grid.num_voxels();
    const int64_t batch_size = grid.batch_size();
    Buffer<IndexT> position = Buffer<IndexT>::allocate(n + 1, ctx);
    GridTopology topology;
    topology.offsets_buffer = Buffer<int64_t>::allocate(batch_size + 1, ctx);
    scan_flag_function(
        CoarsenStart<IndexT>{grid.topology.ijk.data(), grid.topology.offsets_buffer.data(), batch_size, n, log2_factor},
        position.data(), n, grid.topology.offsets_buffer.data(), batch_size, topology.offsets_buffer.data(), ctx);
    Readback readback(ctx);
    const size_t slot = readback.enqueue(topology.offsets_buffer.data(), batch_size + 1);
    readback.wait();
    topology.offsets = readback.get<int64_t>(slot, batch_size + 1);
    topology.ijk = Buffer<int32_t>::allocate(3 * topology.offsets.back(), ctx);
    if (n > 0) {
        coarsen_scatter_kernel<<<blocks_for(n), kThreads, 0, stream>>>(grid.topology.ijk.data(), position.data(), n,
                                                                       log2_factor, topology.ijk.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    topology.box = out_box;
    return topology;
}

/// Scans in int32 while the grid has fewer than 2^31 voxels (half the memory of int64).
GridTopology coarsen_sorted(const GridStorage& grid, int32_t log2_factor, const CoordBox& out_box) {
    if (grid.num_voxels() < INT32_MAX) return coarsen_sorted_impl<int32_t>(grid, log2_factor, out_box);
    return coarsen_sorted_impl<int64_t>(grid, log2_factor, out_box);
}

}  // namespace

}  // namespace sparsegrid::detail::cuda

// ---- backend entry points -------------------------------------------------------------------------

namespace sparsegrid::detail {

using namespace cuda;

Buffer<int32_t> CudaBackend::points_to_ijk(const double* xyz, const std::vector<int64_t>& offsets,
                                           const std::vector<MemberTransform>& transforms, int64_t* first_bad,
                                           const Context& ctx) {
    DeviceGuard guard(ctx);
    const cudaStream_t stream = stream_of(ctx);
    const int64_t batch_size = static_cast<int64_t>(offsets.size()) - 1;
    const int64_t count = offsets.back();
    std::vector<double> packed;
    packed.reserve(transforms.size() * 6);
    for (const MemberTransform& t : transforms) {
        packed.insert(packed.end(), t.voxel_size.begin(), t.voxel_size.end());
        packed.insert(packed.end(), t.origin.begin(), t.origin.end());
    }
    Buffer<double> transforms_buffer = Buffer<double>::from_host(packed, ctx);
    Buffer<int64_t> offsets_buffer = Buffer<int64_t>::from_host(offsets, ctx);
    Buffer<int32_t> ijk = Buffer<int32_t>::allocate(3 * count, ctx);
    Buffer<unsigned long long> bad = Buffer<unsigned long long>::allocate(1, ctx);
    CudaBackend::fill_bytes(bad.data(), ctx.device, 0xff, sizeof(unsigned long long), ctx.stream);
    if (count > 0) {
        points_to_ijk_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
            xyz, offsets_buffer.data(), batch_size, count, transforms_buffer.data(), ijk.data(), bad.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    Readback readback(ctx);
    const size_t slot = readback.enqueue(bad.data(), 1);
    readback.wait();
    const unsigned long long bad_point = readback.get<unsigned long long>(slot, 1)[0];
    *first_bad = bad_point == ~0ull ? -1 : static_cast<int64_t>(bad_point);
    return ijk;
}

namespace {

/// The candidates of conv_grid into `sink` (at most the kernel volume per voxel, an int32; the front
/// end has checked the product for int64).
template <typename KeyT, typename Sink>
void launch_conv_grid_candidates(const GridStorage& grid, const ConvGeometry& g, const KeyCodec& codec, Sink sink) {
    const int64_t n = grid.num_voxels();
    if (n == 0) return;
    conv_grid_candidates_kernel<KeyT><<<blocks_for(n), kThreads, 0, stream_of(grid.context)>>>(
        grid.topology.ijk.data(), grid.topology.offsets_buffer.data(), grid.batch_size(), n, g,
        static_cast<int32_t>(conv_grid_candidates_per_voxel(g)), codec, sink);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(grid.context));
}

/// The box is exact only when every fine voxel reaches a coarse voxel on every axis (K >= S).
bool conv_grid_box_exact(const ConvGeometry& g) {
    return g.kernel[0] >= g.stride[0] && g.kernel[1] >= g.stride[1] && g.kernel[2] >= g.stride[2];
}

/// conv_grid up to its readback (begin_generate_grid).
FinishTopology begin_conv_grid(const GridStorage& grid, const ConvGeometry& g, const CoordBox& out_box,
                               Readback& readback) {
    const KeyCodec codec = make_codec(out_box, grid.batch_size());
    const int64_t slots = grid.num_voxels() * conv_grid_candidates_per_voxel(g);
    return begin_generate_grid(
        grid, codec, slots, out_box, conv_grid_box_exact(g), readback,
        [&](auto key_tag, auto sink) { launch_conv_grid_candidates<decltype(key_tag)>(grid, g, codec, sink); });
}

/// Several conv_grids of one grid whose candidates all go to bitmaps, in one buffer read out together
/// (begin_canonical_from_bitmaps): a fill, one candidate launch and the read-out's launches for all of
/// them, where one at a time each grid takes a fill, a candidate launch and the read-out's. Returns null
/// where some grid would sort its candidates, or the bitmaps are too many or too large together.
FinishTopologies begin_conv_grids_in_bitmaps(const GridStorage& grid, const std::vector<ConvGeometry>& gs,
                                             const std::vector<CoordBox>& out_boxes, Readback& readback) {
    if (gs.size() > static_cast<size_t>(kMaxBitmaps)) return nullptr;
    BitmapBatch batch;
    batch.count = static_cast<int32_t>(gs.size());
    for (size_t i = 0; i < gs.size(); ++i) {
        const KeyCodec codec = make_codec(out_boxes[i], grid.batch_size());
        const int64_t slots = grid.num_voxels() * conv_grid_candidates_per_voxel(gs[i]);
        if (!use_bitmap(codec, slots, conv_grid_box_exact(gs[i]))) return nullptr;
        batch.codec[i] = codec;
        batch.first_word[i + 1] = batch.first_word[i] + bitmap_words(codec);
    }
    const int64_t num_words = batch.first_word[batch.count];
    if (num_words >= (int64_t{1} << 25)) return nullptr;  // the read-out ranks bits in int32: < 2^31 bits
    const Context& ctx = grid.context;
    Buffer<unsigned long long> words = Buffer<unsigned long long>::allocate(num_words, ctx);
    CudaBackend::fill_bytes(words.data(), ctx.device, 0, static_cast<size_t>(num_words) * sizeof(unsigned long long),
                            ctx.stream);
    ConvGridsInBitmaps grids{};
    grids.count = batch.count;
    for (int32_t i = 0; i < batch.count; ++i) {
        grids.g[i] = gs[static_cast<size_t>(i)];
        grids.codec[i] = batch.codec[i];
        grids.words[i] = words.data() + batch.first_word[i];
    }
    const int64_t n = grid.num_voxels();
    if (n > 0) {
        conv_grids_candidates_kernel<<<blocks_for(n * grids.count), kThreads, 0, stream_of(ctx)>>>(
            grid.topology.ijk.data(), grid.topology.offsets_buffer.data(), grid.batch_size(), n, grids);
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(ctx));
    }
    return begin_canonical_from_bitmaps(std::move(words), batch, grid.batch_size(), out_boxes, readback, ctx);
}

}  // namespace

GridTopology CudaBackend::conv_grid(const GridStorage& grid, const ConvGeometry& g, const CoordBox& out_box) {
    DeviceGuard guard(grid.context);
    Readback readback(grid.context);
    const FinishTopology finish = begin_conv_grid(grid, g, out_box, readback);
    readback.wait();
    return finish(readback);
}

std::vector<GridTopology> CudaBackend::conv_grids(const GridStorage& grid, const std::vector<ConvGeometry>& gs,
                                                  const std::vector<CoordBox>& out_boxes) {
    if (gs.empty()) return {};
    DeviceGuard guard(grid.context);
    Readback readback(grid.context);
    if (gs.size() > 1) {
        const FinishTopologies together = begin_conv_grids_in_bitmaps(grid, gs, out_boxes, readback);
        if (together) {
            readback.wait();  // the one sync
            return together(readback);
        }
    }
    std::vector<FinishTopology> finishing;
    finishing.reserve(gs.size());
    for (size_t i = 0; i < gs.size(); ++i) finishing.push_back(begin_conv_grid(grid, gs[i], out_boxes[i], readback));
    readback.wait();  // the one sync: every grid's member offsets (and boxes) at once
    std::vector<GridTopology> topologies;
    topologies.reserve(gs.size());
    for (const FinishTopology& finish : finishing) topologies.push_back(finish(readback));
    return topologies;
}

GridTopology CudaBackend::conv_transpose_grid(const GridStorage& grid, const ConvGeometry& g, const CoordBox& out_box) {
    DeviceGuard guard(grid.context);
    const KeyCodec codec = make_codec(out_box, grid.batch_size());
    const int64_t n = grid.num_voxels();
    const int64_t slots = n * g.kernel_volume();
    return generate_grid(grid, codec, slots, out_box, true, [&](auto key_tag, auto sink) {
        using KeyT = decltype(key_tag);
        conv_transpose_candidates_kernel<KeyT><<<blocks_for(slots), kThreads, 0, stream_of(grid.context)>>>(
            grid.topology.ijk.data(), grid.topology.offsets_buffer.data(), grid.batch_size(), n, g, codec, sink);
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(grid.context));
    });
}

GridTopology CudaBackend::coarsened_grid(const GridStorage& grid, const Vec3i& factor, const CoordBox& out_box) {
    DeviceGuard guard(grid.context);
    const KeyCodec codec = make_codec(out_box, grid.batch_size());
    const int64_t n = grid.num_voxels();
    return generate_grid(grid, codec, n, out_box, true, [&](auto key_tag, auto sink) {
        using KeyT = decltype(key_tag);
        coarsen_candidates_kernel<KeyT><<<blocks_for(n), kThreads, 0, stream_of(grid.context)>>>(
            grid.topology.ijk.data(), grid.topology.offsets_buffer.data(), grid.batch_size(), n,
            make_int3(factor[0], factor[1], factor[2]), codec, sink);
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(grid.context));
    });
}

GridTopology CudaBackend::refined_grid(const GridStorage& grid, const Vec3i& factor, const CoordBox& out_box) {
    DeviceGuard guard(grid.context);
    const KeyCodec codec = make_codec(out_box, grid.batch_size());
    const int64_t n = grid.num_voxels();
    const int64_t slots = n * (int64_t{factor[0]} * factor[1] * factor[2]);
    return generate_grid(grid, codec, slots, out_box, true, [&](auto key_tag, auto sink) {
        using KeyT = decltype(key_tag);
        refine_candidates_kernel<KeyT><<<blocks_for(slots), kThreads, 0, stream_of(grid.context)>>>(
            grid.topology.ijk.data(), grid.topology.offsets_buffer.data(), grid.batch_size(), n,
            make_int3(factor[0], factor[1], factor[2]), codec, sink);
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(grid.context));
    });
}

GridTopology CudaBackend::coarsened_by_power_of_two(const GridStorage& grid, int32_t log2_factor,
                                                    const CoordBox& out_box) {
    DeviceGuard guard(grid.context);
    return coarsen_sorted(grid, log2_factor, out_box);
}

GridTopology CudaBackend::refined_by_power_of_two(const GridStorage& grid, int32_t log2_factor,
                                                  const CoordBox& out_box) {
    DeviceGuard guard(grid.context);
    return subdivide_sorted(grid, log2_factor, out_box);
}

GridTopology CudaBackend::merged_grid(const GridStorage& a, const GridStorage& b, const CoordBox& out_box) {
    const Context& ctx = a.context;
    DeviceGuard guard(ctx);
    const KeyCodec codec = make_codec(out_box, a.batch_size());
    return with_key_type(codec, [&](auto key_tag) {
        using KeyT = decltype(key_tag);
        Buffer<KeyT> keys = Buffer<KeyT>::allocate(a.num_voxels() + b.num_voxels(), ctx);
        encode_grid_keys<KeyT>(a, codec, keys.data());
        encode_grid_keys<KeyT>(b, codec, keys.data() + a.num_voxels());
        return canonical_topology(keys, codec, a.batch_size(), out_box, true, ctx);
    });
}

}  // namespace sparsegrid::detail
