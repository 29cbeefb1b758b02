// CUDA backend of the topology operations: the same algorithms as the CPU backend, over the whole
// batch in a few launches. Output sizes the host can compute (subdivision) cost no sync; every
// data-dependent size costs exactly one, a single pinned readback of the member offsets (and of the
// box where it is data dependent).
#include "core/backend.h"
#include "core/checks.h"
#include "cuda/cuda_common.cuh"
#include "cuda/grid_keys.cuh"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>

#include <algorithm>
#include <climits>

namespace sparsegrid::detail::cuda {

// ---- kernels --------------------------------------------------------------------------------------

namespace {

/// Per-block min/max of coordinates folded into a global box with atomics (box = lo[3], hi[3]).
__device__ void fold_box(int32_t* box, const int32_t v[3], bool valid) {
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

__global__ void init_box_kernel(int32_t* box, int32_t* flag) {
    if (threadIdx.x < 3) {
        box[threadIdx.x] = INT32_MAX;
        box[3 + threadIdx.x] = INT32_MIN;
    }
    if (threadIdx.x == 0) *flag = 0;
}

/// Keys of arbitrary input coordinates with a codec chosen before the box is known; coordinates
/// outside the codec raise `overflow` (the caller retries with a wide key). Also folds the box.
template <typename KeyT>
__global__ void encode_input_kernel(const int32_t* ijk, const int64_t* offsets, int64_t batch_size, int64_t count,
                                    KeyCodec codec, KeyT* keys, int32_t* box, int32_t* overflow) {
    const int64_t half = int64_t{1} << (codec.coord_bits - 1);
    // Every thread of the block must reach fold_box's barriers, so the loop runs in lockstep rounds.
    for (int64_t base = int64_t{blockIdx.x} * blockDim.x; base < count; base += int64_t{blockDim.x} * gridDim.x) {
        const int64_t n = base + threadIdx.x;
        const bool valid = n < count;
        int32_t v[3] = {0, 0, 0};
        if (valid) {
            v[0] = ijk[3 * n];
            v[1] = ijk[3 * n + 1];
            v[2] = ijk[3 * n + 2];
            bool fits = true;
            for (int a = 0; a < 3; ++a) fits = fits && v[a] >= -half && v[a] < half;
            if (!fits) atomicOr(overflow, 1);
            keys[n] = fits ? encode_key<KeyT>(codec, member_of(offsets, batch_size, n), v[0], v[1], v[2]) : KeyT(0);
        }
        fold_box(box, v, valid);
    }
}

/// Box of the coordinates of every non-sentinel key (for generated grids whose box the host cannot
/// predict exactly).
template <typename KeyT>
__global__ void keys_box_kernel(const KeyT* keys, int64_t count, KeyCodec codec, int32_t* box) {
    for (int64_t base = int64_t{blockIdx.x} * blockDim.x; base < count; base += int64_t{blockDim.x} * gridDim.x) {
        const int64_t n = base + threadIdx.x;
        const bool valid = n < count && keys[n] != ~KeyT(0);
        int32_t v[3] = {0, 0, 0};
        if (valid) {
            const DecodedKey d = decode_key<KeyT>(codec, keys[n]);
            v[0] = d.ijk[0];
            v[1] = d.ijk[1];
            v[2] = d.ijk[2];
        }
        fold_box(box, v, valid);
    }
}

/// offsets[m] = first position of member m among `count` sorted unique keys (m = 0..B); sentinel
/// keys (all ones) sort after every member.
template <typename KeyT>
__global__ void member_offsets_kernel(const KeyT* keys, const int64_t* count, KeyCodec codec, int64_t batch_size,
                                      int64_t* offsets) {
    SG_GRID_STRIDE_LOOP(m, batch_size + 1) {
        const KeyT first = static_cast<KeyT>(static_cast<KeyT>(m) << codec.morton_bits());
        offsets[m] = lower_bound(keys, int64_t{0}, *count, first);
    }
}

template <typename KeyT>
__global__ void decode_kernel(const KeyT* keys, int64_t count, KeyCodec codec, int32_t* ijk) {
    SG_GRID_STRIDE_LOOP(n, count) {
        const DecodedKey d = decode_key<KeyT>(codec, keys[n]);
        ijk[3 * n] = d.ijk[0];
        ijk[3 * n + 1] = d.ijk[1];
        ijk[3 * n + 2] = d.ijk[2];
    }
}

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

/// conv_grid candidates: each fine voxel emits the coarse coordinates of its box into `per_voxel`
/// fixed slots.
template <typename KeyT, typename Sink>
__global__ void conv_grid_candidates_kernel(const int32_t* ijk, const int64_t* offsets, int64_t batch_size,
                                            int64_t count, ConvGeometry g, int32_t per_voxel, KeyCodec codec,
                                            Sink sink) {
    SG_GRID_STRIDE_LOOP(n, count) {
        const int64_t member = member_of(offsets, batch_size, n);
        int64_t lo[3], hi[3];
        for (int a = 0; a < 3; ++a) g.coarse_range(a, ijk[3 * n + a], &lo[a], &hi[a]);
        const int64_t first = n * per_voxel;
        int32_t written = 0;
        for (int64_t c0 = lo[0]; c0 <= hi[0]; ++c0)
            for (int64_t c1 = lo[1]; c1 <= hi[1]; ++c1)
                for (int64_t c2 = lo[2]; c2 <= hi[2]; ++c2)
                    sink.put(first + written++,
                             encode_key<KeyT>(codec, member, static_cast<int32_t>(c0), static_cast<int32_t>(c1),
                                              static_cast<int32_t>(c2)));
        for (; written < per_voxel; ++written) sink.pad(first + written);
    }
}

/// conv_transpose_grid candidates: one key per (coarse voxel, tap).
template <typename KeyT, typename Sink>
__global__ void conv_transpose_candidates_kernel(const int32_t* ijk, const int64_t* offsets, int64_t batch_size,
                                                 int64_t count, ConvGeometry g, KeyCodec codec, Sink sink) {
    const int32_t volume = g.kernel_volume();
    SG_GRID_STRIDE_LOOP(slot, count * volume) {
        const int64_t n = slot / volume;
        int32_t tap[3];
        g.tap_of(static_cast<int32_t>(slot - n * volume), tap);
        sink.put(slot,
                 encode_key<KeyT>(codec, member_of(offsets, batch_size, n),
                                  static_cast<int32_t>(g.fine_of(0, ijk[3 * n], tap[0])),
                                  static_cast<int32_t>(g.fine_of(1, ijk[3 * n + 1], tap[1])),
                                  static_cast<int32_t>(g.fine_of(2, ijk[3 * n + 2], tap[2]))));
    }
}

/// Bits set in `words` before bit `bit` of the bitmap, given per-chunk exclusive counts (chunks of
/// kChunkWords words).
constexpr int64_t kChunkWords = 8;

__global__ void chunk_popcount_kernel(const unsigned long long* words, int64_t chunks, int32_t* counts) {
    SG_GRID_STRIDE_LOOP(c, chunks + 1) {
        int32_t total = 0;
        if (c < chunks)
            for (int64_t w = 0; w < kChunkWords; ++w) total += __popcll(words[c * kChunkWords + w]);
        counts[c] = total;
    }
}

/// offsets[m] = number of set bits before member m's first key (m << morton_bits).
__global__ void bitmap_offsets_kernel(const unsigned long long* words, const int32_t* chunk_position, int64_t chunks,
                                      KeyCodec codec, int64_t batch_size, int64_t* offsets) {
    SG_GRID_STRIDE_LOOP(m, batch_size + 1) {
        const uint64_t bit = static_cast<uint64_t>(m) << codec.morton_bits();
        const int64_t chunk = static_cast<int64_t>(bit >> 9);
        if (chunk >= chunks) {
            offsets[m] = chunk_position[chunks];
            continue;
        }
        int64_t before = chunk_position[chunk];
        const int64_t word = static_cast<int64_t>(bit >> 6);
        for (int64_t w = chunk * kChunkWords; w < word; ++w) before += __popcll(words[w]);
        if (bit & 63) before += __popcll(words[word] & ((1ull << (bit & 63)) - 1));
        offsets[m] = before;
    }
}

/// Decodes every set bit, in bit (= key = voxel) order.
__global__ void bitmap_emit_kernel(const unsigned long long* words, const int32_t* chunk_position, int64_t num_words,
                                   KeyCodec codec, int32_t* ijk) {
    SG_GRID_STRIDE_LOOP(w, num_words) {
        unsigned long long bits = words[w];
        if (!bits) continue;
        int64_t position = chunk_position[w / kChunkWords];
        for (int64_t v = (w / kChunkWords) * kChunkWords; v < w; ++v) position += __popcll(words[v]);
        while (bits) {
            const int b = __ffsll(static_cast<long long>(bits)) - 1;
            bits &= bits - 1;
            const DecodedKey d = decode_key<uint64_t>(codec, static_cast<uint64_t>(w) * 64 + b);
            ijk[3 * position] = d.ijk[0];
            ijk[3 * position + 1] = d.ijk[1];
            ijk[3 * position + 2] = d.ijk[2];
            ++position;
        }
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

/// starts[n] = 1 when voxel n begins a new parent under coarsening by 2^p (first of its member, or a
/// parent different from the previous voxel's); starts[count] = 0 so the scan yields the total.
template <typename IndexT>
__global__ void coarsen_starts_kernel(const int32_t* ijk, const int64_t* offsets, int64_t batch_size, int64_t count,
                                      int32_t log2_factor, IndexT* starts) {
    SG_GRID_STRIDE_LOOP(n, count + 1) {
        if (n == count) {
            starts[n] = 0;
            continue;
        }
        const int64_t member = member_of(offsets, batch_size, n);
        bool start = n == offsets[member];
        for (int a = 0; a < 3 && !start; ++a)
            start = (ijk[3 * n + a] >> log2_factor) != (ijk[3 * n - 3 + a] >> log2_factor);
        starts[n] = start;
    }
}

template <typename IndexT>
__global__ void coarsen_scatter_kernel(const int32_t* ijk, const IndexT* starts, const IndexT* position, int64_t count,
                                       int32_t log2_factor, int32_t* out) {
    SG_GRID_STRIDE_LOOP(n, count) {
        if (!starts[n]) continue;
        for (int a = 0; a < 3; ++a) out[3 * static_cast<int64_t>(position[n]) + a] = ijk[3 * n + a] >> log2_factor;
    }
}

/// Gathers offsets[m] = position[in_offsets[m]].
template <typename IndexT>
__global__ void gather_offsets_kernel(const IndexT* position, const int64_t* in_offsets, int64_t entries,
                                      int64_t* out) {
    SG_GRID_STRIDE_LOOP(m, entries) { out[m] = position[in_offsets[m]]; }
}

/// Mask flags for pruning, with the box of the kept voxels.
template <typename IndexT>
__global__ void prune_flags_kernel(const int32_t* ijk, const uint8_t* mask, int64_t count, IndexT* flags,
                                   int32_t* box) {
    for (int64_t base = int64_t{blockIdx.x} * blockDim.x; base <= count; base += int64_t{blockDim.x} * gridDim.x) {
        const int64_t n = base + threadIdx.x;
        const bool keep = n < count && mask[n] != 0;
        if (n <= count) flags[n] = keep;
        int32_t v[3] = {0, 0, 0};
        if (keep)
            for (int a = 0; a < 3; ++a) v[a] = ijk[3 * n + a];
        fold_box(box, v, keep);
    }
}

template <typename IndexT>
__global__ void prune_scatter_kernel(const int32_t* ijk, const uint8_t* mask, const IndexT* position, int64_t count,
                                     int32_t* out) {
    SG_GRID_STRIDE_LOOP(n, count) {
        if (!mask[n]) continue;
        for (int a = 0; a < 3; ++a) out[3 * static_cast<int64_t>(position[n]) + a] = ijk[3 * n + a];
    }
}

/// ijk of world points; `bad` receives the smallest index of a point that is not finite or leaves int32.
__global__ void points_to_ijk_kernel(const double* xyz, const int64_t* offsets, int64_t batch_size, int64_t count,
                                     const double* transforms, int32_t* ijk, unsigned long long* bad) {
    SG_GRID_STRIDE_LOOP(n, count) {
        const int64_t member = member_of(offsets, batch_size, n);
        const double* t = transforms + 6 * member;  // voxel size (3), origin (3)
        for (int a = 0; a < 3; ++a) {
            const double index = floor((xyz[3 * n + a] - t[3 + a]) / t[a] + 0.5);
            if (!(index >= static_cast<double>(INT32_MIN) && index <= static_cast<double>(INT32_MAX))) {
                atomicMin(bad, static_cast<unsigned long long>(n));
                ijk[3 * n + a] = 0;
            } else {
                ijk[3 * n + a] = static_cast<int32_t>(index);
            }
        }
    }
}

// ---- host-side building blocks --------------------------------------------------------------------

/// Member offsets (device copy) of a host vector, uploaded through pinned-free stream-ordered copy.
Buffer<int64_t> upload_offsets(const std::vector<int64_t>& offsets, const Context& ctx) {
    return Buffer<int64_t>::from_host(offsets, ctx);
}

}  // namespace

// Declared in grid_keys.cuh (shared with the mesh backend).
template <typename KeyT>
GridTopology canonical_topology(Buffer<KeyT>& keys, const KeyCodec& codec, int64_t batch_size, const CoordBox& box,
                                bool box_exact, const Context& ctx) {
    const cudaStream_t stream = stream_of(ctx);
    const int64_t n = keys.size();
    Buffer<int32_t> box_buffer;
    if (!box_exact) {
        box_buffer = Buffer<int32_t>::allocate(7, ctx);
        init_box_kernel<<<1, 32, 0, stream>>>(box_buffer.data(), box_buffer.data() + 6);
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
        if (n > 0) {
            keys_box_kernel<KeyT><<<blocks_for(n), kThreads, 0, stream>>>(keys.data(), n, codec, box_buffer.data());
            SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
        }
    }
    // Valid keys are below 2^total_bits; the sentinel has that bit set, so sorting one bit more puts
    // every sentinel after every valid key.
    const int end_bit = codec.total_bits() + 1;
    Buffer<KeyT> sorted = Buffer<KeyT>::allocate(n, ctx);
    Buffer<KeyT> unique = Buffer<KeyT>::allocate(n, ctx);
    Buffer<int64_t> unique_count = Buffer<int64_t>::allocate(1, ctx);
    {
        TempStorage temp;
        SPARSEGRID_CUDA_CHECK(
            cub::DeviceRadixSort::SortKeys(nullptr, temp.bytes, keys.data(), sorted.data(), n, 0, end_bit, stream));
        temp.ensure(ctx);
        SPARSEGRID_CUDA_CHECK(
            cub::DeviceRadixSort::SortKeys(temp.data(), temp.bytes, keys.data(), sorted.data(), n, 0, end_bit, stream));
    }
    keys = Buffer<KeyT>();  // the candidates are no longer needed
    {
        TempStorage temp;
        SPARSEGRID_CUDA_CHECK(cub::DeviceSelect::Unique(nullptr, temp.bytes, sorted.data(), unique.data(),
                                                        unique_count.data(), n, stream));
        temp.ensure(ctx);
        SPARSEGRID_CUDA_CHECK(cub::DeviceSelect::Unique(temp.data(), temp.bytes, sorted.data(), unique.data(),
                                                        unique_count.data(), n, stream));
    }
    sorted = Buffer<KeyT>();
    Buffer<int64_t> offsets_buffer = Buffer<int64_t>::allocate(batch_size + 1, ctx);
    member_offsets_kernel<<<blocks_for(batch_size + 1), kThreads, 0, stream>>>(
        unique.data(), unique_count.data(), codec, batch_size, offsets_buffer.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    Readback readback(ctx);
    const size_t slot = readback.enqueue(offsets_buffer.data(), batch_size + 1);
    const size_t box_slot = box_exact ? 0 : readback.enqueue(box_buffer.data(), 6);
    readback.wait();
    GridTopology topology;
    topology.offsets = readback.get<int64_t>(slot, batch_size + 1);
    const int64_t count = topology.offsets.back();
    topology.box = box;
    if (!box_exact) {
        const std::vector<int32_t> exact = readback.get<int32_t>(box_slot, 6);
        topology.box = count == 0 ? CoordBox{}
                                  : CoordBox{{exact[0], exact[1], exact[2]}, {exact[3], exact[4], exact[5]}};
    }
    topology.ijk = Buffer<int32_t>::allocate(3 * count, ctx);
    if (count > 0) {
        decode_kernel<<<blocks_for(count), kThreads, 0, stream>>>(unique.data(), count, codec, topology.ijk.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    topology.offsets_buffer = std::move(offsets_buffer);
    return topology;
}

template GridTopology canonical_topology<uint64_t>(Buffer<uint64_t>&, const KeyCodec&, int64_t, const CoordBox&, bool,
                                                   const Context&);
template GridTopology canonical_topology<Key128>(Buffer<Key128>&, const KeyCodec&, int64_t, const CoordBox&, bool,
                                                 const Context&);

namespace {

/// Reads a bitmap over the key space out in key order: per-chunk popcounts, one scan, offsets of the
/// member boundaries, one sync, then every set bit decoded at its rank. `box` must be exact.
GridTopology canonical_from_bitmap(const Buffer<unsigned long long>& words, const KeyCodec& codec, int64_t batch_size,
                                   const CoordBox& box, const Context& ctx) {
    const cudaStream_t stream = stream_of(ctx);
    const int64_t num_words = words.size();
    const int64_t chunks = num_words / kChunkWords;
    Buffer<int32_t> counts = Buffer<int32_t>::allocate(chunks + 1, ctx);
    Buffer<int32_t> position = Buffer<int32_t>::allocate(chunks + 1, ctx);
    chunk_popcount_kernel<<<blocks_for(chunks + 1), kThreads, 0, stream>>>(words.data(), chunks, counts.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    {
        TempStorage temp;
        SPARSEGRID_CUDA_CHECK(
            cub::DeviceScan::ExclusiveSum(nullptr, temp.bytes, counts.data(), position.data(), chunks + 1, stream));
        temp.ensure(ctx);
        SPARSEGRID_CUDA_CHECK(
            cub::DeviceScan::ExclusiveSum(temp.data(), temp.bytes, counts.data(), position.data(), chunks + 1, stream));
    }
    GridTopology topology;
    topology.offsets_buffer = Buffer<int64_t>::allocate(batch_size + 1, ctx);
    bitmap_offsets_kernel<<<blocks_for(batch_size + 1), kThreads, 0, stream>>>(
        words.data(), position.data(), chunks, codec, batch_size, topology.offsets_buffer.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    Readback readback(ctx);
    const size_t slot = readback.enqueue(topology.offsets_buffer.data(), batch_size + 1);
    readback.wait();
    topology.offsets = readback.get<int64_t>(slot, batch_size + 1);
    const int64_t count = topology.offsets.back();
    topology.ijk = Buffer<int32_t>::allocate(3 * count, ctx);
    if (count > 0) {
        bitmap_emit_kernel<<<blocks_for(num_words), kThreads, 0, stream>>>(words.data(), position.data(), num_words,
                                                                           codec, topology.ijk.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    topology.box = box;
    return topology;
}

/// A dense bitmap over the codec's whole key space replaces the sort when that space is small next to
/// the candidates (up to 2^31 bits): writing bits and reading them out in order costs a few passes
/// over the bitmap, where a radix sort costs several over every candidate.
bool use_bitmap(const KeyCodec& codec, int64_t candidates, bool box_exact) {
    if (!box_exact || codec.total_bits() > 31) return false;
    return (int64_t{1} << codec.total_bits()) <= 64 * std::max<int64_t>(candidates, int64_t{1} << 20);
}

/// Builds a generated grid from candidates: launch(key_tag, sink) emits `slots` candidates into the
/// sink, either fixed key slots (then sorted) or the bitmap.
template <typename Launch>
GridTopology generate_grid(const GridStorage& grid, const KeyCodec& codec, int64_t slots, const CoordBox& box,
                           bool box_exact, Launch&& launch) {
    const Context& ctx = grid.context;
    if (use_bitmap(codec, slots, box_exact)) {
        const int64_t bits = int64_t{1} << codec.total_bits();
        const int64_t num_words = std::max<int64_t>(kChunkWords, bits / 64);
        Buffer<unsigned long long> words = Buffer<unsigned long long>::allocate(num_words, ctx);
        fill_bytes(words.data(), ctx.device, 0, static_cast<size_t>(num_words) * sizeof(unsigned long long),
                   ctx.stream);
        if (slots > 0) launch(uint64_t{}, BitmapSink{words.data()});
        return canonical_from_bitmap(words, codec, grid.batch_size(), box, ctx);
    }
    return with_key_type(codec, [&](auto key_tag) {
        using KeyT = decltype(key_tag);
        Buffer<KeyT> keys = Buffer<KeyT>::allocate(slots, ctx);
        if (slots > 0) launch(key_tag, SlotSink<KeyT>{keys.data()});
        return canonical_topology(keys, codec, grid.batch_size(), box, box_exact, ctx);
    });
}

/// Subdivision by 2^p: the output size is known, so nothing waits.
GridTopology subdivide_sorted(const GridStorage& grid, int32_t log2_factor, const CoordBox& out_box) {
    const Context& ctx = grid.context;
    const cudaStream_t stream = stream_of(ctx);
    const int64_t children = int64_t{1} << (3 * log2_factor);
    const int64_t n = grid.num_voxels();
    GridTopology topology;
    topology.ijk = Buffer<int32_t>::allocate(3 * checked_mul("refined_grid", "output voxel count", n, children), ctx);
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

/// Exclusive scan of `flags` (count + 1 entries, the last 0) into `position`.
template <typename IndexT>
void exclusive_scan(const IndexT* flags, IndexT* position, int64_t entries, const Context& ctx) {
    TempStorage temp;
    SPARSEGRID_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, temp.bytes, flags, position, entries, stream_of(ctx)));
    temp.ensure(ctx);
    SPARSEGRID_CUDA_CHECK(
        cub::DeviceScan::ExclusiveSum(temp.data(), temp.bytes, flags, position, entries, stream_of(ctx)));
}

/// Coarsening by 2^p of a grid in voxel order: parents are non-decreasing, so a scan of "new parent"
/// flags places them. One sync (offsets).
template <typename IndexT>
GridTopology coarsen_sorted_impl(const GridStorage& grid, int32_t log2_factor, const CoordBox& out_box) {
    const Context& ctx = grid.context;
    const cudaStream_t stream = stream_of(ctx);
    const int64_t n = grid.num_voxels();
    const int64_t batch_size = grid.batch_size();
    Buffer<IndexT> starts = Buffer<IndexT>::allocate(n + 1, ctx);
    Buffer<IndexT> position = Buffer<IndexT>::allocate(n + 1, ctx);
    coarsen_starts_kernel<<<blocks_for(n + 1), kThreads, 0, stream>>>(
        grid.topology.ijk.data(), grid.topology.offsets_buffer.data(), batch_size, n, log2_factor, starts.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    exclusive_scan(starts.data(), position.data(), n + 1, ctx);
    GridTopology topology;
    topology.offsets_buffer = Buffer<int64_t>::allocate(batch_size + 1, ctx);
    gather_offsets_kernel<<<blocks_for(batch_size + 1), kThreads, 0, stream>>>(
        position.data(), grid.topology.offsets_buffer.data(), batch_size + 1, topology.offsets_buffer.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    Readback readback(ctx);
    const size_t slot = readback.enqueue(topology.offsets_buffer.data(), batch_size + 1);
    readback.wait();
    topology.offsets = readback.get<int64_t>(slot, batch_size + 1);
    topology.ijk = Buffer<int32_t>::allocate(3 * topology.offsets.back(), ctx);
    if (n > 0) {
        coarsen_scatter_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
            grid.topology.ijk.data(), starts.data(), position.data(), n, log2_factor, topology.ijk.data());
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

// ---- backend functions ----------------------------------------------------------------------------

GridTopology build_from_ijk(const int32_t* ijk, const std::vector<int64_t>& offsets, const Context& ctx) {
    DeviceGuard guard(ctx);
    const cudaStream_t stream = stream_of(ctx);
    const int64_t batch_size = static_cast<int64_t>(offsets.size()) - 1;
    const int64_t count = offsets.back();
    Buffer<int64_t> offsets_buffer = upload_offsets(offsets, ctx);
    Buffer<int32_t> box_flag = Buffer<int32_t>::allocate(7, ctx);  // lo[3], hi[3], overflow
    init_box_kernel<<<1, 32, 0, stream>>>(box_flag.data(), box_flag.data() + 6);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    // The box is not known yet: encode with the widest coordinate range a 64-bit key of this batch
    // size holds. Keys of any covering codec sort identically, so the result does not depend on it.
    KeyCodec codec = make_codec(CoordBox{}, batch_size);
    codec.coord_bits = std::min(21, (63 - codec.member_bits) / 3);
    Buffer<uint64_t> keys = Buffer<uint64_t>::allocate(count, ctx);
    if (count > 0) {
        encode_input_kernel<uint64_t><<<blocks_for(count), kThreads, 0, stream>>>(
            ijk, offsets_buffer.data(), batch_size, count, codec, keys.data(), box_flag.data(), box_flag.data() + 6);
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    // Sort, unique and offsets as in canonical_topology, with the box and flag in the same readback.
    const int end_bit = codec.total_bits();
    Buffer<uint64_t> sorted = Buffer<uint64_t>::allocate(count, ctx);
    Buffer<uint64_t> unique = Buffer<uint64_t>::allocate(count, ctx);
    Buffer<int64_t> unique_count = Buffer<int64_t>::allocate(1, ctx);
    {
        TempStorage temp;
        SPARSEGRID_CUDA_CHECK(
            cub::DeviceRadixSort::SortKeys(nullptr, temp.bytes, keys.data(), sorted.data(), count, 0, end_bit, stream));
        temp.ensure(ctx);
        SPARSEGRID_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp.data(), temp.bytes, keys.data(), sorted.data(), count,
                                                             0, end_bit, stream));
        TempStorage select;
        SPARSEGRID_CUDA_CHECK(cub::DeviceSelect::Unique(nullptr, select.bytes, sorted.data(), unique.data(),
                                                        unique_count.data(), count, stream));
        select.ensure(ctx);
        SPARSEGRID_CUDA_CHECK(cub::DeviceSelect::Unique(select.data(), select.bytes, sorted.data(), unique.data(),
                                                        unique_count.data(), count, stream));
    }
    Buffer<int64_t> out_offsets = Buffer<int64_t>::allocate(batch_size + 1, ctx);
    member_offsets_kernel<<<blocks_for(batch_size + 1), kThreads, 0, stream>>>(unique.data(), unique_count.data(),
                                                                               codec, batch_size, out_offsets.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    Readback readback(ctx);
    const size_t offsets_slot = readback.enqueue(out_offsets.data(), batch_size + 1);
    const size_t box_slot = readback.enqueue(box_flag.data(), 7);
    readback.wait();
    const std::vector<int32_t> box_flag_host = readback.get<int32_t>(box_slot, 7);
    CoordBox box;
    if (count > 0) {
        box.lo = {box_flag_host[0], box_flag_host[1], box_flag_host[2]};
        box.hi = {box_flag_host[3], box_flag_host[4], box_flag_host[5]};
    }
    if (box_flag_host[6] != 0) {
        // Coordinates beyond the 64-bit key: the exact codec (128-bit keys) over the now known box.
        const KeyCodec wide = make_codec(box, batch_size);
        return with_key_type(wide, [&](auto key_tag) {
            using KeyT = decltype(key_tag);
            Buffer<KeyT> wide_keys = Buffer<KeyT>::allocate(count, ctx);
            encode_input_kernel<KeyT>
                <<<blocks_for(count), kThreads, 0, stream>>>(ijk, offsets_buffer.data(), batch_size, count, wide,
                                                             wide_keys.data(), box_flag.data(), box_flag.data() + 6);
            SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
            return canonical_topology(wide_keys, wide, batch_size, box, true, ctx);
        });
    }
    GridTopology topology;
    topology.offsets = readback.get<int64_t>(offsets_slot, batch_size + 1);
    const int64_t unique_total = topology.offsets.back();
    topology.ijk = Buffer<int32_t>::allocate(3 * unique_total, ctx);
    if (unique_total > 0) {
        decode_kernel<<<blocks_for(unique_total), kThreads, 0, stream>>>(unique.data(), unique_total, codec,
                                                                         topology.ijk.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    topology.offsets_buffer = std::move(out_offsets);
    topology.box = box;
    return topology;
}

Buffer<int32_t> points_to_ijk(const double* xyz, const std::vector<int64_t>& offsets,
                              const std::vector<MemberTransform>& transforms, const Context& ctx) {
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
    Buffer<int64_t> offsets_buffer = upload_offsets(offsets, ctx);
    Buffer<int32_t> ijk = Buffer<int32_t>::allocate(3 * count, ctx);
    Buffer<unsigned long long> bad = Buffer<unsigned long long>::allocate(1, ctx);
    fill_bytes(bad.data(), ctx.device, 0xff, sizeof(unsigned long long), ctx.stream);
    if (count > 0) {
        points_to_ijk_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
            xyz, offsets_buffer.data(), batch_size, count, transforms_buffer.data(), ijk.data(), bad.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    Readback readback(ctx);
    const size_t slot = readback.enqueue(bad.data(), 1);
    readback.wait();
    const unsigned long long first_bad = readback.get<unsigned long long>(slot, 1)[0];
    if (first_bad != ~0ull) {
        const int64_t n = static_cast<int64_t>(first_bad);
        const int64_t member = std::upper_bound(offsets.begin(), offsets.end(), n) - offsets.begin() - 1;
        std::vector<double> point(3);
        copy_bytes(point.data(), Device::cpu(), xyz + 3 * n, ctx.device, 3 * sizeof(double), ctx.stream);
        throw_error("GridBatch::from_points: xyz point ", n, " (member ", member, ") = (", point[0], ", ", point[1],
                    ", ", point[2], ") must be finite and map to a voxel index within int32 range");
    }
    return ijk;
}

GridTopology conv_grid(const GridStorage& grid, const ConvGeometry& g, const CoordBox& out_box) {
    DeviceGuard guard(grid.context);
    if (g.is_uniform(2, 2)) return coarsen_sorted(grid, 1, out_box);
    const KeyCodec codec = make_codec(out_box, grid.batch_size());
    int32_t per_voxel = 1;
    for (int a = 0; a < 3; ++a) per_voxel *= (g.kernel[a] + g.stride[a] - 1) / g.stride[a];
    const int64_t n = grid.num_voxels();
    const int64_t slots = checked_mul("conv_grid", "candidate count", n, per_voxel);
    // The box is exact only when every fine voxel reaches a coarse voxel on every axis (K >= S).
    const bool box_exact = g.kernel[0] >= g.stride[0] && g.kernel[1] >= g.stride[1] && g.kernel[2] >= g.stride[2];
    return generate_grid(grid, codec, slots, out_box, box_exact, [&](auto key_tag, auto sink) {
        using KeyT = decltype(key_tag);
        conv_grid_candidates_kernel<KeyT><<<blocks_for(n), kThreads, 0, stream_of(grid.context)>>>(
            grid.topology.ijk.data(), grid.topology.offsets_buffer.data(), grid.batch_size(), n, g, per_voxel, codec,
            sink);
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(grid.context));
    });
}

GridTopology conv_transpose_grid(const GridStorage& grid, const ConvGeometry& g, const CoordBox& out_box) {
    DeviceGuard guard(grid.context);
    if (g.is_uniform(2, 2)) return subdivide_sorted(grid, 1, out_box);
    const KeyCodec codec = make_codec(out_box, grid.batch_size());
    const int64_t n = grid.num_voxels();
    const int64_t slots = checked_mul("conv_transpose_grid", "candidate count", n, g.kernel_volume());
    return generate_grid(grid, codec, slots, out_box, true, [&](auto key_tag, auto sink) {
        using KeyT = decltype(key_tag);
        conv_transpose_candidates_kernel<KeyT><<<blocks_for(slots), kThreads, 0, stream_of(grid.context)>>>(
            grid.topology.ijk.data(), grid.topology.offsets_buffer.data(), grid.batch_size(), n, g, codec, sink);
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(grid.context));
    });
}

GridTopology coarsened_grid(const GridStorage& grid, const Vec3i& factor, const CoordBox& out_box) {
    DeviceGuard guard(grid.context);
    int32_t log2_factor = 0;
    if (uniform_power_of_two(factor, &log2_factor)) return coarsen_sorted(grid, log2_factor, out_box);
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

GridTopology refined_grid(const GridStorage& grid, const Vec3i& factor, const CoordBox& out_box) {
    DeviceGuard guard(grid.context);
    int32_t log2_factor = 0;
    if (uniform_power_of_two(factor, &log2_factor)) return subdivide_sorted(grid, log2_factor, out_box);
    const KeyCodec codec = make_codec(out_box, grid.batch_size());
    const int64_t n = grid.num_voxels();
    const int64_t slots = checked_mul("refined_grid", "output voxel count", n,
                                      int64_t{factor[0]} * factor[1] * factor[2]);
    return generate_grid(grid, codec, slots, out_box, true, [&](auto key_tag, auto sink) {
        using KeyT = decltype(key_tag);
        refine_candidates_kernel<KeyT><<<blocks_for(slots), kThreads, 0, stream_of(grid.context)>>>(
            grid.topology.ijk.data(), grid.topology.offsets_buffer.data(), grid.batch_size(), n,
            make_int3(factor[0], factor[1], factor[2]), codec, sink);
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(grid.context));
    });
}

namespace {

template <typename IndexT>
GridTopology pruned_grid_impl(const GridStorage& grid, const uint8_t* mask) {
    const Context& ctx = grid.context;
    DeviceGuard guard(ctx);
    const cudaStream_t stream = stream_of(ctx);
    const int64_t n = grid.num_voxels();
    const int64_t batch_size = grid.batch_size();
    Buffer<IndexT> flags = Buffer<IndexT>::allocate(n + 1, ctx);
    Buffer<IndexT> position = Buffer<IndexT>::allocate(n + 1, ctx);
    Buffer<int32_t> box_flag = Buffer<int32_t>::allocate(7, ctx);
    init_box_kernel<<<1, 32, 0, stream>>>(box_flag.data(), box_flag.data() + 6);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    prune_flags_kernel<<<blocks_for(n + 1), kThreads, 0, stream>>>(grid.topology.ijk.data(), mask, n, flags.data(),
                                                                   box_flag.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    exclusive_scan(flags.data(), position.data(), n + 1, ctx);
    GridTopology topology;
    topology.offsets_buffer = Buffer<int64_t>::allocate(batch_size + 1, ctx);
    gather_offsets_kernel<<<blocks_for(batch_size + 1), kThreads, 0, stream>>>(
        position.data(), grid.topology.offsets_buffer.data(), batch_size + 1, topology.offsets_buffer.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
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
    if (n > 0) {
        prune_scatter_kernel<<<blocks_for(n), kThreads, 0, stream>>>(grid.topology.ijk.data(), mask, position.data(), n,
                                                                     topology.ijk.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    return topology;
}

}  // namespace

GridTopology pruned_grid(const GridStorage& grid, const uint8_t* mask) {
    if (grid.num_voxels() < INT32_MAX) return pruned_grid_impl<int32_t>(grid, mask);
    return pruned_grid_impl<int64_t>(grid, mask);
}

GridTopology merged_grid(const GridStorage& a, const GridStorage& b, const CoordBox& out_box) {
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

}  // namespace sparsegrid::detail::cuda
