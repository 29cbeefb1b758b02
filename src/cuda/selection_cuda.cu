// CUDA backend of the operations that select from a grid without changing coordinates: pruned_grid (a
// mask), clipped_grid (a box per member) and bbox (each member's bounds). Selection keeps voxel order:
// flags, an exclusive scan, a scatter to the scanned positions, with the box of the kept voxels folded
// while flagging; one sync (the member offsets and that box). bbox is a reduction by member, no sync.
#include "backend/backend.h"
#include "cuda/canonical_grid.cuh"
#include "cuda/cuda_common.cuh"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>

namespace sparsegrid::detail::cuda {

namespace {

// ---- what is kept ---------------------------------------------------------------------------------

/// pruned_grid: voxel n is kept when its mask byte is nonzero.
struct MaskKeep {
    const uint8_t* mask;
    __device__ __forceinline__ bool operator()(int64_t n) const { return mask[n] != 0; }
};

/// clipped_grid: voxel n of member m is kept when boxes[6m + a] <= ijk[a] <= boxes[6m + 3 + a] on every
/// axis (an inverted box keeps nothing).
struct BoxKeep {
    const int32_t* ijk;
    const int32_t* boxes;
    const int64_t* offsets;
    int64_t batch_size;
    __device__ __forceinline__ bool operator()(int64_t n) const {
        const int32_t* box = boxes + 6 * member_of(offsets, batch_size, n);
        for (int a = 0; a < 3; ++a)
            if (ijk[3 * n + a] < box[a] || ijk[3 * n + a] > box[3 + a]) return false;
        return true;
    }
};

// ---- kernels --------------------------------------------------------------------------------------

/// flags[n] = keep(n) for n < count, flags[count] = 0 (so the scan ends with the total), with the box of
/// the kept voxels folded into `box`.
template <typename IndexT, typename Keep>
__global__ void select_flags_kernel(const int32_t* ijk, Keep keep, int64_t count, IndexT* flags, int32_t* box) {
    for (int64_t base = int64_t{blockIdx.x} * blockDim.x; base <= count; base += int64_t{blockDim.x} * gridDim.x) {
        const int64_t n = base + threadIdx.x;
        const bool kept = n < count && keep(n);
        if (n <= count) flags[n] = kept;
        int32_t v[3] = {0, 0, 0};
        if (kept)
            for (int a = 0; a < 3; ++a) v[a] = ijk[3 * n + a];
        fold_box(box, v, kept);
    }
}

/// Kept voxel n goes to position[n]; with `kept_index`, so does its index n.
template <typename IndexT, typename Keep>
__global__ void select_scatter_kernel(const int32_t* ijk, Keep keep, const IndexT* position, int64_t count,
                                      int32_t* out, int64_t* kept_index) {
    SG_GRID_STRIDE_LOOP(n, count) {
        if (!keep(n)) continue;
        for (int a = 0; a < 3; ++a) out[3 * static_cast<int64_t>(position[n]) + a] = ijk[3 * n + a];
        if (kept_index) kept_index[position[n]] = n;
    }
}

/// The bounds of a set of voxels (lo, hi inclusive per axis), and their union for the reduction by member.
struct VoxelBox {
    int32_t lo[3], hi[3];
};

struct BoxUnion {
    __device__ __forceinline__ VoxelBox operator()(const VoxelBox& a, const VoxelBox& b) const {
        VoxelBox out;
        for (int axis = 0; axis < 3; ++axis) {
            out.lo[axis] = a.lo[axis] < b.lo[axis] ? a.lo[axis] : b.lo[axis];
            out.hi[axis] = a.hi[axis] > b.hi[axis] ? a.hi[axis] : b.hi[axis];
        }
        return out;
    }
};

/// A run of voxels of one member: the member (negative or >= batch size: no run) and its box so far.
struct MemberRun {
    int64_t member;
    VoxelBox box;
};

/// The reduce-by-key operator over runs in member order: b continues a's run when their members agree.
/// Associative because each member's voxels are contiguous.
struct ExtendRun {
    __device__ __forceinline__ MemberRun operator()(const MemberRun& a, const MemberRun& b) const {
        if (a.member != b.member) return b;
        return MemberRun{b.member, BoxUnion{}(a.box, b.box)};
    }
};

/// boxes[6m .. 6m + 6): the empty fold (INT32_MAX x 3, INT32_MIN x 3) for a member with voxels, which
/// fold_member_boxes_kernel then narrows; the final (0, 0, 0, -1, -1, -1) for an empty member.
__global__ void init_member_boxes_kernel(const int64_t* offsets, int64_t batch_size, int32_t* boxes) {
    SG_GRID_STRIDE_LOOP(i, 6 * batch_size) {
        const int64_t member = i / 6;
        const bool lower = i - 6 * member < 3;
        const bool empty = offsets[member + 1] == offsets[member];
        boxes[i] = empty ? (lower ? 0 : -1) : (lower ? INT32_MAX : INT32_MIN);
    }
}

__device__ __forceinline__ void flush_run(int32_t* boxes, int64_t batch_size, const MemberRun& run) {
    if (run.member < 0 || run.member >= batch_size) return;
    for (int a = 0; a < 3; ++a) {
        atomicMin(&boxes[6 * run.member + a], run.box.lo[a]);
        atomicMax(&boxes[6 * run.member + 3 + a], run.box.hi[a]);
    }
}

/// Folds every voxel into its member's row of `boxes`. Block b takes a contiguous slice of the voxels in
/// rounds of kThreads: a block scan reducing by member gives the box of each member's run in the round,
/// and a carry extends the round's last run into the next; a round entirely in the carried run skips the
/// scan, each thread folding its voxel in registers (reduced into the carry before the run ends). Every
/// run is flushed once, with atomicMin / atomicMax (exact in any order), so a block flushes once per
/// member it meets (plus one), and the result does not depend on how the voxels fall into blocks.
__global__ void __launch_bounds__(kThreads)
    fold_member_boxes_kernel(const int32_t* ijk, const int64_t* offsets, int64_t batch_size, int64_t count,
                             int32_t* boxes) {
    using BlockScan = cub::BlockScan<MemberRun, kThreads>;
    using BlockReduce = cub::BlockReduce<VoxelBox, kThreads>;
    __shared__ typename BlockScan::TempStorage scan_storage;
    __shared__ typename BlockReduce::TempStorage reduce_storage;
    __shared__ int64_t round_member[kThreads];
    __shared__ MemberRun carry;
    const VoxelBox empty{{INT32_MAX, INT32_MAX, INT32_MAX}, {INT32_MIN, INT32_MIN, INT32_MIN}};
    const int64_t per_block = (count + gridDim.x - 1) / gridDim.x;
    const int64_t begin = min(count, per_block * blockIdx.x);
    const int64_t end = min(count, begin + per_block);
    VoxelBox own = empty;   // this thread's voxels of the carried run since the last scan
    bool own_used = false;  // the same in every thread of the block
    if (threadIdx.x == 0) carry.member = -1;
    __syncthreads();
    for (int64_t base = begin; base < end; base += kThreads) {
        const int64_t n = base + threadIdx.x;
        MemberRun run;
        // Past the slice: a member after every member (never flushed).
        run.member = n < end ? member_of(offsets, batch_size, n) : INT64_MAX;
        for (int a = 0; a < 3; ++a) run.box.lo[a] = run.box.hi[a] = n < end ? ijk[3 * n + a] : 0;
        if (__syncthreads_and(run.member == carry.member)) {
            own = BoxUnion{}(own, run.box);
            own_used = true;
            continue;
        }
        if (own_used) {
            const VoxelBox share = BlockReduce(reduce_storage).Reduce(own, BoxUnion{});
            if (threadIdx.x == 0) carry.box = BoxUnion{}(carry.box, share);
            own = empty;
            own_used = false;
        }
        round_member[threadIdx.x] = run.member;
        // The carried run goes on here, or ended with the last round.
        if (threadIdx.x == 0 && carry.member == run.member) run = ExtendRun{}(carry, run);
        if (threadIdx.x == 0 && carry.member != run.member) flush_run(boxes, batch_size, carry);
        BlockScan(scan_storage).InclusiveScan(run, run, ExtendRun{});
        __syncthreads();  // round_member is complete
        // A run ends at a thread whose successor has another member; the round's last run may go on.
        const bool last = threadIdx.x == kThreads - 1;
        if (last) carry = run;
        if (!last && round_member[threadIdx.x + 1] != run.member) flush_run(boxes, batch_size, run);
        __syncthreads();  // carry is written; scan_storage and round_member are reused
    }
    if (own_used) {
        const VoxelBox share = BlockReduce(reduce_storage).Reduce(own, BoxUnion{});
        if (threadIdx.x == 0) carry.box = BoxUnion{}(carry.box, share);
    }
    if (threadIdx.x == 0) flush_run(boxes, batch_size, carry);
}

// ---- host side ------------------------------------------------------------------------------------

/// The voxels for which keep(n) holds, in order, with the exact box of the kept voxels (empty when none
/// is) and, with `kept_index`, their indices in `grid`. Flags and positions of IndexT: int32 while the
/// grid has fewer than 2^31 voxels (half the memory of int64). 5 launches (box, flags, the scan's two, the
/// offsets), 1 sync, 1 launch (the kept voxels).
template <typename IndexT, typename Keep>
GridTopology select_voxels_impl(const GridStorage& grid, const Keep& keep, Buffer<int64_t>* kept_index) {
    const Context& ctx = grid.context;
    const cudaStream_t stream = stream_of(ctx);
    const int64_t n = grid.num_voxels();
    const int64_t batch_size = grid.batch_size();
    Buffer<IndexT> flags = Buffer<IndexT>::allocate(n + 1, ctx);
    Buffer<IndexT> position = Buffer<IndexT>::allocate(n + 1, ctx);
    Buffer<int32_t> box_flag = Buffer<int32_t>::allocate(7, ctx);
    init_box(box_flag.data(), box_flag.data() + 6, stream);
    select_flags_kernel<<<blocks_for(n + 1), kThreads, 0, stream>>>(grid.topology.ijk.data(), keep, n, flags.data(),
                                                                    box_flag.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    GridTopology topology;
    topology.offsets_buffer = Buffer<int64_t>::allocate(batch_size + 1, ctx);
    scan_positions_and_offsets(flags.data(), position.data(), n, grid.topology.offsets_buffer.data(), batch_size,
                               topology.offsets_buffer.data(), ctx);
    Readback readback(ctx);
    const size_t offsets_slot = readback.enqueue(topology.offsets_buffer.data(), batch_size + 1);
    const size_t box_slot = readback.enqueue(box_flag.data(), 6);
    readback.wait();
    topology.offsets = readback.get<int64_t>(offsets_slot, batch_size + 1);
    const int64_t kept = topology.offsets.back();
    if (kept > 0) {
        const std::vector<int32_t> box = readback.get<int32_t>(box_slot, 6);
        topology.box.lo = {box[0], box[1], box[2]};
        topology.box.hi = {box[3], box[4], box[5]};
    }
    topology.ijk = Buffer<int32_t>::allocate(3 * kept, ctx);
    if (kept_index) *kept_index = Buffer<int64_t>::allocate(kept, ctx);
    if (n > 0) {
        select_scatter_kernel<<<blocks_for(n), kThreads, 0, stream>>>(grid.topology.ijk.data(), keep, position.data(),
                                                                      n, topology.ijk.data(),
                                                                      kept_index ? kept_index->data() : nullptr);
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    return topology;
}

template <typename Keep>
GridTopology select_voxels(const GridStorage& grid, const Keep& keep, Buffer<int64_t>* kept_index) {
    DeviceGuard guard(grid.context);
    if (grid.num_voxels() < INT32_MAX) return select_voxels_impl<int32_t>(grid, keep, kept_index);
    return select_voxels_impl<int64_t>(grid, keep, kept_index);
}

/// Blocks of fold_member_boxes_kernel: enough to fill the device (8 blocks of kThreads per
/// multiprocessor), no more, so that each block's slice is long and few runs are flushed.
unsigned fold_blocks(int64_t count, const Context& ctx) {
    int multiprocessors = 0;
    SPARSEGRID_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, ctx.device.index));
    constexpr unsigned kBlocksPerMultiprocessor = 8;
    return std::min(blocks_for(count), static_cast<unsigned>(std::max(1, multiprocessors)) * kBlocksPerMultiprocessor);
}

}  // namespace

}  // namespace sparsegrid::detail::cuda

