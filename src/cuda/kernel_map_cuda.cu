// CUDA backend of lookups and kernel maps. A lookup finds a (member, coordinate) among the source grid's
// voxels: by default in an open-addressing hash table over the grid's 64-bit keys, built once per grid
// and kept with it (with_lookup); with 128-bit keys, or SPARSEGRID_LOOKUP=search, by a binary search
// over the grid's keys, which are sorted because the grid is in voxel order. Keys are unique, so both
// give the same answers whatever the order of the table's inserts. Every map entry is computed by its own thread; the
// symmetric stride-1 map (chosen by the front end) looks up half the taps and mirrors the rest.
#include "backend/backend.h"
#include "core/env.h"
#include "core/geometry.h"
#include "cuda/cuda_common.cuh"
#include "cuda/grid_keys.cuh"

#include <cub/device/device_scan.cuh>

#include <climits>
#include <type_traits>

namespace sparsegrid::detail::cuda {

namespace {

/// The voxels of one grid on the device, searchable by (member, coordinate): an open-addressing hash
/// table with linear probing over 64-bit keys (capacity a power of two, at most half full), or a
/// binary search over the grid's sorted keys (128-bit keys, or SPARSEGRID_LOOKUP=search). Both give
/// the same answers; the table needs fewer dependent memory reads per lookup.
template <typename KeyT>
struct DeviceLookup {
    const KeyT* keys;       ///< the key of each voxel of the grid, in voxel order (so sorted)
    const KeyT* slots;      ///< hash: the table's keys; search: null
    const int32_t* values;  ///< hash: voxel index per slot; search: null
    uint64_t mask;          ///< hash: capacity - 1
    const int64_t* offsets;
    KeyCodec codec;
    int32_t lo[3];
    int32_t hi[3];
    bool empty;

    __device__ __forceinline__ int64_t find(int64_t member, const int64_t q[3]) const {
        if (empty) return -1;
        for (int a = 0; a < 3; ++a)
            if (q[a] < lo[a] || q[a] > hi[a]) return -1;
        const KeyT key = encode_key<KeyT>(codec, member, static_cast<int32_t>(q[0]), static_cast<int32_t>(q[1]),
                                          static_cast<int32_t>(q[2]));
        return find_key(member, key);
    }

