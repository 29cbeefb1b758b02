// CPU backend of lookups and kernel maps. Lookups go through an open-addressing hash table over the
// source grid's 64-bit keys (the same table design as the CUDA backend); a row's queries are computed
// and their slots prefetched before any is probed, so the cache misses overlap. Grids whose keys need
// 128 bits are searched in their sorted keys instead, galloping from the previous answer of each tap.
#include "backend/backend.h"
#include "core/geometry.h"
#include "cpu/grid_keys.h"
#include "cpu/parallel.h"

#include <climits>

namespace sparsegrid::detail::cpu {

namespace {

/// First position in [lo, hi) whose key is >= value, searched outwards from `hint` in doubling steps.
template <typename KeyT>
int64_t gallop_lower_bound(const KeyT* keys, int64_t lo, int64_t hi, int64_t hint, KeyT value) {
    if (lo >= hi) return lo;
    hint = std::min(std::max(hint, lo), hi - 1);
    if (keys[hint] < value) {
        int64_t below = hint, step = 1, probe = hint + 1;
        while (probe < hi && keys[probe] < value) {
            below = probe;
            step *= 2;
            probe = hint + step;
        }
        return std::lower_bound(keys + below + 1, keys + std::min(probe, hi), value) - keys;
    }
    int64_t at_or_above = hint, step = 1, probe = hint - 1;
    while (probe >= lo && keys[probe] >= value) {
        at_or_above = probe;
        step *= 2;
        probe = hint - step;
    }
    return std::lower_bound(keys + std::max(probe + 1, lo), keys + at_or_above, value) - keys;
}

/// Shared part of the lookups: the grid's box and codec, and the key of a query coordinate.
template <typename KeyT>
class LookupBase {
public:
    explicit LookupBase(const GridStorage& grid)
        : m_offsets(grid.topology.offsets),
          m_box(grid.topology.box),
          m_codec(make_codec(grid.topology.box, grid.batch_size())) {}

    /// The key of voxel q of `member`; false when q lies outside the grid's box (then it is absent).
    bool key_of(int64_t member, const int64_t q[3], KeyT* key) const {
        if (m_box.empty()) return false;
        for (int a = 0; a < 3; ++a)
            if (q[a] < m_box.lo[a] || q[a] > m_box.hi[a]) return false;
        *key = encode_key<KeyT>(m_codec, member, static_cast<int32_t>(q[0]), static_cast<int32_t>(q[1]),
                                static_cast<int32_t>(q[2]));
        return true;
    }

protected:
    const std::vector<int64_t>& m_offsets;
    CoordBox m_box;
    KeyCodec m_codec;
};

/// Sorted keys of the grid, searched by galloping from a per-caller hint.
template <typename KeyT>
class SortedLookup : public LookupBase<KeyT> {
public:
    explicit SortedLookup(const GridStorage& grid)
        : LookupBase<KeyT>(grid), m_keys(encode_grid_keys<KeyT>(grid, this->m_codec)) {}

    void prefetch(KeyT) const {}
    /// Index of the voxel with `key` in `member`, or -1; `hint` is a position near the answer and is
    /// updated to it.
    int64_t find_key(int64_t member, KeyT key, int64_t& hint) const {
        const int64_t end = this->m_offsets[member + 1];
        const int64_t pos = gallop_lower_bound(m_keys.data(), this->m_offsets[member], end, hint, key);
        hint = pos;
        return pos < end && m_keys[pos] == key ? pos : -1;
    }

private:
    std::vector<KeyT> m_keys;
};

/// Open-addressing hash table (linear probing, at most half full) over 64-bit keys; the all-ones key,
/// which no voxel has, marks an empty slot.
class HashLookup : public LookupBase<uint64_t> {
public:
    explicit HashLookup(const GridStorage& grid) : LookupBase<uint64_t>(grid) {
        const std::vector<uint64_t> keys = encode_grid_keys<uint64_t>(grid, m_codec);
        const int64_t n = static_cast<int64_t>(keys.size());
        const uint64_t capacity = hash_capacity(n);
        m_mask = capacity - 1;
        m_slots.assign(capacity, ~uint64_t{0});
        m_values.assign(capacity, -1);
        uint64_t* slots = m_slots.data();
        parallel_chunks(n, [&](int64_t begin, int64_t end, int, int) {
            for (int64_t v = begin; v < end; ++v) {
                for (uint64_t slot = hash_slot(keys[v], m_mask);; slot = (slot + 1) & m_mask) {
                    uint64_t expected = ~uint64_t{0};
                    if (__atomic_compare_exchange_n(&slots[slot], &expected, keys[v], false, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED)) {
                        m_values[slot] = static_cast<int32_t>(v);
                        break;
                    }
                }
            }
        });
    }

