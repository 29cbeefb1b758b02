#include "naive_reference.h"

#include <algorithm>
#include <unordered_map>

namespace sparsegrid_tool {

namespace {

constexpr int64_t kKeyBias = int64_t{1} << 15;
constexpr int64_t kMaxInputMagnitude = 16000;  // x2 (+ kernel reach) still fits in 16 bits
constexpr int64_t kMaxKeyMembers = int64_t{1} << 16;

using Coord = std::array<int64_t, 3>;

bool fits_in_key(const Coord& c) {
    for (int64_t value : c)
        if (value < -kKeyBias || value >= kKeyBias) return false;
    return true;
}

uint64_t pack_key(int64_t member, const Coord& c) {
    return (static_cast<uint64_t>(member) << 48) | (static_cast<uint64_t>(c[0] + kKeyBias) << 32) |
        (static_cast<uint64_t>(c[1] + kKeyBias) << 16) | static_cast<uint64_t>(c[2] + kKeyBias);
}

Coord widen(const Vec3i& v) { return {v[0], v[1], v[2]}; }

int64_t floor_div(int64_t a, int64_t b) {
    const int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int32_t kernel_volume(const Vec3i& kernel_size) { return kernel_size[0] * kernel_size[1] * kernel_size[2]; }

/// Calls visit(linear tap index, tap) for every tap in PyTorch weight order (t0 slowest).
template <typename Visit>
void for_each_tap(const Vec3i& kernel_size, Visit&& visit) {
    int32_t t = 0;
    for (int32_t t0 = 0; t0 < kernel_size[0]; ++t0)
        for (int32_t t1 = 0; t1 < kernel_size[1]; ++t1)
            for (int32_t t2 = 0; t2 < kernel_size[2]; ++t2) visit(t++, Coord{t0, t1, t2});
}

Coord padding_before(const Vec3i& kernel_size) {
    return {(kernel_size[0] - 1) / 2, (kernel_size[1] - 1) / 2, (kernel_size[2] - 1) / 2};
}

/// Fine coordinate S*coarse + tap - pb.
Coord fine_of(const Coord& coarse, const Coord& tap, const Vec3i& stride, const Coord& pb) {
    return {stride[0] * coarse[0] + tap[0] - pb[0], stride[1] * coarse[1] + tap[1] - pb[1],
            stride[2] * coarse[2] + tap[2] - pb[2]};
}

/// The coarse c with S*c + tap - pb = fine, if there is one.
bool coarse_of(const Coord& fine, const Coord& tap, const Vec3i& stride, const Coord& pb, Coord& coarse) {
    for (int a = 0; a < 3; ++a) {
        const int64_t numerator = fine[a] + pb[a] - tap[a];
        if (numerator % stride[a] != 0) return false;
        coarse[a] = numerator / stride[a];
    }
    return true;
}

/// Calls emit(member, voxel, keys) for every voxel, then sorts and deduplicates the keys.
template <typename Emit>
KeySet collect_keys(const HostBatch& batch, int64_t candidates_per_voxel, Emit&& emit) {
    KeySet keys;
    keys.reserve(static_cast<std::size_t>(batch.num_voxels() * candidates_per_voxel));
    for (int64_t member = 0; member < batch.batch_size(); ++member)
        for (int64_t v = batch.offsets[member]; v < batch.offsets[member + 1]; ++v)
            emit(member, widen(batch.voxels[v]), keys);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    return keys;
}

uint32_t biased(int32_t c) { return static_cast<uint32_t>(c) ^ 0x80000000u; }

/// Morton comparison: the axis holding the most significant differing bit decides; at equal bit level
/// i comes before j before k.
bool morton_less(const Vec3i& a, const Vec3i& b) {
    int deciding_axis = 0;
    uint32_t deciding_bits = biased(a[0]) ^ biased(b[0]);
    for (int axis = 1; axis < 3; ++axis) {
        const uint32_t bits = biased(a[axis]) ^ biased(b[axis]);
        if (deciding_bits < bits && deciding_bits < (deciding_bits ^ bits)) {
            deciding_axis = axis;
            deciding_bits = bits;
        }
    }
    return biased(a[deciding_axis]) < biased(b[deciding_axis]);
}

}  // namespace

HostBatch flatten(const std::vector<std::vector<Vec3i>>& members) {
    HostBatch batch;
    for (const auto& member : members) {
        batch.voxels.insert(batch.voxels.end(), member.begin(), member.end());
        batch.offsets.push_back(batch.num_voxels());
    }
    return batch;
}

HostBatch host_copy(const sparsegrid::GridBatch& grid) {
    HostBatch batch;
    batch.voxels = grid.ijk_host();
    batch.offsets = grid.voxel_offsets();
    return batch;
}

bool keys_can_represent(const HostBatch& batch) {
    if (batch.batch_size() > kMaxKeyMembers) return false;
    for (const Vec3i& v : batch.voxels)
        for (int32_t c : v)
            if (c < -kMaxInputMagnitude || c > kMaxInputMagnitude) return false;
    return true;
}

KeySet packed_keys(const HostBatch& batch) {
    return collect_keys(batch, 1,
                        [](int64_t member, const Coord& c, KeySet& keys) { keys.push_back(pack_key(member, c)); });
}

KeySet naive_conv_grid(const HostBatch& batch, const Vec3i& kernel_size, const Vec3i& stride) {
    const Coord pb = padding_before(kernel_size);
    return collect_keys(batch, kernel_volume(kernel_size), [&](int64_t member, const Coord& fine, KeySet& keys) {
        for_each_tap(kernel_size, [&](int32_t, const Coord& tap) {
            Coord coarse;
            if (coarse_of(fine, tap, stride, pb, coarse)) keys.push_back(pack_key(member, coarse));
        });
    });
}

KeySet naive_conv_transpose_grid(const HostBatch& batch, const Vec3i& kernel_size, const Vec3i& stride) {
    const Coord pb = padding_before(kernel_size);
    return collect_keys(batch, kernel_volume(kernel_size), [&](int64_t member, const Coord& coarse, KeySet& keys) {
        for_each_tap(kernel_size, [&](int32_t, const Coord& tap) {
            keys.push_back(pack_key(member, fine_of(coarse, tap, stride, pb)));
        });
    });
}

KeySet naive_coarsened_grid(const HostBatch& batch, int32_t factor) {
    return collect_keys(batch, 1, [&](int64_t member, const Coord& c, KeySet& keys) {
        keys.push_back(pack_key(member, {floor_div(c[0], factor), floor_div(c[1], factor), floor_div(c[2], factor)}));
    });
}

KeySet naive_refined_grid(const HostBatch& batch, int32_t factor) {
    const Vec3i block{factor, factor, factor};
    return collect_keys(batch, kernel_volume(block), [&](int64_t member, const Coord& c, KeySet& keys) {
        for_each_tap(block, [&](int32_t, const Coord& offset) {
            keys.push_back(
                pack_key(member, {factor * c[0] + offset[0], factor * c[1] + offset[1], factor * c[2] + offset[2]}));
        });
    });
}

std::vector<int32_t> naive_neighbour_map(const HostBatch& source, const HostBatch& target, const Vec3i& kernel_size,
                                         const Vec3i& stride, sparsegrid::MapDirection direction) {
    std::unordered_map<uint64_t, int32_t> source_index;
    source_index.reserve(static_cast<std::size_t>(source.num_voxels()));
    for (int64_t member = 0; member < source.batch_size(); ++member)
        for (int64_t v = source.offsets[member]; v < source.offsets[member + 1]; ++v)
            source_index.emplace(pack_key(member, widen(source.voxels[v])), static_cast<int32_t>(v));

    const Coord pb = padding_before(kernel_size);
    const int32_t volume = kernel_volume(kernel_size);
    std::vector<int32_t> map(static_cast<std::size_t>(target.num_voxels() * volume), -1);
    for (int64_t member = 0; member < target.batch_size(); ++member)
        for (int64_t row = target.offsets[member]; row < target.offsets[member + 1]; ++row) {
            const Coord here = widen(target.voxels[row]);
            for_each_tap(kernel_size, [&](int32_t t, const Coord& tap) {
                Coord there;
                if (direction == sparsegrid::MapDirection::Forward)
                    there = fine_of(here, tap, stride, pb);
                else if (!coarse_of(here, tap, stride, pb, there))
                    return;
                if (!fits_in_key(there)) return;
                const auto found = source_index.find(pack_key(member, there));
                if (found != source_index.end()) map[row * volume + t] = found->second;
            });
        }
    return map;
}

HostPairLists naive_pairs_by_tap(const std::vector<int32_t>& neighbour_map, int32_t kernel_volume) {
    const int64_t num_target = static_cast<int64_t>(neighbour_map.size()) / kernel_volume;
    HostPairLists pairs;
    pairs.tap_offsets.push_back(0);
    for (int32_t t = 0; t < kernel_volume; ++t) {
        for (int64_t row = 0; row < num_target; ++row) {
            const int32_t source = neighbour_map[row * kernel_volume + t];
            if (source < 0) continue;
            pairs.source_index.push_back(source);
            pairs.target_index.push_back(static_cast<int32_t>(row));
        }
        pairs.tap_offsets.push_back(static_cast<int64_t>(pairs.source_index.size()));
    }
    return pairs;
}

bool is_morton_ordered(const HostBatch& batch) {
    for (int64_t member = 0; member < batch.batch_size(); ++member)
        for (int64_t v = batch.offsets[member] + 1; v < batch.offsets[member + 1]; ++v)
            if (!morton_less(batch.voxels[v - 1], batch.voxels[v])) return false;
    return true;
}

}  // namespace sparsegrid_tool
