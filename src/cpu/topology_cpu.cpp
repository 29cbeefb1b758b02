// CPU backend of the topology operations. Generated grids follow one pattern: emit candidate keys
// (member | Morton code) in parallel, radix-sort, deduplicate, decode. Where the voxel order makes the
// candidates come out sorted already (subdivision and coarsening by the same power of two on every
// axis) the sort is skipped and coordinates are written directly.
#include "backend/backend.h"
#include "core/errors.h"
#include "core/geometry.h"
#include "cpu/grid_keys.h"
#include "cpu/parallel.h"

#include <climits>
#include <cmath>
#include <type_traits>

namespace sparsegrid::detail::cpu {

// ---- shared building blocks -----------------------------------------------------------------------

std::vector<int64_t> exclusive_scan_flags(const uint8_t* flags, int64_t count) {
    std::vector<int64_t> result(static_cast<size_t>(count) + 1);
    std::vector<int64_t> chunk_totals(static_cast<size_t>(omp_get_max_threads()) + 1, 0);
    parallel_chunks(count, [&](int64_t begin, int64_t end, int chunk, int chunks) {
        int64_t running = 0;
        for (int64_t n = begin; n < end; ++n) running += flags[n] != 0;
        chunk_totals[chunk + 1] = running;
#pragma omp barrier
        int64_t base = 0;
        for (int c = 0; c <= chunk; ++c) base += chunk_totals[c];
        for (int64_t n = begin; n < end; ++n) {
            result[n] = base;
            base += flags[n] != 0;
        }
        if (chunk == chunks - 1) result[count] = base;
    });
    if (count == 0) result[0] = 0;
    return result;
}

void sort_keys(std::vector<uint64_t>& keys, int32_t bits) {
    const int64_t n = static_cast<int64_t>(keys.size());
    if (n < 2 || bits <= 0) return;
    // LSD radix sort with at most 11-bit digits, spread evenly over the significant bits.
    const int32_t passes = (bits + 10) / 11;
    const int32_t digit_bits = (bits + passes - 1) / passes;
    const int64_t buckets = int64_t{1} << digit_bits;
    const int max_chunks = threads_for(n);
    std::vector<uint64_t> scratch(keys.size());
    std::vector<int64_t> histogram(static_cast<size_t>(buckets * max_chunks));
    for (int32_t pass = 0; pass < passes; ++pass) {
        const int32_t shift = pass * digit_bits;
        const uint64_t digit_mask = static_cast<uint64_t>(buckets - 1);
        parallel_chunks(n, [&](int64_t begin, int64_t end, int chunk, int chunks) {
            int64_t* local = histogram.data() + chunk * buckets;
            std::fill(local, local + buckets, 0);
            for (int64_t i = begin; i < end; ++i) ++local[(keys[i] >> shift) & digit_mask];
            if (chunks > 1) {
#pragma omp barrier
            }
            // Exclusive positions, digit-major then chunk: stable, so earlier passes' order survives.
            std::vector<int64_t> position(static_cast<size_t>(buckets));
            int64_t total_before = 0;
            for (int64_t d = 0; d < buckets; ++d) {
                for (int c = 0; c < chunks; ++c) {
                    if (c == chunk) position[d] = total_before;
                    total_before += histogram[c * buckets + d];
                }
            }
            for (int64_t i = begin; i < end; ++i) scratch[position[(keys[i] >> shift) & digit_mask]++] = keys[i];
        });
        keys.swap(scratch);
    }
}

void sort_keys(std::vector<Key128>& keys, int32_t) { std::sort(keys.begin(), keys.end()); }

/// Exact box of `count` coordinates (the empty box for none).
CoordBox coordinate_box(const int32_t* ijk, int64_t count) {
    const int max_chunks = threads_for(count);
    std::vector<CoordBox> partial(static_cast<size_t>(max_chunks));
    parallel_chunks(count, [&](int64_t begin, int64_t end, int chunk, int) {
        CoordBox box;
        if (begin < end) box.lo = box.hi = {ijk[3 * begin], ijk[3 * begin + 1], ijk[3 * begin + 2]};
        for (int64_t n = begin; n < end; ++n)
            for (int a = 0; a < 3; ++a) {
                box.lo[a] = std::min(box.lo[a], ijk[3 * n + a]);
                box.hi[a] = std::max(box.hi[a], ijk[3 * n + a]);
            }
        partial[chunk] = box;
    });
    CoordBox box;
    for (const CoordBox& p : partial) box = union_box(box, p);
    return box;
}

GridTopology finish_topology(Buffer<int32_t> ijk, std::vector<int64_t> offsets, const Context& ctx) {
    GridTopology topology;
    topology.box = coordinate_box(ijk.data(), ijk.size() / 3);
    topology.offsets_buffer = Buffer<int64_t>::from_host(offsets, ctx);
    topology.offsets = std::move(offsets);
    topology.ijk = std::move(ijk);
    return topology;
}

template <typename KeyT>
GridTopology canonical_topology(std::vector<KeyT>& keys, const KeyCodec& codec, int64_t batch_size,
                                const Context& ctx) {
    sort_keys(keys, codec.total_bits());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    const int64_t count = static_cast<int64_t>(keys.size());
    // Member m's keys start at m << morton_bits (the member occupies the top bits).
    std::vector<int64_t> offsets(static_cast<size_t>(batch_size) + 1);
    for (int64_t m = 0; m < batch_size; ++m)
        offsets[m] = std::lower_bound(keys.begin(), keys.end(),
                                      static_cast<KeyT>(static_cast<KeyT>(m) << codec.morton_bits())) -
            keys.begin();
    offsets[batch_size] = count;
    Buffer<int32_t> ijk = Buffer<int32_t>::allocate(3 * count, ctx);
    int32_t* out = ijk.data();
    parallel_chunks(count, [&](int64_t begin, int64_t end, int, int) {
        for (int64_t n = begin; n < end; ++n) {
            const DecodedKey d = decode_key<KeyT>(codec, keys[n]);
            out[3 * n] = d.ijk[0];
            out[3 * n + 1] = d.ijk[1];
            out[3 * n + 2] = d.ijk[2];
        }
    });
    return finish_topology(std::move(ijk), std::move(offsets), ctx);
}

template GridTopology canonical_topology<uint64_t>(std::vector<uint64_t>&, const KeyCodec&, int64_t, const Context&);
template GridTopology canonical_topology<Key128>(std::vector<Key128>&, const KeyCodec&, int64_t, const Context&);

namespace {

/// Candidate keys from every voxel: emit(member, voxel, ijk, push) calls push(key) any number of times.
/// Per-chunk vectors are concatenated in chunk order (the result is sorted afterwards anyway).
template <typename KeyT, typename Emit>
std::vector<KeyT> collect_keys(const GridStorage& grid, int64_t expected_per_voxel, Emit&& emit) {
    const int64_t n = grid.num_voxels();
    const int max_chunks = threads_for(n);
    std::vector<std::vector<KeyT>> per_chunk(static_cast<size_t>(max_chunks));
    const int32_t* ijk = grid.topology.ijk.data();
    parallel_chunks(n, [&](int64_t begin, int64_t end, int chunk, int) {
        std::vector<KeyT>& out = per_chunk[chunk];
        out.reserve(static_cast<size_t>((end - begin) * expected_per_voxel));
        // Neighbouring voxels (neighbours in voxel order are mostly neighbours in space) emit mostly the
        // same candidates; a small direct-mapped cache of recent keys drops most repeats before the sort.
        constexpr int kCacheBits = 12;
        // The cache starts filled with the first key, which is emitted, so no slot holds an unseen key.
        std::vector<KeyT> recent;
        auto push = [&out, &recent](KeyT key) {
            if (recent.empty()) {
                recent.assign(size_t{1} << kCacheBits, key);
                out.push_back(key);
                return;
            }
            const uint64_t folded = static_cast<uint64_t>(key) ^ static_cast<uint64_t>(key >> 32 >> 32);
            KeyT& slot = recent[(folded * 0x9E3779B97F4A7C15ull) >> (64 - kCacheBits)];
            if (slot == key) return;
            slot = key;
            out.push_back(key);
        };
        for_each_voxel(grid.topology.offsets, begin, end,
                       [&](int64_t member, int64_t v) { emit(member, v, ijk + 3 * v, push); });
    });
    if (per_chunk.size() == 1) return std::move(per_chunk[0]);
    size_t total = 0;
    for (const auto& part : per_chunk) total += part.size();
    std::vector<KeyT> keys;
    keys.reserve(total);
    for (const auto& part : per_chunk) keys.insert(keys.end(), part.begin(), part.end());
    return keys;
}

/// Children of every voxel under subdivision by 2^p on every axis, written in voxel order without a
/// sort: the Morton code of f*c + a is (code(c) << 3p) | code(a), so the children of a voxel form one
/// contiguous run, in the Morton order of their offsets a.
GridTopology subdivide_sorted(const GridStorage& grid, int32_t log2_factor) {
    const int32_t factor = 1 << log2_factor;
    const int64_t children = int64_t{1} << (3 * log2_factor);
    std::vector<Vec3i> child_offsets(static_cast<size_t>(children));
    for (int64_t r = 0; r < children; ++r) {
        const uint64_t code = static_cast<uint64_t>(r);
        child_offsets[r] = {static_cast<int32_t>(compact_bits3(code >> 2)),
                            static_cast<int32_t>(compact_bits3(code >> 1)), static_cast<int32_t>(compact_bits3(code))};
    }
    const int64_t n = grid.num_voxels();
    const Context& ctx = grid.context;
    Buffer<int32_t> ijk = Buffer<int32_t>::allocate(3 * n * children, ctx);
    int32_t* out = ijk.data();
    const int32_t* in = grid.topology.ijk.data();
    parallel_chunks(n, [&](int64_t begin, int64_t end, int, int) {
        for (int64_t v = begin; v < end; ++v)
            for (int64_t r = 0; r < children; ++r)
                for (int a = 0; a < 3; ++a)
                    out[3 * (v * children + r) + a] = factor * in[3 * v + a] + child_offsets[r][a];
    });
    std::vector<int64_t> offsets(grid.topology.offsets.size());
    for (size_t m = 0; m < offsets.size(); ++m) offsets[m] = grid.topology.offsets[m] * children;
    return finish_topology(std::move(ijk), std::move(offsets), ctx);
}

/// floor(ijk / 2^p) of a grid in voxel order is non-decreasing in voxel order (parents of a Morton
/// run are a Morton run), so deduplicating neighbours suffices.
GridTopology coarsen_sorted(const GridStorage& grid, int32_t log2_factor) {
    const int64_t n = grid.num_voxels();
    const int32_t* in = grid.topology.ijk.data();
    const std::vector<int64_t>& in_offsets = grid.topology.offsets;
    auto parent = [&](int64_t v, int a) { return in[3 * v + a] >> log2_factor; };
    // A voxel starts a new parent when it is first in its member or its parent differs from the previous.
    std::vector<uint8_t> starts(static_cast<size_t>(n));
    parallel_chunks(n, [&](int64_t begin, int64_t end, int, int) {
        for_each_voxel(in_offsets, begin, end, [&](int64_t member, int64_t v) {
            starts[v] = v == in_offsets[member] || parent(v, 0) != parent(v - 1, 0) ||
                parent(v, 1) != parent(v - 1, 1) || parent(v, 2) != parent(v - 1, 2);
        });
    });
    const std::vector<int64_t> position = exclusive_scan_flags(starts.data(), n);
    Buffer<int32_t> ijk = Buffer<int32_t>::allocate(3 * position[n], grid.context);
    int32_t* out = ijk.data();
    parallel_chunks(n, [&](int64_t begin, int64_t end, int, int) {
        for (int64_t v = begin; v < end; ++v)
            if (starts[v])
                for (int a = 0; a < 3; ++a) out[3 * position[v] + a] = parent(v, a);
    });
    std::vector<int64_t> offsets(in_offsets.size());
    for (size_t m = 0; m < offsets.size(); ++m) offsets[m] = position[in_offsets[m]];
    return finish_topology(std::move(ijk), std::move(offsets), grid.context);
}

/// Pushes the keys of every coordinate of the box [lo, hi] of one member. Spreading each axis value
/// once and OR-ing the parts costs 3 spreads per axis value instead of 3 per box voxel.
template <typename KeyT, typename Push>
void push_box_keys(const KeyCodec& codec, int64_t member, const int64_t lo[3], const int64_t hi[3], Push& push) {
    if constexpr (std::is_same_v<KeyT, uint64_t>) {
        constexpr int kMaxSide = 8;
        if (hi[0] - lo[0] < kMaxSide && hi[1] - lo[1] < kMaxSide && hi[2] - lo[2] < kMaxSide) {
            uint64_t parts[3][kMaxSide];
            for (int a = 0; a < 3; ++a)
                for (int64_t c = lo[a]; c <= hi[a]; ++c)
                    parts[a][c - lo[a]] = spread_bits3(codec.bias(static_cast<int32_t>(c))) << (2 - a);
            const uint64_t member_bits = static_cast<uint64_t>(member) << codec.morton_bits();
            for (int64_t c0 = 0; c0 <= hi[0] - lo[0]; ++c0)
                for (int64_t c1 = 0; c1 <= hi[1] - lo[1]; ++c1) {
                    const uint64_t high = member_bits | parts[0][c0] | parts[1][c1];
                    for (int64_t c2 = 0; c2 <= hi[2] - lo[2]; ++c2) push(high | parts[2][c2]);
                }
            return;
        }
    }
    for (int64_t c0 = lo[0]; c0 <= hi[0]; ++c0)
        for (int64_t c1 = lo[1]; c1 <= hi[1]; ++c1)
            for (int64_t c2 = lo[2]; c2 <= hi[2]; ++c2)
                push(encode_key<KeyT>(codec, member, static_cast<int32_t>(c0), static_cast<int32_t>(c1),
                                      static_cast<int32_t>(c2)));
}

}  // namespace

/// The voxels for which keep(member, v) holds, in order; with `kept_index`, also their indices in `grid`.
template <typename Keep>
GridTopology select_voxels(const GridStorage& grid, Keep&& keep, Buffer<int64_t>* kept_index) {
    const int64_t n = grid.num_voxels();
    const std::vector<int64_t>& in_offsets = grid.topology.offsets;
    std::vector<uint8_t> flags(static_cast<size_t>(n));
    parallel_chunks(n, [&](int64_t begin, int64_t end, int, int) {
        for_each_voxel(in_offsets, begin, end, [&](int64_t member, int64_t v) { flags[v] = keep(member, v); });
    });
    const std::vector<int64_t> position = exclusive_scan_flags(flags.data(), n);
    Buffer<int32_t> ijk = Buffer<int32_t>::allocate(3 * position[n], grid.context);
    if (kept_index) *kept_index = Buffer<int64_t>::allocate(position[n], grid.context);
    int32_t* out = ijk.data();
    int64_t* index_out = kept_index ? kept_index->data() : nullptr;
    const int32_t* in = grid.topology.ijk.data();
    parallel_chunks(n, [&](int64_t begin, int64_t end, int, int) {
        for (int64_t v = begin; v < end; ++v) {
            if (!flags[v]) continue;
            for (int a = 0; a < 3; ++a) out[3 * position[v] + a] = in[3 * v + a];
            if (index_out) index_out[position[v]] = v;
        }
    });
    std::vector<int64_t> offsets(in_offsets.size());
    for (size_t m = 0; m < offsets.size(); ++m) offsets[m] = position[in_offsets[m]];
    return finish_topology(std::move(ijk), std::move(offsets), grid.context);
}

}  // namespace sparsegrid::detail::cpu