    void prefetch(uint64_t key) const { __builtin_prefetch(&m_slots[hash_slot(key, m_mask)]); }
    int64_t find_key(int64_t, uint64_t key, int64_t&) const {
        for (uint64_t slot = hash_slot(key, m_mask);; slot = (slot + 1) & m_mask) {
            const uint64_t stored = m_slots[slot];
            if (stored == key) return m_values[slot];
            if (stored == ~uint64_t{0}) return -1;
        }
    }

private:
    uint64_t m_mask = 0;
    std::vector<uint64_t> m_slots;
    std::vector<int32_t> m_values;
};

/// Runs fn with the lookup of `grid`: the hash table for 64-bit keys, the sorted search otherwise; built
/// once per grid and kept with it (GridCache).
template <typename Fn>
auto with_lookup(const GridStorage& grid, Fn&& fn) {
    const KeyCodec codec = make_codec(grid.topology.box, grid.batch_size());
    if (codec.fits_64()) {
        const auto lookup = cached_lookup<HashLookup>(grid, [&] { return HashLookup(grid); });
        return fn(*lookup, uint64_t{});
    }
    const auto lookup = cached_lookup<SortedLookup<Key128>>(grid, [&] { return SortedLookup<Key128>(grid); });
    return fn(*lookup, Key128{});
}

}  // namespace

}  // namespace sparsegrid::detail::cpu

// ---- backend entry points -------------------------------------------------------------------------