    /// Index of the voxel with `key` (which must encode a coordinate inside the box), or -1.
    __device__ __forceinline__ int64_t find_key(int64_t member, KeyT key) const {
        if (values) {
            for (uint64_t slot = hash_slot(static_cast<uint64_t>(key), mask);; slot = (slot + 1) & mask) {
                const KeyT stored = slots[slot];
                if (stored == key) return values[slot];
                if (stored == ~KeyT(0)) return -1;
            }
        }
        const int64_t end = offsets[member + 1];
        const int64_t pos = lower_bound(keys, offsets[member], end, key);
        return pos < end && keys[pos] == key ? pos : -1;
    }
};

/// Owns the arrays a DeviceLookup points into.
template <typename KeyT>
struct LookupStorage {
    Buffer<KeyT> keys;
    Buffer<KeyT> slots;
    Buffer<int32_t> values;
    DeviceLookup<KeyT> view;
};

/// Encodes every voxel of a grid into keys[n] and inserts it into the table (keys are unique, so a
/// slot is only ever claimed once).
__global__ void hash_insert_kernel(const int32_t* ijk, const int64_t* offsets, int64_t batch_size, int64_t count,
                                   KeyCodec codec, uint64_t mask, uint64_t* keys, unsigned long long* slots,
                                   int32_t* values) {
    SG_GRID_STRIDE_LOOP(n, count) {
        const unsigned long long key = encode_key<uint64_t>(codec, member_of(offsets, batch_size, n), ijk[3 * n],
                                                            ijk[3 * n + 1], ijk[3 * n + 2]);
        keys[n] = key;
        for (uint64_t slot = hash_slot(key, mask);; slot = (slot + 1) & mask) {
            const unsigned long long previous = atomicCAS(&slots[slot], ~0ull, key);
            if (previous == ~0ull || previous == key) {
                values[slot] = static_cast<int32_t>(n);
                break;
            }
        }
    }
}

/// The hash table, unless SPARSEGRID_LOOKUP is "search" (for measurements; the answers are the same).
bool use_hash_lookup() {
    static const bool hash = env_string("SPARSEGRID_LOOKUP") != "search";
    return hash;
}

template <typename KeyT>
LookupStorage<KeyT> make_lookup(const GridStorage& grid, const KeyCodec& codec) {
    const Context& ctx = grid.context;
    LookupStorage<KeyT> storage;
    const int64_t n = grid.num_voxels();
    uint64_t mask = 0;
    bool hashed = false;
    if constexpr (std::is_same_v<KeyT, uint64_t>) {
        if (use_hash_lookup() && n > 0) {
            const uint64_t capacity = hash_capacity(n);
            mask = capacity - 1;
            storage.keys = Buffer<KeyT>::allocate(n, ctx);
            storage.slots = Buffer<KeyT>::allocate(static_cast<int64_t>(capacity), ctx);
            storage.values = Buffer<int32_t>::allocate(static_cast<int64_t>(capacity), ctx);
            CudaBackend::fill_bytes(storage.slots.data(), ctx.device, 0xff, capacity * sizeof(KeyT), ctx.stream);
            hash_insert_kernel<<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(
                grid.topology.ijk.data(), grid.topology.offsets_buffer.data(), grid.batch_size(), n, codec, mask,
                storage.keys.data(), reinterpret_cast<unsigned long long*>(storage.slots.data()),
                storage.values.data());
            SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(ctx));
            hashed = true;
        }
    }
    if (!hashed) {
        storage.keys = Buffer<KeyT>::allocate(n, ctx);
        encode_grid_keys<KeyT>(grid, codec, storage.keys.data());
    }
    const CoordBox& box = grid.topology.box;
    storage.view = DeviceLookup<KeyT>{storage.keys.data(),
                                      hashed ? storage.slots.data() : nullptr,
                                      hashed ? storage.values.data() : nullptr,
                                      mask,
                                      grid.topology.offsets_buffer.data(),
                                      codec,
                                      {box.lo[0], box.lo[1], box.lo[2]},
                                      {box.hi[0], box.hi[1], box.hi[2]},
                                      box.empty() || n == 0};
    return storage;
}

/// Runs fn with the lookup of `grid`, built once per grid on the grid's stream and kept with it
/// (GridCache): later maps and plans on the grid reuse it.
template <typename Fn>
auto with_lookup(const GridStorage& grid, Fn&& fn) {
    const KeyCodec codec = make_codec(grid.topology.box, grid.batch_size());
    if (codec.fits_64()) {
        const auto lookup = cached_lookup<LookupStorage<uint64_t>>(grid,
                                                                   [&] { return make_lookup<uint64_t>(grid, codec); });
        return fn(lookup->view);
    }
    const auto lookup = cached_lookup<LookupStorage<Key128>>(grid, [&] { return make_lookup<Key128>(grid, codec); });
    return fn(lookup->view);
}

template <typename KeyT>
__global__ void ijk_to_index_kernel(DeviceLookup<KeyT> lookup, const int32_t* query_ijk, const int64_t* query_offsets,
                                    int64_t batch_size, int64_t count, int64_t* out) {
    SG_GRID_STRIDE_LOOP(n, count) {
        const int64_t q[3] = {query_ijk[3 * n], query_ijk[3 * n + 1], query_ijk[3 * n + 2]};
        out[n] = lookup.find(member_of(query_offsets, batch_size, n), q);
    }
}

template <typename KeyT>
__global__ void neighbour_map_kernel(DeviceLookup<KeyT> lookup, const int32_t* target_ijk,
                                     const int64_t* target_offsets, int64_t batch_size, int64_t rows, ConvGeometry g,
                                     bool forward, int32_t* map) {
    const int32_t volume = g.kernel_volume();
    SG_GRID_STRIDE_LOOP(entry, rows * volume) {
        const int64_t row = divide(entry, volume);
        int32_t tap[3];
        g.tap_of(static_cast<int32_t>(entry - row * volume), tap);
        int64_t q[3];
        bool reachable = true;
        for (int a = 0; a < 3; ++a) {
            const int32_t x = target_ijk[3 * row + a];
            if (forward)
                q[a] = g.fine_of(a, x, tap[a]);
            else
                reachable = reachable && g.coarse_of(a, x, tap[a], &q[a]);
        }
        map[entry] = reachable ? static_cast<int32_t>(lookup.find(member_of(target_offsets, batch_size, row), q)) : -1;
    }
}

/// Same grid, stride 1, odd kernel: the map is symmetric (map[n][t] = m exactly when
/// map[m][V-1-t] = n), so only taps below the centre are searched, by find(row, t) (the source index
/// or -1), and each edge found is written twice; the centre tap maps a row to itself. The map must be
/// filled with -1 beforehand.
template <typename Find>
__device__ __forceinline__ void symmetric_map_entries(int64_t rows, int32_t volume, int32_t* map, Find&& find) {
    const int32_t half = volume / 2;
    SG_GRID_STRIDE_LOOP(entry, rows * (half + 1)) {
        const int64_t row = divide(entry, half + 1);
        const int32_t t = static_cast<int32_t>(entry - row * (half + 1));
        if (t == half) {
            map[row * volume + half] = static_cast<int32_t>(row);
            continue;
        }
        const int64_t found = find(row, t);
        map[row * volume + t] = static_cast<int32_t>(found);
        if (found >= 0) map[found * volume + (volume - 1 - t)] = static_cast<int32_t>(row);
    }
}

/// The symmetric map (symmetric_map_entries), each neighbour looked up by its member and coordinates.
template <typename KeyT>
__global__ void symmetric_map_kernel(DeviceLookup<KeyT> lookup, const int32_t* ijk, const int64_t* offsets,
                                     int64_t batch_size, int64_t rows, ConvGeometry g, bool forward, int32_t* map) {
    symmetric_map_entries(rows, g.kernel_volume(), map, [&](int64_t row, int32_t t) {
        int32_t tap[3];
        g.tap_of(t, tap);
        int64_t q[3];
        // Stride 1: the transposed direction always divides, with the opposite offset.
        for (int a = 0; a < 3; ++a) {
            if (forward)
                q[a] = g.fine_of(a, ijk[3 * row + a], tap[a]);
            else
                g.coarse_of(a, ijk[3 * row + a], tap[a], &q[a]);
        }
        return lookup.find(member_of(offsets, batch_size, row), q);
    });
}

/// A tap of the symmetric map over 64-bit keys: its offset, and the offset's low coord_bits bits spread
/// onto each axis's bits of a key.
struct MovedTap {
    uint64_t spread[3];
    int32_t offset[3];
};

/// The key of a voxel moved by small per-axis offsets, from the voxel's own key: on each axis the
/// spread offset is added to the axis's bits, the carry running through the other bits (set to one for
/// the addition), so the sum wraps modulo 2^coord_bits. Exact while the moved coordinates stay in the
/// codec's range, as every coordinate inside the grid's box does.
__device__ __forceinline__ uint64_t moved_key(uint64_t key, const uint64_t axis_bits[3], const uint64_t spread[3]) {
    for (int a = 0; a < 3; ++a) key = (key & ~axis_bits[a]) | (((key | ~axis_bits[a]) + spread[a]) & axis_bits[a]);
    return key;
}

/// The key bits of each axis (spread_bits3 of the coordinate mask, shifted to the axis).
struct MovedAxes {
    uint64_t bits[3];
};

/// Fills taps[0, volume / 2) with each tap's offset (forward, or its opposite for the transposed
/// direction: stride 1) and the offset spread onto a key's axis bits, the block's threads sharing the
/// work, and synchronises the block; returns the axis bits for moved_key.
__device__ __forceinline__ MovedAxes prepare_moved_taps(const KeyCodec& codec, const ConvGeometry& g, bool forward,
                                                        MovedTap* taps) {
    const uint64_t coordinate = (uint64_t{1} << codec.coord_bits) - 1;
    for (int32_t t = threadIdx.x; t < g.kernel_volume() / 2; t += blockDim.x) {
        int32_t tap[3];
        g.tap_of(t, tap);
        for (int a = 0; a < 3; ++a) {
            const int32_t offset = forward ? tap[a] - g.pad[a] : g.pad[a] - tap[a];
            taps[t].offset[a] = offset;
            taps[t].spread[a] = spread_bits3(static_cast<uint64_t>(offset) & coordinate) << (2 - a);
        }
    }
    __syncthreads();
    return {{spread_bits3(coordinate) << 2, spread_bits3(coordinate) << 1, spread_bits3(coordinate)}};
}

/// The symmetric map over 64-bit keys, with fewer instructions per entry (the kernel is bound by
/// them, not by memory): a neighbour's key comes from the row's key (moved_key) instead of its member
/// and coordinates, and the block prepares every tap's offsets once, in `taps` (half of the kernel
/// volume entries of shared memory).
__global__ void symmetric_map_moved_kernel(DeviceLookup<uint64_t> lookup, const int32_t* ijk, int64_t rows,
                                           ConvGeometry g, bool forward, int32_t* map) {
    extern __shared__ MovedTap taps[];
    const int32_t volume = g.kernel_volume();
    const MovedAxes axes = prepare_moved_taps(lookup.codec, g, forward, taps);
    const int32_t morton_bits = lookup.codec.morton_bits();
    symmetric_map_entries(rows, volume, map, [&](int64_t row, int32_t t) -> int64_t {
        const MovedTap& tap = taps[t];
        bool inside = true;
        for (int a = 0; a < 3; ++a) {
            const int64_t q = int64_t{ijk[3 * row + a]} + tap.offset[a];
            inside = inside && q >= lookup.lo[a] && q <= lookup.hi[a];
        }
        if (!inside) return -1;
        const uint64_t key = moved_key(lookup.keys[row], axes.bits, tap.spread);
        return lookup.find_key(static_cast<int64_t>(key >> morton_bits), key);
    });
}

/// flags[t * rows + r] = 1 for every edge (tap-major, so one scan numbers the edges per tap in
/// increasing target order); flags[volume * rows] = 0 makes the scan end with the total.
template <typename IndexT>
__global__ void tap_major_flags_kernel(const int32_t* map, int64_t rows, int32_t volume, IndexT* flags) {
    SG_GRID_STRIDE_LOOP(i, rows * volume + 1) {
        if (i == rows * volume) {
            flags[i] = 0;
            continue;
        }
        const int64_t t = divide(i, rows);
        const int64_t r = i - t * rows;
        flags[i] = map[r * volume + t] >= 0;
    }
}

template <typename IndexT>
__global__ void tap_offsets_kernel(const IndexT* position, int64_t rows, int32_t volume, int64_t* tap_offsets) {
    SG_GRID_STRIDE_LOOP(t, volume + 1) { tap_offsets[t] = position[t * rows]; }
}

template <typename IndexT>
__global__ void pairs_scatter_kernel(const int32_t* map, const IndexT* position, int64_t rows, int32_t volume,
                                     int32_t* source_index, int32_t* target_index) {
    SG_GRID_STRIDE_LOOP(i, rows * volume) {
        const int64_t t = divide(i, rows);
        const int64_t r = i - t * rows;
        const int32_t s = map[r * volume + t];
        if (s < 0) continue;
        source_index[position[i]] = s;
        target_index[position[i]] = static_cast<int32_t>(r);
    }
}

/// Each (source, tap) has at most one target, so the scattered writes never collide.
__global__ void transpose_map_kernel(const int32_t* map, int64_t rows, int32_t volume, int32_t* out) {
    SG_GRID_STRIDE_LOOP(i, rows * volume) {
        const int32_t s = map[i];
        if (s < 0) continue;
        const int64_t r = divide(i, volume);
        out[int64_t{s} * volume + (i - r * volume)] = static_cast<int32_t>(r);
    }
}

__global__ void count_edges_kernel(const int32_t* map, int64_t entries, unsigned long long* total) {
    unsigned long long local = 0;
    SG_GRID_STRIDE_LOOP(i, entries) { local += map[i] >= 0; }
    for (int shift = 16; shift > 0; shift /= 2) local += __shfl_down_sync(0xffffffffu, local, shift);
    if ((threadIdx.x & 31) == 0 && local > 0) atomicAdd(total, local);
}

/// Row r of the K = S = 2 subdivision's transposed map: coarse voxel r / 8 at tap r % 8 (the child's
/// Morton offset is its tap index), -1 elsewhere.
__global__ void subdivision_map_kernel(int64_t rows, int32_t* map) {
    SG_GRID_STRIDE_LOOP(i, rows * 8) {
        const int64_t r = i >> 3;
        map[i] = (i & 7) == (r & 7) ? static_cast<int32_t>(r >> 3) : -1;
    }
}

/// pairs_by_tap with flags and positions of IndexT: int32 while the map has fewer than 2^31 entries,
/// which halves the scan's memory against int64.
template <typename IndexT>
PairLists pairs_by_tap_impl(const Buffer<int32_t>& map, int64_t num_target, int32_t kernel_volume, const Context& ctx) {
    const cudaStream_t stream = stream_of(ctx);
    const int64_t entries = num_target * kernel_volume;
    Buffer<IndexT> flags = Buffer<IndexT>::allocate(entries + 1, ctx);
    Buffer<IndexT> position = Buffer<IndexT>::allocate(entries + 1, ctx);
    tap_major_flags_kernel<<<blocks_for(entries + 1), kThreads, 0, stream>>>(map.data(), num_target, kernel_volume,
                                                                             flags.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    cub_call(ctx, [&](void* temp, size_t& bytes) {
        return cub::DeviceScan::ExclusiveSum(temp, bytes, flags.data(), position.data(), entries + 1, stream);
    });
    flags = Buffer<IndexT>();
    Buffer<int64_t> tap_offsets = Buffer<int64_t>::allocate(kernel_volume + 1, ctx);
    tap_offsets_kernel<<<blocks_for(kernel_volume + 1), kThreads, 0, stream>>>(position.data(), num_target,
                                                                               kernel_volume, tap_offsets.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    Readback readback(ctx);
    const size_t slot = readback.enqueue(tap_offsets.data(), kernel_volume + 1);
    readback.wait();
    PairLists pairs;
    pairs.tap_offsets = readback.get<int64_t>(slot, kernel_volume + 1);
    const int64_t total = pairs.tap_offsets.back();
    pairs.source_index = Buffer<int32_t>::allocate(total, ctx);
    pairs.target_index = Buffer<int32_t>::allocate(total, ctx);
    if (total > 0) {
        pairs_scatter_kernel<<<blocks_for(entries), kThreads, 0, stream>>>(map.data(), position.data(), num_target,
                                                                           kernel_volume, pairs.source_index.data(),
                                                                           pairs.target_index.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    return pairs;
}

/// Shared memory of symmetric_map_moved_kernel's taps at most (kernels up to 9 x 9 x 9); larger kernels
/// take symmetric_map_kernel.
constexpr size_t kMovedTapBytes = 16 * 1024;

}  // namespace

}  // namespace sparsegrid::detail::cuda

// ---- backend entry points -------------------------------------------------------------------------

namespace sparsegrid::detail {

using namespace cuda;

Buffer<int32_t> CudaBackend::subdivision_map(const GridStorage& coarse) {
    const Context& ctx = coarse.context;
    DeviceGuard guard(ctx);
    const int64_t rows = 8 * coarse.num_voxels();
    Buffer<int32_t> map = Buffer<int32_t>::allocate(rows * 8, ctx);
    if (rows > 0) {
        subdivision_map_kernel<<<blocks_for(rows * 8), kThreads, 0, stream_of(ctx)>>>(rows, map.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(ctx));
    }
    return map;
}

Buffer<int64_t> CudaBackend::ijk_to_index(const GridStorage& grid, const int32_t* query_ijk,
                                          const std::vector<int64_t>& query_offsets) {
    const Context& ctx = grid.context;
    DeviceGuard guard(ctx);
    const int64_t count = query_offsets.back();
    Buffer<int64_t> result = Buffer<int64_t>::allocate(count, ctx);
    if (count == 0) return result;
    const Buffer<int64_t> offsets = Buffer<int64_t>::from_host(query_offsets, ctx);
    with_lookup(grid, [&](const auto& lookup) {
        ijk_to_index_kernel<<<blocks_for(count), kThreads, 0, stream_of(ctx)>>>(
            lookup, query_ijk, offsets.data(), grid.batch_size(), count, result.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(ctx));
        return 0;
    });
    return result;
}

Buffer<int32_t> CudaBackend::neighbour_map(const GridStorage& source, const GridStorage& target, const ConvGeometry& g,
                                           MapDirection direction, bool symmetric) {
    const Context& ctx = target.context;
    DeviceGuard guard(ctx);
    const int64_t entries = target.num_voxels() * g.kernel_volume();
    Buffer<int32_t> map = Buffer<int32_t>::allocate(entries, ctx);
    if (entries == 0) return map;
    with_lookup(source, [&](const auto& lookup) {
        if (symmetric) {
            CudaBackend::fill_bytes(map.data(), ctx.device, 0xff, static_cast<size_t>(entries) * sizeof(int32_t),
                                    ctx.stream);
            const int64_t work = target.num_voxels() * (g.kernel_volume() / 2 + 1);
            const size_t shared = static_cast<size_t>(g.kernel_volume() / 2) * sizeof(MovedTap);
            if constexpr (std::is_same_v<std::decay_t<decltype(lookup)>, DeviceLookup<uint64_t>>) {
                if (shared <= kMovedTapBytes) {
                    symmetric_map_moved_kernel<<<blocks_for(work), kThreads, shared, stream_of(ctx)>>>(
                        lookup, target.topology.ijk.data(), target.num_voxels(), g, direction == MapDirection::Forward,
                        map.data());
                    SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(ctx));
                    return 0;
                }
            }
            symmetric_map_kernel<<<blocks_for(work), kThreads, 0, stream_of(ctx)>>>(
                lookup, target.topology.ijk.data(), target.topology.offsets_buffer.data(), target.batch_size(),
                target.num_voxels(), g, direction == MapDirection::Forward, map.data());
            SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(ctx));
            return 0;
        }
        neighbour_map_kernel<<<blocks_for(entries), kThreads, 0, stream_of(ctx)>>>(
            lookup, target.topology.ijk.data(), target.topology.offsets_buffer.data(), target.batch_size(),
            target.num_voxels(), g, direction == MapDirection::Forward, map.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(ctx));
        return 0;
    });
    return map;
}

PairLists CudaBackend::pairs_by_tap(const Buffer<int32_t>& map, int64_t num_target, int32_t kernel_volume,
                                    const Context& ctx) {
    DeviceGuard guard(ctx);
    if (num_target * kernel_volume < INT32_MAX) return pairs_by_tap_impl<int32_t>(map, num_target, kernel_volume, ctx);
    return pairs_by_tap_impl<int64_t>(map, num_target, kernel_volume, ctx);
}

Buffer<int32_t> CudaBackend::transpose_map(const Buffer<int32_t>& map, int64_t num_target, int64_t num_source,
                                           int32_t kernel_volume, const Context& ctx) {
    DeviceGuard guard(ctx);
    Buffer<int32_t> result = Buffer<int32_t>::allocate(num_source * kernel_volume, ctx);
    CudaBackend::fill_bytes(result.data(), ctx.device, 0xff, static_cast<size_t>(result.size()) * sizeof(int32_t),
                            ctx.stream);
    const int64_t entries = num_target * kernel_volume;
    if (entries > 0) {
        transpose_map_kernel<<<blocks_for(entries), kThreads, 0, stream_of(ctx)>>>(map.data(), num_target,
                                                                                   kernel_volume, result.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(ctx));
    }
    return result;
}

int64_t CudaBackend::count_edges(const Buffer<int32_t>& map, const Context& ctx) {
    DeviceGuard guard(ctx);
    Buffer<unsigned long long> total = Buffer<unsigned long long>::allocate(1, ctx);
    CudaBackend::fill_bytes(total.data(), ctx.device, 0, sizeof(unsigned long long), ctx.stream);
    if (map.size() > 0) {
        count_edges_kernel<<<blocks_for(map.size()), kThreads, 0, stream_of(ctx)>>>(map.data(), map.size(),
                                                                                    total.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream_of(ctx));
    }
    Readback readback(ctx);
    const size_t slot = readback.enqueue(total.data(), 1);
    readback.wait();
    return static_cast<int64_t>(readback.get<unsigned long long>(slot, 1)[0]);
}

}  // namespace sparsegrid::detail