// ---- backend entry points -------------------------------------------------------------------------

namespace sparsegrid::detail {

using namespace cpu;

GridTopology CpuBackend::build_from_ijk(const int32_t* ijk, const std::vector<int64_t>& offsets, const Context& ctx) {
    const int64_t batch_size = static_cast<int64_t>(offsets.size()) - 1;
    const int64_t count = offsets.back();
    const KeyCodec codec = make_codec(coordinate_box(ijk, count), batch_size);
    return with_key_type(codec, [&](auto key_tag) {
        using KeyT = decltype(key_tag);
        std::vector<KeyT> keys(static_cast<size_t>(count));
        parallel_chunks(count, [&](int64_t begin, int64_t end, int, int) {
            for_each_voxel(offsets, begin, end, [&](int64_t member, int64_t n) {
                keys[n] = encode_key<KeyT>(codec, member, ijk[3 * n], ijk[3 * n + 1], ijk[3 * n + 2]);
            });
        });
        return canonical_topology(keys, codec, batch_size, ctx);
    });
}

Buffer<int32_t> CpuBackend::points_to_ijk(const double* xyz, const std::vector<int64_t>& offsets,
                                          const std::vector<MemberTransform>& transforms, int64_t* first_bad,
                                          const Context& ctx) {
    const int64_t count = offsets.back();
    Buffer<int32_t> ijk = Buffer<int32_t>::allocate(3 * count, ctx);
    int32_t* out = ijk.data();
    const int max_chunks = threads_for(count);
    std::vector<int64_t> chunk_bad(static_cast<size_t>(max_chunks), INT64_MAX);
    parallel_chunks(count, [&](int64_t begin, int64_t end, int chunk, int) {
        for_each_voxel(offsets, begin, end, [&](int64_t member, int64_t n) {
            const MemberTransform& t = transforms[member];
            for (int a = 0; a < 3; ++a) {
                const double index = point_to_index(xyz[3 * n + a], t.origin[a], t.voxel_size[a]);
                // NaN fails both comparisons, so it is caught here too.
                if (!index_in_int32(index)) {
                    chunk_bad[chunk] = std::min(chunk_bad[chunk], n);
                    out[3 * n + a] = 0;
                } else {
                    out[3 * n + a] = static_cast<int32_t>(index);
                }
            }
        });
    });
    const int64_t bad = *std::min_element(chunk_bad.begin(), chunk_bad.end());
    *first_bad = bad == INT64_MAX ? -1 : bad;
    return ijk;
}

GridTopology CpuBackend::conv_grid(const GridStorage& grid, const ConvGeometry& g, const CoordBox& out_box) {
    const KeyCodec codec = make_codec(out_box, grid.batch_size());
    const int64_t per_voxel = conv_grid_candidates_per_voxel(g);
    return with_key_type(codec, [&](auto key_tag) {
        using KeyT = decltype(key_tag);
        std::vector<KeyT> keys = collect_keys<KeyT>(grid, per_voxel,
                                                    [&](int64_t member, int64_t, const int32_t* v, auto& push) {
                                                        int64_t lo[3], hi[3];
                                                        for (int a = 0; a < 3; ++a)
                                                            g.coarse_range(a, v[a], &lo[a], &hi[a]);
                                                        push_box_keys<KeyT>(codec, member, lo, hi, push);
                                                    });
        return canonical_topology(keys, codec, grid.batch_size(), grid.context);
    });
}

std::vector<GridTopology> CpuBackend::conv_grids(const GridStorage& grid, const std::vector<ConvGeometry>& gs,
                                                 const std::vector<CoordBox>& out_boxes) {
    std::vector<GridTopology> topologies;
    topologies.reserve(gs.size());
    for (size_t i = 0; i < gs.size(); ++i) topologies.push_back(conv_grid(grid, gs[i], out_boxes[i]));
    return topologies;
}

GridTopology CpuBackend::conv_transpose_grid(const GridStorage& grid, const ConvGeometry& g, const CoordBox& out_box) {
    const KeyCodec codec = make_codec(out_box, grid.batch_size());
    const int32_t volume = g.kernel_volume();
    return with_key_type(codec, [&](auto key_tag) {
        using KeyT = decltype(key_tag);
        std::vector<KeyT> keys = collect_keys<KeyT>(
            grid, volume, [&](int64_t member, int64_t, const int32_t* v, auto& push) {
                for (int32_t t0 = 0; t0 < g.kernel[0]; ++t0)
                    for (int32_t t1 = 0; t1 < g.kernel[1]; ++t1)
                        for (int32_t t2 = 0; t2 < g.kernel[2]; ++t2)
                            push(encode_key<KeyT>(codec, member, static_cast<int32_t>(g.fine_of(0, v[0], t0)),
                                                  static_cast<int32_t>(g.fine_of(1, v[1], t1)),
                                                  static_cast<int32_t>(g.fine_of(2, v[2], t2))));
            });
        return canonical_topology(keys, codec, grid.batch_size(), grid.context);
    });
}

GridTopology CpuBackend::coarsened_grid(const GridStorage& grid, const Vec3i& factor, const CoordBox& out_box) {
    const KeyCodec codec = make_codec(out_box, grid.batch_size());
    return with_key_type(codec, [&](auto key_tag) {
        using KeyT = decltype(key_tag);
        std::vector<KeyT> keys = collect_keys<KeyT>(
            grid, 1, [&](int64_t member, int64_t, const int32_t* v, auto& push) {
                push(encode_key<KeyT>(codec, member, static_cast<int32_t>(floor_div(v[0], factor[0])),
                                      static_cast<int32_t>(floor_div(v[1], factor[1])),
                                      static_cast<int32_t>(floor_div(v[2], factor[2]))));
            });
        return canonical_topology(keys, codec, grid.batch_size(), grid.context);
    });
}

GridTopology CpuBackend::refined_grid(const GridStorage& grid, const Vec3i& factor, const CoordBox& out_box) {
    const KeyCodec codec = make_codec(out_box, grid.batch_size());
    const int64_t children = int64_t{factor[0]} * factor[1] * factor[2];
    return with_key_type(codec, [&](auto key_tag) {
        using KeyT = decltype(key_tag);
        std::vector<KeyT> keys = collect_keys<KeyT>(
            grid, children, [&](int64_t member, int64_t, const int32_t* v, auto& push) {
                const int64_t lo[3] = {int64_t{factor[0]} * v[0], int64_t{factor[1]} * v[1], int64_t{factor[2]} * v[2]};
                const int64_t hi[3] = {lo[0] + factor[0] - 1, lo[1] + factor[1] - 1, lo[2] + factor[2] - 1};
                push_box_keys<KeyT>(codec, member, lo, hi, push);
            });
        return canonical_topology(keys, codec, grid.batch_size(), grid.context);
    });
}

GridTopology CpuBackend::coarsened_by_power_of_two(const GridStorage& grid, int32_t log2_factor, const CoordBox&) {
    return coarsen_sorted(grid, log2_factor);
}

GridTopology CpuBackend::refined_by_power_of_two(const GridStorage& grid, int32_t log2_factor, const CoordBox&) {
    return subdivide_sorted(grid, log2_factor);
}

GridTopology CpuBackend::pruned_grid(const GridStorage& grid, const uint8_t* mask, Buffer<int64_t>* kept_index) {
    return select_voxels(
        grid, [mask](int64_t, int64_t v) { return mask[v] != 0; }, kept_index);
}

GridTopology CpuBackend::clipped_grid(const GridStorage& grid, const int32_t* boxes, Buffer<int64_t>* kept_index) {
    const int32_t* ijk = grid.topology.ijk.data();
    return select_voxels(
        grid,
        [ijk, boxes](int64_t member, int64_t v) {
            const int32_t* box = boxes + 6 * member;
            for (int a = 0; a < 3; ++a)
                if (ijk[3 * v + a] < box[a] || ijk[3 * v + a] > box[3 + a]) return false;
            return true;
        },
        kept_index);
}

Buffer<int32_t> CpuBackend::bbox(const GridStorage& grid) {
    const int64_t batch_size = grid.batch_size();
    const std::vector<int64_t>& offsets = grid.topology.offsets;
    std::vector<int32_t> boxes(static_cast<size_t>(6 * batch_size));
    for (int64_t m = 0; m < batch_size; ++m) {
        const CoordBox box = coordinate_box(grid.topology.ijk.data() + 3 * offsets[m], offsets[m + 1] - offsets[m]);
        for (int a = 0; a < 3; ++a) {
            boxes[6 * m + a] = box.lo[a];
            boxes[6 * m + 3 + a] = box.hi[a];
        }
    }
    return Buffer<int32_t>::from_host(boxes, grid.context);
}

GridTopology CpuBackend::merged_grid(const GridStorage& a, const GridStorage& b, const CoordBox& out_box) {
    const KeyCodec codec = make_codec(out_box, a.batch_size());
    return with_key_type(codec, [&](auto key_tag) {
        using KeyT = decltype(key_tag);
        std::vector<KeyT> keys = encode_grid_keys<KeyT>(a, codec);
        const std::vector<KeyT> other = encode_grid_keys<KeyT>(b, codec);
        keys.insert(keys.end(), other.begin(), other.end());
        return canonical_topology(keys, codec, a.batch_size(), a.context);
    });
}

}  // namespace sparsegrid::detail