namespace sparsegrid::detail {

using namespace cpu;

Buffer<int64_t> CpuBackend::ijk_to_index(const GridStorage& grid, const int32_t* query_ijk,
                                         const std::vector<int64_t>& query_offsets) {
    const int64_t count = query_offsets.back();
    Buffer<int64_t> result = Buffer<int64_t>::allocate(count, grid.context);
    int64_t* out = result.data();
    with_lookup(grid, [&](const auto& lookup, auto key_tag) {
        using KeyT = decltype(key_tag);
        parallel_chunks(count, [&](int64_t begin, int64_t end, int, int) {
            int64_t hint = 0;
            for_each_voxel(query_offsets, begin, end, [&](int64_t member, int64_t n) {
                const int64_t q[3] = {query_ijk[3 * n], query_ijk[3 * n + 1], query_ijk[3 * n + 2]};
                KeyT key{};
                out[n] = lookup.key_of(member, q, &key) ? lookup.find_key(member, key, hint) : -1;
            });
        });
        return 0;
    });
    return result;
}

Buffer<int32_t> CpuBackend::neighbour_map(const GridStorage& source, const GridStorage& target, const ConvGeometry& g,
                                          MapDirection direction, bool symmetric) {
    const int32_t volume = g.kernel_volume();
    const int64_t rows = target.num_voxels();
    Buffer<int32_t> map = Buffer<int32_t>::allocate(rows * volume, target.context);
    int32_t* out = map.data();
    const int32_t* target_ijk = target.topology.ijk.data();
    // With symmetry only taps below the centre are searched; the centre is the voxel itself and the
    // taps above are filled from the mirrored edges afterwards.
    const int32_t searched = symmetric ? volume / 2 : volume;
    with_lookup(source, [&](const auto& lookup, auto key_tag) {
        using KeyT = decltype(key_tag);
        parallel_chunks(rows, [&](int64_t begin, int64_t end, int, int) {
            std::vector<int64_t> hints(static_cast<size_t>(searched), 0);
            // Per axis and tap: the source coordinate, and whether it exists (strides divide).
            std::vector<int64_t> source_coord[3];
            std::vector<uint8_t> valid[3];
            for (int a = 0; a < 3; ++a) {
                source_coord[a].resize(static_cast<size_t>(g.kernel[a]));
                valid[a].resize(static_cast<size_t>(g.kernel[a]));
            }
            // The row's queries: every key is computed and prefetched before the first probe.
            std::vector<KeyT> keys(static_cast<size_t>(searched));
            std::vector<int32_t> query_taps(static_cast<size_t>(searched));
            for_each_voxel(target.topology.offsets, begin, end, [&](int64_t member, int64_t n) {
                const int32_t* x = target_ijk + 3 * n;
                for (int a = 0; a < 3; ++a)
                    for (int32_t tap = 0; tap < g.kernel[a]; ++tap) {
                        if (direction == MapDirection::Forward) {
                            source_coord[a][tap] = g.fine_of(a, x[a], tap);
                            valid[a][tap] = 1;
                        } else {
                            valid[a][tap] = g.coarse_of(a, x[a], tap, &source_coord[a][tap]);
                        }
                    }
                int32_t* row = out + n * volume;
                int32_t t = 0;
                int32_t queries = 0;
                for (int32_t t0 = 0; t0 < g.kernel[0] && t < searched; ++t0)
                    for (int32_t t1 = 0; t1 < g.kernel[1] && t < searched; ++t1)
                        for (int32_t t2 = 0; t2 < g.kernel[2] && t < searched; ++t2, ++t) {
                            row[t] = -1;
                            if (!(valid[0][t0] && valid[1][t1] && valid[2][t2])) continue;
                            const int64_t q[3] = {source_coord[0][t0], source_coord[1][t1], source_coord[2][t2]};
                            if (!lookup.key_of(member, q, &keys[queries])) continue;
                            lookup.prefetch(keys[queries]);
                            query_taps[queries++] = t;
                        }
                for (int32_t i = 0; i < queries; ++i) {
                    const int32_t tap = query_taps[i];
                    row[tap] = static_cast<int32_t>(lookup.find_key(member, keys[i], hints[tap]));
                }
                if (symmetric) {
                    row[searched] = static_cast<int32_t>(n);
                    std::fill(row + searched + 1, row + volume, -1);
                }
            });
        });
        return 0;
    });
    if (symmetric) {
        // Each (m, V-1-t) is the mirror of exactly one (n, t), so the scattered writes never collide.
        parallel_chunks(rows, [&](int64_t begin, int64_t end, int, int) {
            for (int64_t n = begin; n < end; ++n)
                for (int32_t t = 0; t < searched; ++t) {
                    const int32_t m = out[n * volume + t];
                    if (m >= 0) out[int64_t{m} * volume + (volume - 1 - t)] = static_cast<int32_t>(n);
                }
        });
    }
    return map;
}

PairLists CpuBackend::pairs_by_tap(const Buffer<int32_t>& map, int64_t num_target, int32_t kernel_volume,
                                   const Context& ctx) {
    const int32_t* entries = map.data();
    const int max_chunks = threads_for(num_target);
    // counts[chunk][t]: edges of tap t among the chunk's target rows.
    std::vector<int64_t> counts(static_cast<size_t>(max_chunks) * kernel_volume, 0);
    PairLists pairs;
    pairs.tap_offsets.assign(static_cast<size_t>(kernel_volume) + 1, 0);
    int used_chunks = 1;
    parallel_chunks(num_target, [&](int64_t begin, int64_t end, int chunk, int chunks) {
        int64_t* local = counts.data() + int64_t{chunk} * kernel_volume;
        for (int64_t r = begin; r < end; ++r)
            for (int32_t t = 0; t < kernel_volume; ++t) local[t] += entries[r * kernel_volume + t] >= 0;
        if (chunk == 0) used_chunks = chunks;
    });
    // Tap-major, then chunk order: within a tap, edges stay in increasing target index.
    std::vector<int64_t> chunk_start(counts.size());
    int64_t total = 0;
    for (int32_t t = 0; t < kernel_volume; ++t) {
        pairs.tap_offsets[t] = total;
        for (int c = 0; c < used_chunks; ++c) {
            chunk_start[int64_t{c} * kernel_volume + t] = total;
            total += counts[int64_t{c} * kernel_volume + t];
        }
    }
    pairs.tap_offsets[kernel_volume] = total;
    pairs.source_index = Buffer<int32_t>::allocate(total, ctx);
    pairs.target_index = Buffer<int32_t>::allocate(total, ctx);
    int32_t* source_out = pairs.source_index.data();
    int32_t* target_out = pairs.target_index.data();
    parallel_chunks(num_target, [&](int64_t begin, int64_t end, int chunk, int) {
        int64_t* next = chunk_start.data() + int64_t{chunk} * kernel_volume;
        for (int64_t r = begin; r < end; ++r)
            for (int32_t t = 0; t < kernel_volume; ++t) {
                const int32_t s = entries[r * kernel_volume + t];
                if (s < 0) continue;
                source_out[next[t]] = s;
                target_out[next[t]] = static_cast<int32_t>(r);
                ++next[t];
            }
    });
    return pairs;
}

Buffer<int32_t> CpuBackend::transpose_map(const Buffer<int32_t>& map, int64_t num_target, int64_t num_source,
                                          int32_t kernel_volume, const Context& ctx) {
    Buffer<int32_t> result = Buffer<int32_t>::allocate(num_source * kernel_volume, ctx);
    int32_t* out = result.data();
    const int32_t* entries = map.data();
    parallel_chunks(num_source * kernel_volume,
                    [&](int64_t begin, int64_t end, int, int) { std::fill(out + begin, out + end, -1); });
    // Each (source, tap) has at most one target, so the scattered writes never collide.
    parallel_chunks(num_target, [&](int64_t begin, int64_t end, int, int) {
        for (int64_t r = begin; r < end; ++r)
            for (int32_t t = 0; t < kernel_volume; ++t) {
                const int32_t s = entries[r * kernel_volume + t];
                if (s >= 0) out[int64_t{s} * kernel_volume + t] = static_cast<int32_t>(r);
            }
    });
    return result;
}

Buffer<int32_t> CpuBackend::subdivision_map(const GridStorage& coarse) {
    const int64_t rows = 8 * coarse.num_voxels();
    Buffer<int32_t> map = Buffer<int32_t>::allocate(rows * 8, coarse.context);
    int32_t* out = map.data();
    parallel_chunks(rows, [&](int64_t begin, int64_t end, int, int) {
        for (int64_t r = begin; r < end; ++r)
            for (int64_t t = 0; t < 8; ++t) out[r * 8 + t] = t == (r & 7) ? static_cast<int32_t>(r >> 3) : -1;
    });
    return map;
}

int64_t CpuBackend::count_edges(const Buffer<int32_t>& map, const Context&) {
    const int32_t* entries = map.data();
    int64_t total = 0;
    const int64_t n = map.size();
#pragma omp parallel for reduction(+ : total) schedule(static) if (n >= kSerialThreshold)
    for (int64_t i = 0; i < n; ++i) total += entries[i] >= 0;
    return total;
}

}  // namespace sparsegrid::detail
