#include "oracle.h"

#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>
#include <utility>

namespace sparsegrid_test {

namespace {

constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

Coord64 widen(const Vec3i& c) { return {c[0], c[1], c[2]}; }

int64_t pad_before(int32_t kernel_size) { return (static_cast<int64_t>(kernel_size) - 1) / 2; }

}  // namespace

uint32_t biased(int32_t c) { return static_cast<uint32_t>(static_cast<int64_t>(c) + (int64_t{1} << 31)); }

bool morton_less(const Vec3i& a, const Vec3i& b) {
    for (int level = 31; level >= 0; --level) {
        for (int axis = 0; axis < 3; ++axis) {
            const uint32_t bit_a = (biased(a[axis]) >> level) & 1u;
            const uint32_t bit_b = (biased(b[axis]) >> level) & 1u;
            if (bit_a != bit_b) return bit_a < bit_b;
        }
    }
    return false;  // equal
}

int64_t floor_div(int64_t a, int64_t b) {
    if (b <= 0) throw std::logic_error("floor_div: b must be > 0");
    int64_t q = a / b;
    if (a % b != 0 && a < 0) q -= 1;
    return q;
}

int64_t floor_mod(int64_t a, int64_t b) { return a - floor_div(a, b) * b; }

int64_t kernel_volume(const Vec3i& kernel_size) {
    return static_cast<int64_t>(kernel_size[0]) * kernel_size[1] * kernel_size[2];
}

std::array<int64_t, 3> tap_of_index(int64_t t, const Vec3i& kernel_size) {
    const int64_t k1 = kernel_size[1];
    const int64_t k2 = kernel_size[2];
    return {t / (k1 * k2), (t / k2) % k1, t % k2};
}

OracleBatch oracle_from_lists(const MemberLists& members) {
    OracleBatch out(members.size());
    for (std::size_t m = 0; m < members.size(); ++m)
        for (const Vec3i& c : members[m]) out[m].insert(widen(c));
    return out;
}

bool fits_int32(const OracleBatch& batch) {
    for (const OracleMember& member : batch)
        for (const Coord64& c : member)
            for (int a = 0; a < 3; ++a)
                if (c[a] < kInt32Min || c[a] > kInt32Max) return false;
    return true;
}

std::vector<Vec3i> morton_sorted(const OracleMember& member) {
    std::vector<Vec3i> out;
    out.reserve(member.size());
    for (const Coord64& c : member) {
        for (int a = 0; a < 3; ++a)
            if (c[a] < kInt32Min || c[a] > kInt32Max) throw std::logic_error("morton_sorted: coordinate outside int32");
        out.push_back({static_cast<int32_t>(c[0]), static_cast<int32_t>(c[1]), static_cast<int32_t>(c[2])});
    }
    std::sort(out.begin(), out.end(), morton_less);
    return out;
}

OracleBatch oracle_conv_grid(const OracleBatch& fine, const Vec3i& kernel_size, const Vec3i& stride) {
    OracleBatch out(fine.size());
    const int64_t kvol = kernel_volume(kernel_size);
    for (std::size_t m = 0; m < fine.size(); ++m) {
        for (const Coord64& f : fine[m]) {
            // c is an output voxel iff S*c = f - tap + pb for some tap: try every tap.
            for (int64_t t = 0; t < kvol; ++t) {
                const std::array<int64_t, 3> tap = tap_of_index(t, kernel_size);
                Coord64 c{};
                bool integral = true;
                for (int a = 0; a < 3; ++a) {
                    const int64_t scaled = f[a] - tap[a] + pad_before(kernel_size[a]);
                    if (floor_mod(scaled, stride[a]) != 0) integral = false;
                    c[a] = floor_div(scaled, stride[a]);
                }
                if (integral) out[m].insert(c);
            }
        }
    }
    return out;
}

OracleBatch oracle_conv_transpose_grid(const OracleBatch& coarse, const Vec3i& kernel_size, const Vec3i& stride) {
    OracleBatch out(coarse.size());
    const int64_t kvol = kernel_volume(kernel_size);
    for (std::size_t m = 0; m < coarse.size(); ++m) {
        for (const Coord64& c : coarse[m]) {
            for (int64_t t = 0; t < kvol; ++t) {
                const std::array<int64_t, 3> tap = tap_of_index(t, kernel_size);
                Coord64 f{};
                for (int a = 0; a < 3; ++a) f[a] = stride[a] * c[a] + tap[a] - pad_before(kernel_size[a]);
                out[m].insert(f);
            }
        }
    }
    return out;
}

OracleBatch oracle_coarsened_grid(const OracleBatch& grid, const Vec3i& factor) {
    OracleBatch out(grid.size());
    for (std::size_t m = 0; m < grid.size(); ++m)
        for (const Coord64& c : grid[m])
            out[m].insert({floor_div(c[0], factor[0]), floor_div(c[1], factor[1]), floor_div(c[2], factor[2])});
    return out;
}

OracleBatch oracle_refined_grid(const MemberLists& members, const Vec3i& factor, const std::vector<uint8_t>& mask) {
    OracleBatch out(members.size());
    std::size_t global = 0;
    for (std::size_t m = 0; m < members.size(); ++m) {
        for (const Vec3i& c : members[m]) {
            const bool keep = mask.empty() || mask.at(global) != 0;
            ++global;
            if (!keep) continue;
            for (int64_t di = 0; di < factor[0]; ++di)
                for (int64_t dj = 0; dj < factor[1]; ++dj)
                    for (int64_t dk = 0; dk < factor[2]; ++dk)
                        out[m].insert({factor[0] * static_cast<int64_t>(c[0]) + di,
                                       factor[1] * static_cast<int64_t>(c[1]) + dj,
                                       factor[2] * static_cast<int64_t>(c[2]) + dk});
        }
    }
    return out;
}

OracleBatch oracle_dilated_grid(const OracleBatch& grid, int64_t distance) {
    OracleBatch out(grid.size());
    for (std::size_t m = 0; m < grid.size(); ++m)
        for (const Coord64& c : grid[m])
            for (int64_t di = -distance; di <= distance; ++di)
                for (int64_t dj = -distance; dj <= distance; ++dj)
                    for (int64_t dk = -distance; dk <= distance; ++dk) out[m].insert({c[0] + di, c[1] + dj, c[2] + dk});
    return out;
}

OracleBatch oracle_pruned_grid(const MemberLists& members, const std::vector<uint8_t>& mask) {
    OracleBatch out(members.size());
    std::size_t global = 0;
    for (std::size_t m = 0; m < members.size(); ++m)
        for (const Vec3i& c : members[m])
            if (mask.at(global++) != 0) out[m].insert(widen(c));
    return out;
}

OracleBatch oracle_merged_grid(const OracleBatch& a, const OracleBatch& b) {
    if (a.size() != b.size()) throw std::logic_error("oracle_merged_grid: batch sizes differ");
    OracleBatch out = a;
    for (std::size_t m = 0; m < b.size(); ++m) out[m].insert(b[m].begin(), b[m].end());
    return out;
}

std::vector<int32_t> oracle_neighbour_map(const MemberLists& source, const MemberLists& target,
                                          const Vec3i& kernel_size, const Vec3i& stride,
                                          sparsegrid::MapDirection direction) {
    if (source.size() != target.size()) throw std::logic_error("oracle_neighbour_map: batch sizes differ");
    const bool forward = direction == sparsegrid::MapDirection::Forward;
    const MemberLists& fine = forward ? source : target;
    const MemberLists& coarse = forward ? target : source;

    // (member, fine coordinate) -> global index of the fine voxel in its own grid.
    std::map<std::pair<std::size_t, Coord64>, int64_t> fine_index;
    int64_t running = 0;
    for (std::size_t m = 0; m < fine.size(); ++m)
        for (const Vec3i& f : fine[m]) fine_index[{m, widen(f)}] = running++;

    int64_t num_target = 0;
    for (const auto& member : target) num_target += static_cast<int64_t>(member.size());
    const int64_t kvol = kernel_volume(kernel_size);
    std::vector<int32_t> map(static_cast<std::size_t>(num_target * kvol), -1);

    int64_t coarse_index = 0;
    for (std::size_t m = 0; m < coarse.size(); ++m) {
        for (const Vec3i& c : coarse[m]) {
            for (int64_t t = 0; t < kvol; ++t) {
                const std::array<int64_t, 3> tap = tap_of_index(t, kernel_size);
                Coord64 f{};
                for (int a = 0; a < 3; ++a)
                    f[a] = stride[a] * static_cast<int64_t>(c[a]) + tap[a] - pad_before(kernel_size[a]);
                const auto found = fine_index.find({m, f});
                if (found == fine_index.end()) continue;
                if (forward) {
                    map[static_cast<std::size_t>(coarse_index * kvol + t)] = static_cast<int32_t>(found->second);
                } else {
                    int32_t& entry = map[static_cast<std::size_t>(found->second * kvol + t)];
                    if (entry != -1) throw std::logic_error("oracle_neighbour_map: two coarse voxels on one edge");
                    entry = static_cast<int32_t>(coarse_index);
                }
            }
            ++coarse_index;
        }
    }
    return map;
}

sparsegrid::MemberTransform transform_conv(const sparsegrid::MemberTransform& t, const Vec3i& stride) {
    sparsegrid::MemberTransform out = t;
    for (int a = 0; a < 3; ++a) out.voxel_size[a] = stride[a] * t.voxel_size[a];
    return out;
}

sparsegrid::MemberTransform transform_conv_transpose(const sparsegrid::MemberTransform& t, const Vec3i& stride) {
    sparsegrid::MemberTransform out = t;
    for (int a = 0; a < 3; ++a) out.voxel_size[a] = t.voxel_size[a] / stride[a];
    return out;
}

sparsegrid::MemberTransform transform_coarsened(const sparsegrid::MemberTransform& t, const Vec3i& factor) {
    sparsegrid::MemberTransform out;
    for (int a = 0; a < 3; ++a) {
        out.voxel_size[a] = factor[a] * t.voxel_size[a];
        out.origin[a] = t.origin[a] + (factor[a] - 1) * t.voxel_size[a] / 2.0;
    }
    return out;
}

sparsegrid::MemberTransform transform_refined(const sparsegrid::MemberTransform& t, const Vec3i& factor) {
    sparsegrid::MemberTransform out;
    for (int a = 0; a < 3; ++a) {
        out.voxel_size[a] = t.voxel_size[a] / factor[a];
        out.origin[a] = t.origin[a] - (factor[a] - 1) * out.voxel_size[a] / 2.0;
    }
    return out;
}

}  // namespace sparsegrid_test
