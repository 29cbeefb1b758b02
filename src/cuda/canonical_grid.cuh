// Building blocks of the CUDA topology operations: boxes folded on the device, the canonical grid of a
// set of candidate keys (radix sort + unique, or a bitmap over the key space), and order-preserving
// compaction (flags, exclusive scan, gathered member offsets). Shared by the topology, selection and
// mesh code; the non-template parts are defined in canonical_grid.cu.
#pragma once

#include "core/storage.h"
#include "cuda/cuda_common.cuh"

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <climits>
#include <functional>

namespace sparsegrid::detail::cuda {

// ---- boxes --------------------------------------------------------------------------------------------

/// Sets box[0..6) to the empty fold (lo = INT32_MAX, hi = INT32_MIN) and *flag to 0: one launch.
void init_box(int32_t* box, int32_t* flag, cudaStream_t stream);

/// Per-block min/max of coordinates folded into a global box with atomics (box = lo[3], hi[3]); min and
/// max do not depend on the order of the atomics. Every thread of the block must call it (barriers).
__device__ __forceinline__ void fold_box(int32_t* box, const int32_t v[3], bool valid) {
    __shared__ int32_t shared_box[6];
    if (threadIdx.x < 3) {
        shared_box[threadIdx.x] = INT32_MAX;
        shared_box[3 + threadIdx.x] = INT32_MIN;
    }
    __syncthreads();
    if (valid)
        for (int a = 0; a < 3; ++a) {
            atomicMin(&shared_box[a], v[a]);
            atomicMax(&shared_box[3 + a], v[a]);
        }
    __syncthreads();
    if (threadIdx.x < 3) {
        if (shared_box[threadIdx.x] != INT32_MAX) atomicMin(&box[threadIdx.x], shared_box[threadIdx.x]);
        if (shared_box[3 + threadIdx.x] != INT32_MIN) atomicMax(&box[3 + threadIdx.x], shared_box[3 + threadIdx.x]);
    }
}

// ---- the canonical grid of candidate keys -------------------------------------------------------------

/// The second half of building a grid whose size is read back: given the readback after its wait(), it
/// allocates the grid and decodes it. The first halves (begin_*) only enqueue work and readback
/// requests, so that several grids share one wait: one host synchronisation for all of them.
using FinishTopology = std::function<GridTopology(const Readback&)>;

/// Sorts candidate keys (all-ones sentinels last), removes duplicates and decodes them into a grid of
/// `batch_size` members; `keys` is released. `box` is the box of the result when `box_exact`;
/// otherwise only a cover (it sizes the codec), and the exact box is computed from the keys.
/// Cost: a radix sort and a unique of the keys, 2-3 launches of its own, 1 sync (the member offsets
/// and the box). Defined for KeyT = uint64_t and Key128.
template <typename KeyT>
GridTopology canonical_topology(Buffer<KeyT>& keys, const KeyCodec& codec, int64_t batch_size, const CoordBox& box,
                                bool box_exact, const Context& ctx);
/// canonical_topology up to its readback (requests enqueued on `readback`).
template <typename KeyT>
FinishTopology begin_canonical_topology(Buffer<KeyT>& keys, const KeyCodec& codec, int64_t batch_size,
                                        const CoordBox& box, bool box_exact, Readback& readback, const Context& ctx);

/// Words of the bitmap per chunk of its per-chunk popcounts.
constexpr int64_t kChunkWords = 8;

/// Reads a bitmap over the key space (at least kChunkWords words) out in key order: per-chunk popcounts,
/// one scan, offsets of the member boundaries, one sync, then every set bit decoded at its rank. `box`
/// must be exact.
GridTopology canonical_from_bitmap(Buffer<unsigned long long> words, const KeyCodec& codec, int64_t batch_size,
                                   const CoordBox& box, const Context& ctx);
/// canonical_from_bitmap up to its readback (requests enqueued on `readback`).
FinishTopology begin_canonical_from_bitmap(Buffer<unsigned long long> words, const KeyCodec& codec, int64_t batch_size,
                                           const CoordBox& box, Readback& readback, const Context& ctx);

/// Several grids' bitmaps side by side in one buffer, read out together: bitmap i holds words
/// [first_word[i], first_word[i + 1]) (a whole number of chunks) over the key space of codec[i]. The
/// pointers are the read-out's own.
constexpr int32_t kMaxBitmaps = 16;
struct BitmapBatch {
    int32_t count = 0;
    int64_t first_word[kMaxBitmaps + 1] = {};
    KeyCodec codec[kMaxBitmaps];
    int64_t* offsets[kMaxBitmaps] = {};
    int32_t* ijk[kMaxBitmaps] = {};
};

/// The second halves of several grids built together (see FinishTopology).
using FinishTopologies = std::function<std::vector<GridTopology>(const Readback&)>;

/// begin_canonical_from_bitmap for the bitmaps of `batch` (grid i with box boxes[i]) at once: the same
/// launches as for one bitmap (popcounts, one scan, the member offsets, and after the readback one
/// read-out), whatever the number of grids. Fewer than 2^31 bits in all (ranks are int32).
FinishTopologies begin_canonical_from_bitmaps(Buffer<unsigned long long> words, BitmapBatch batch, int64_t batch_size,
                                              const std::vector<CoordBox>& boxes, Readback& readback,
                                              const Context& ctx);

/// Where candidate keys go: into fixed slots of a key array (sorted afterwards; unused slots get the
/// sentinel), or into a bitmap over the whole key space (read out in key order afterwards).
template <typename KeyT>
struct SlotSink {
    KeyT* keys;
    __device__ __forceinline__ void put(int64_t slot, KeyT key) const { keys[slot] = key; }
    __device__ __forceinline__ void pad(int64_t slot) const { keys[slot] = ~KeyT(0); }
};

struct BitmapSink {
    unsigned long long* words;
    __device__ __forceinline__ void put(int64_t, uint64_t key) const {
        unsigned long long* word = words + (key >> 6);
        const unsigned long long bit = 1ull << (key & 63);
        // Most candidates repeat a neighbour's: a plain read skips most of the atomics.
        if (!(*word & bit)) atomicOr(word, bit);
    }
    __device__ __forceinline__ void pad(int64_t) const {}
};

/// A dense bitmap over the codec's whole key space replaces the sort when that space is small next to
/// the candidates (up to 2^31 bits): writing bits and reading them out in order costs a few passes
/// over the bitmap, where a radix sort costs several over every candidate.
inline bool use_bitmap(const KeyCodec& codec, int64_t candidates, bool box_exact) {
    if (!box_exact || codec.total_bits() > 31) return false;
    return (int64_t{1} << codec.total_bits()) <= 64 * std::max<int64_t>(candidates, int64_t{1} << 20);
}

/// Words of the bitmap over the codec's whole key space (at least one chunk).
inline int64_t bitmap_words(const KeyCodec& codec) {
    return std::max<int64_t>(kChunkWords, (int64_t{1} << codec.total_bits()) / 64);
}

/// Builds a generated grid from candidates up to its readback: launch(key_tag, sink) emits `slots`
/// candidates into the sink, either fixed key slots (then sorted) or the bitmap.
template <typename Launch>
FinishTopology begin_generate_grid(const GridStorage& grid, const KeyCodec& codec, int64_t slots, const CoordBox& box,
                                   bool box_exact, Readback& readback, Launch&& launch) {
    const Context& ctx = grid.context;
    if (use_bitmap(codec, slots, box_exact)) {
        const int64_t num_words = bitmap_words(codec);
        Buffer<unsigned long long> words = Buffer<unsigned long long>::allocate(num_words, ctx);
        CudaBackend::fill_bytes(words.data(), ctx.device, 0,
                                static_cast<size_t>(num_words) * sizeof(unsigned long long), ctx.stream);
        if (slots > 0) launch(uint64_t{}, BitmapSink{words.data()});
        return begin_canonical_from_bitmap(std::move(words), codec, grid.batch_size(), box, readback, ctx);
    }
    return with_key_type(codec, [&](auto key_tag) {
        using KeyT = decltype(key_tag);
        Buffer<KeyT> keys = Buffer<KeyT>::allocate(slots, ctx);
        if (slots > 0) launch(key_tag, SlotSink<KeyT>{keys.data()});
        return begin_canonical_topology(keys, codec, grid.batch_size(), box, box_exact, readback, ctx);
    });
}

/// Builds a generated grid from candidates (begin_generate_grid), with its own readback: one sync.
template <typename Launch>
GridTopology generate_grid(const GridStorage& grid, const KeyCodec& codec, int64_t slots, const CoordBox& box,
                           bool box_exact, Launch&& launch) {
    Readback readback(grid.context);
    const FinishTopology finish = begin_generate_grid(grid, codec, slots, box, box_exact, readback,
                                                      std::forward<Launch>(launch));
    readback.wait();
    return finish(readback);
}

// ---- order-preserving compaction ----------------------------------------------------------------------

/// Exclusive scan of `entries` values (flags or counts, the last 0) into `position`.
template <typename IndexT>
void exclusive_scan(const IndexT* flags, IndexT* position, int64_t entries, const Context& ctx) {
    cub_call(ctx, [&](void* temp, size_t& bytes) {
        return cub::DeviceScan::ExclusiveSum(temp, bytes, flags, position, entries, stream_of(ctx));
    });
}

/// Gathers offsets[m] = position[in_offsets[m]].
template <typename IndexT>
__global__ void gather_offsets_kernel(const IndexT* position, const int64_t* in_offsets, int64_t entries,
                                      int64_t* out) {
    SG_GRID_STRIDE_LOOP(m, entries) { out[m] = position[in_offsets[m]]; }
}

/// out[n] = fn(n) for n in [0, count).
template <typename IndexT, typename Fn>
__global__ void tabulate_kernel(Fn fn, int64_t count, IndexT* out) {
    SG_GRID_STRIDE_LOOP(n, count) { out[n] = fn(n); }
}

/// Exclusive scan of count + 1 keep flags (the last flag 0) into `position`, then the kept voxels' member
/// offsets gathered by a launch of their own (out_offsets[m] = position at in_offsets[m], batch_size + 1
/// entries).
template <typename IndexT>
void scan_positions_and_offsets(const IndexT* flags, IndexT* position, int64_t count, const int64_t* in_offsets,
                                int64_t batch_size, int64_t* out_offsets, const Context& ctx) {
    const cudaStream_t stream = stream_of(ctx);
    exclusive_scan(flags, position, count + 1, ctx);
    gather_offsets_kernel<<<blocks_for(batch_size + 1), kThreads, 0, stream>>>(position, in_offsets, batch_size + 1,
                                                                               out_offsets);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

/// The same for flags given as flag(n), n in [0, count] (flag(count) = 0), stored first by a launch of
/// their own.
template <typename IndexT, typename Flag>
void scan_flag_function(const Flag& flag, IndexT* position, int64_t count, const int64_t* in_offsets,
                        int64_t batch_size, int64_t* out_offsets, const Context& ctx) {
    Buffer<IndexT> flags = Buffer<IndexT>::allocate(count + 1, ctx);
    tabulate_kernel<<<blocks_for(count + 1), kThreads, 0, stream_of(ctx)>>>(flag, count + 1, flags.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(ctx));
    scan_positions_and_offsets(flags.data(), position, count, in_offsets, batch_size, out_offsets, ctx);
}

}  // namespace sparsegrid::detail::cuda