// ---- backend entry points -------------------------------------------------------------------------

namespace sparsegrid::detail {

using namespace cuda;

GridTopology CudaBackend::pruned_grid(const GridStorage& grid, const uint8_t* mask, Buffer<int64_t>* kept_index) {
    return select_voxels(grid, MaskKeep{mask}, kept_index);
}

GridTopology CudaBackend::clipped_grid(const GridStorage& grid, const int32_t* boxes, Buffer<int64_t>* kept_index) {
    const BoxKeep keep{grid.topology.ijk.data(), boxes, grid.topology.offsets_buffer.data(), grid.batch_size()};
    return select_voxels(grid, keep, kept_index);
}

// Two launches, no sync.
Buffer<int32_t> CudaBackend::bbox(const GridStorage& grid) {
    const Context& ctx = grid.context;
    DeviceGuard guard(ctx);
    const cudaStream_t stream = stream_of(ctx);
    const int64_t batch_size = grid.batch_size();
    const int64_t count = grid.num_voxels();
    const int64_t* offsets = grid.topology.offsets_buffer.data();
    Buffer<int32_t> boxes = Buffer<int32_t>::allocate(6 * batch_size, ctx);
    init_member_boxes_kernel<<<blocks_for(6 * batch_size), kThreads, 0, stream>>>(offsets, batch_size, boxes.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    if (count > 0) {
        fold_member_boxes_kernel<<<fold_blocks(count, ctx), kThreads, 0, stream>>>(grid.topology.ijk.data(), offsets,
                                                                                   batch_size, count, boxes.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    return boxes;
}

}  // namespace sparsegrid::detail
