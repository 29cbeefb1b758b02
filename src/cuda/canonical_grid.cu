// The canonical grid on the device: from candidate keys (radix sort + unique, or a bitmap over the key
// space read out in order) and from arbitrary coordinates (CudaBackend::build_from_ijk). Canonical means
// in voxel order (member, then Morton order of the coordinates), without duplicates, with the member
// offsets read back to the host: one sync per grid.
#include "backend/backend.h"
#include "core/geometry.h"
#include "cuda/canonical_grid.cuh"
#include "cuda/cuda_common.cuh"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>

#include <algorithm>
#include <climits>

namespace sparsegrid::detail::cuda {

// ---- kernels --------------------------------------------------------------------------------------

namespace {

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

/// counts[c] = bits set in chunk c (kChunkWords words); counts[chunks] = 0, so the exclusive scan of the
/// counts gives every chunk's first rank and the total.
__global__ void chunk_popcount_kernel(const unsigned long long* words, int64_t chunks, int32_t* counts) {
    SG_GRID_STRIDE_LOOP(c, chunks + 1) {
        int32_t total = 0;
        if (c < chunks)
            for (int64_t w = 0; w < kChunkWords; ++w) total += __popcll(words[c * kChunkWords + w]);
        counts[c] = total;
    }
}

/// batch.offsets[i][m] = set bits of bitmap i before member m's first key (m << morton bits); m =
/// batch_size gives the bitmap's total.
__global__ void bitmap_offsets_kernel(const unsigned long long* words, const int32_t* chunk_position, BitmapBatch batch,
                                      int64_t batch_size) {
    SG_GRID_STRIDE_LOOP(e, batch.count * (batch_size + 1)) {
        const int32_t i = static_cast<int32_t>(e / (batch_size + 1));
        const int64_t m = e - i * (batch_size + 1);
        const int64_t first = batch.first_word[i];
        const int64_t end = batch.first_word[i + 1];
        const int64_t base = chunk_position[first / kChunkWords];
        const uint64_t bit = static_cast<uint64_t>(first) * 64 +
            (static_cast<uint64_t>(m) << batch.codec[i].morton_bits());
        const auto word = static_cast<int64_t>(bit >> 6);
        if (word >= end) {
            batch.offsets[i][m] = chunk_position[end / kChunkWords] - base;
            continue;
        }
        int64_t before = chunk_position[word / kChunkWords];
        for (int64_t w = word / kChunkWords * kChunkWords; w < word; ++w) before += __popcll(words[w]);
        if (bit & 63) before += __popcll(words[word] & ((1ull << (bit & 63)) - 1));
        batch.offsets[i][m] = before - base;
    }
}

/// Decodes every set bit of every bitmap, in bit (= key = voxel) order, into its grid's coordinates.
/// Each thread reads out one slice of 2^log2_slice bits of a word, so that a small dense bitmap (a
/// coarse level: few words, most bits set) spreads over as many threads as a large sparse one instead
/// of leaving a thread a whole word's voxels to decode one after the other.
__global__ void bitmap_emit_kernel(const unsigned long long* words, const int32_t* chunk_position, BitmapBatch batch,
                                   int32_t log2_slice) {
    const int32_t log2_slices = 6 - log2_slice;
    SG_GRID_STRIDE_LOOP(t, batch.first_word[batch.count] << log2_slices) {
        const int64_t w = t >> log2_slices;
        const int32_t first_bit = static_cast<int32_t>(t - (w << log2_slices)) << log2_slice;
        const unsigned long long word = words[w];
        const unsigned long long slice = log2_slice == 6 ? ~0ull : ((1ull << (1 << log2_slice)) - 1) << first_bit;
        unsigned long long bits = word & slice;
        if (!bits) continue;
        int32_t i = 0;
        while (w >= batch.first_word[i + 1]) ++i;
        const int64_t first = batch.first_word[i];
        int64_t position = chunk_position[w / kChunkWords] - chunk_position[first / kChunkWords] +
            __popcll(word & ((1ull << first_bit) - 1));
        for (int64_t v = w / kChunkWords * kChunkWords; v < w; ++v) position += __popcll(words[v]);
        int32_t* ijk = batch.ijk[i];
        while (bits) {
            const int b = __ffsll(static_cast<long long>(bits)) - 1;
            bits &= bits - 1;
            const DecodedKey d = decode_key<uint64_t>(batch.codec[i], static_cast<uint64_t>(w - first) * 64 + b);
            ijk[3 * position] = d.ijk[0];
            ijk[3 * position + 1] = d.ijk[1];
            ijk[3 * position + 2] = d.ijk[2];
            ++position;
        }
    }
}

/// log2 of the bits each thread of bitmap_emit_kernel reads out: whole words while there are at least
/// 2^22 of them, else slices small enough for about 2^22 threads (down to one bit per thread).
int32_t emit_log2_slice(int64_t num_words) {
    int32_t log2_slice = 6;
    while (log2_slice > 0 && (num_words << (6 - log2_slice)) < (int64_t{1} << 22)) --log2_slice;
    return log2_slice;
}

}  // namespace

void init_box(int32_t* box, int32_t* flag, cudaStream_t stream) {
    init_box_kernel<<<1, 32, 0, stream>>>(box, flag);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

// ---- keys to grids --------------------------------------------------------------------------------

template <typename KeyT>
FinishTopology begin_canonical_topology(Buffer<KeyT>& keys, const KeyCodec& codec, int64_t batch_size,
                                        const CoordBox& box, bool box_exact, Readback& readback, const Context& ctx) {
    const cudaStream_t stream = stream_of(ctx);
    const int64_t n = keys.size();
    Buffer<int32_t> box_buffer;
    if (!box_exact) {
        box_buffer = Buffer<int32_t>::allocate(7, ctx);
        init_box(box_buffer.data(), box_buffer.data() + 6, stream);
        if (n > 0) {
            keys_box_kernel<KeyT><<<blocks_for(n), kThreads, 0, stream>>>(keys.data(), n, codec, box_buffer.data());
            SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
        }
    }
    // Valid keys are below 2^total_bits; the sentinel has that bit set, so sorting one bit more puts
    // every sentinel after every valid key.
    const int end_bit = codec.total_bits() + 1;
    Buffer<KeyT> sorted = Buffer<KeyT>::allocate(n, ctx);
    auto unique = std::make_shared<Buffer<KeyT>>(Buffer<KeyT>::allocate(n, ctx));
    Buffer<int64_t> unique_count = Buffer<int64_t>::allocate(1, ctx);
    cub_call(ctx, [&](void* temp, size_t& bytes) {
        return cub::DeviceRadixSort::SortKeys(temp, bytes, keys.data(), sorted.data(), n, 0, end_bit, stream);
    });
    keys = Buffer<KeyT>();  // the candidates are no longer needed
    cub_call(ctx, [&](void* temp, size_t& bytes) {
        return cub::DeviceSelect::Unique(temp, bytes, sorted.data(), unique->data(), unique_count.data(), n, stream);
    });
    sorted = Buffer<KeyT>();
    auto offsets_buffer = std::make_shared<Buffer<int64_t>>(Buffer<int64_t>::allocate(batch_size + 1, ctx));
    member_offsets_kernel<<<blocks_for(batch_size + 1), kThreads, 0, stream>>>(
        unique->data(), unique_count.data(), codec, batch_size, offsets_buffer->data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    const size_t slot = readback.enqueue(offsets_buffer->data(), batch_size + 1);
    const size_t box_slot = box_exact ? 0 : readback.enqueue(box_buffer.data(), 6);
    // Every buffer the readback copies from or the finishing step reads is held by the finishing step:
    // a buffer released before the readback's wait() could be reused by another grid's work first.
    return [ctx, stream, codec, batch_size, box, box_exact, slot, box_slot, unique, offsets_buffer,
            box_buffer](const Readback& done) {
        GridTopology topology;
        topology.offsets = done.get<int64_t>(slot, batch_size + 1);
        const int64_t count = topology.offsets.back();
        topology.box = box;
        if (!box_exact) {
            const std::vector<int32_t> exact = done.get<int32_t>(box_slot, 6);
            topology.box = count == 0 ? CoordBox{}
                                      : CoordBox{{exact[0], exact[1], exact[2]}, {exact[3], exact[4], exact[5]}};
        }
        topology.ijk = Buffer<int32_t>::allocate(3 * count, ctx);
        if (count > 0) {
            decode_kernel<<<blocks_for(count), kThreads, 0, stream>>>(unique->data(), count, codec,
                                                                      topology.ijk.data());
            SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
        }
        topology.offsets_buffer = std::move(*offsets_buffer);
        return topology;
    };
}

template FinishTopology begin_canonical_topology<uint64_t>(Buffer<uint64_t>&, const KeyCodec&, int64_t, const CoordBox&,
                                                           bool, Readback&, const Context&);
template FinishTopology begin_canonical_topology<Key128>(Buffer<Key128>&, const KeyCodec&, int64_t, const CoordBox&,
                                                         bool, Readback&, const Context&);

template <typename KeyT>
GridTopology canonical_topology(Buffer<KeyT>& keys, const KeyCodec& codec, int64_t batch_size, const CoordBox& box,
                                bool box_exact, const Context& ctx) {
    Readback readback(ctx);
    const FinishTopology finish = begin_canonical_topology(keys, codec, batch_size, box, box_exact, readback, ctx);
    readback.wait();
    return finish(readback);
}

template GridTopology canonical_topology<uint64_t>(Buffer<uint64_t>&, const KeyCodec&, int64_t, const CoordBox&, bool,
                                                   const Context&);
template GridTopology canonical_topology<Key128>(Buffer<Key128>&, const KeyCodec&, int64_t, const CoordBox&, bool,
                                                 const Context&);

FinishTopologies begin_canonical_from_bitmaps(Buffer<unsigned long long> words, BitmapBatch batch, int64_t batch_size,
                                              const std::vector<CoordBox>& boxes, Readback& readback,
                                              const Context& ctx) {
    const cudaStream_t stream = stream_of(ctx);
    const int64_t num_words = batch.first_word[batch.count];
    const int64_t chunks = num_words / kChunkWords;
    Buffer<int32_t> counts = Buffer<int32_t>::allocate(chunks + 1, ctx);
    auto position = std::make_shared<Buffer<int32_t>>(Buffer<int32_t>::allocate(chunks + 1, ctx));
    chunk_popcount_kernel<<<blocks_for(chunks + 1), kThreads, 0, stream>>>(words.data(), chunks, counts.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    exclusive_scan(counts.data(), position->data(), chunks + 1, ctx);
    auto offsets = std::make_shared<std::vector<Buffer<int64_t>>>();
    std::vector<size_t> slots;
    for (int32_t i = 0; i < batch.count; ++i) {
        offsets->push_back(Buffer<int64_t>::allocate(batch_size + 1, ctx));
        batch.offsets[i] = offsets->back().data();
    }
    const int64_t entries = batch.count * (batch_size + 1);
    bitmap_offsets_kernel<<<blocks_for(entries), kThreads, 0, stream>>>(words.data(), position->data(), batch,
                                                                        batch_size);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    for (const Buffer<int64_t>& grid_offsets : *offsets)
        slots.push_back(readback.enqueue(grid_offsets.data(), batch_size + 1));
    auto bitmap = std::make_shared<Buffer<unsigned long long>>(std::move(words));
    // Held as in begin_canonical_topology: the offsets until the readback, the bitmaps and ranks until
    // the grids are read out.
    return [ctx, stream, batch, batch_size, boxes, slots, bitmap, position, offsets](const Readback& done) {
        std::vector<GridTopology> topologies(static_cast<size_t>(batch.count));
        BitmapBatch emit = batch;
        int64_t total = 0;
        for (int32_t i = 0; i < batch.count; ++i) {
            GridTopology& topology = topologies[static_cast<size_t>(i)];
            topology.offsets = done.get<int64_t>(slots[static_cast<size_t>(i)], batch_size + 1);
            topology.ijk = Buffer<int32_t>::allocate(3 * topology.offsets.back(), ctx);
            topology.offsets_buffer = std::move((*offsets)[static_cast<size_t>(i)]);
            topology.box = boxes[static_cast<size_t>(i)];
            emit.ijk[i] = topology.ijk.data();
            total += topology.offsets.back();
        }
        if (total > 0) {
            const int64_t num_words = batch.first_word[batch.count];
            const int32_t log2_slice = emit_log2_slice(num_words);
            bitmap_emit_kernel<<<blocks_for(num_words << (6 - log2_slice)), kThreads, 0, stream>>>(
                bitmap->data(), position->data(), emit, log2_slice);
            SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
        }
        return topologies;
    };
}

FinishTopology begin_canonical_from_bitmap(Buffer<unsigned long long> words, const KeyCodec& codec, int64_t batch_size,
                                           const CoordBox& box, Readback& readback, const Context& ctx) {
    BitmapBatch batch;
    batch.count = 1;
    batch.first_word[1] = words.size();
    batch.codec[0] = codec;
    const FinishTopologies finish = begin_canonical_from_bitmaps(std::move(words), batch, batch_size, {box}, readback,
                                                                 ctx);
    return [finish](const Readback& done) { return std::move(finish(done)[0]); };
}

GridTopology canonical_from_bitmap(Buffer<unsigned long long> words, const KeyCodec& codec, int64_t batch_size,
                                   const CoordBox& box, const Context& ctx) {
    Readback readback(ctx);
    const FinishTopology finish = begin_canonical_from_bitmap(std::move(words), codec, batch_size, box, readback, ctx);
    readback.wait();
    return finish(readback);
}

}  // namespace sparsegrid::detail::cuda

// ---- backend entry point --------------------------------------------------------------------------

namespace sparsegrid::detail {

using namespace cuda;

GridTopology CudaBackend::build_from_ijk(const int32_t* ijk, const std::vector<int64_t>& offsets, const Context& ctx) {
    DeviceGuard guard(ctx);
    const cudaStream_t stream = stream_of(ctx);
    const int64_t batch_size = static_cast<int64_t>(offsets.size()) - 1;
    const int64_t count = offsets.back();
    Buffer<int64_t> offsets_buffer = Buffer<int64_t>::from_host(offsets, ctx);
    Buffer<int32_t> box_flag = Buffer<int32_t>::allocate(7, ctx);  // lo[3], hi[3], overflow
    init_box(box_flag.data(), box_flag.data() + 6, stream);
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
    cub_call(ctx, [&](void* temp, size_t& bytes) {
        return cub::DeviceRadixSort::SortKeys(temp, bytes, keys.data(), sorted.data(), count, 0, end_bit, stream);
    });
    cub_call(ctx, [&](void* temp, size_t& bytes) {
        return cub::DeviceSelect::Unique(temp, bytes, sorted.data(), unique.data(), unique_count.data(), count, stream);
    });
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

}  // namespace sparsegrid::detail
