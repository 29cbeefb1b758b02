#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace sparsegrid_test {

// ---- backends ----------------------------------------------------------------------------------------

void PrintTo(const Backend& backend, std::ostream* os) {
    *os << backend.name << " (" << backend.context.device.str() << ")";
}

sparsegrid::Context cpu_context() { return sparsegrid::Context{}; }

sparsegrid::Context cuda_context() {
    sparsegrid::Context ctx;
    ctx.device = sparsegrid::Device::cuda(0);
    return ctx;
}

bool cuda_device_present() { return sparsegrid::cuda_device_count() > 0; }

std::vector<Backend> available_backends() {
    std::vector<Backend> backends{{"cpu", cpu_context()}};
    if (cuda_device_present()) backends.push_back({"cuda", cuda_context()});
    return backends;
}

std::string backend_name(const ::testing::TestParamInfo<Backend>& info) { return info.param.name; }

// ---- random batches ------------------------------------------------------------------------------------

int64_t uniform_int(Rng& rng, int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }

double uniform_real(Rng& rng, double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }

namespace {

int32_t clamp_to_int32(int64_t v) {
    return static_cast<int32_t>(std::min<int64_t>(std::max<int64_t>(v, kInt32Min), kInt32Max));
}

Vec3i random_centre(Rng& rng, bool far) {
    Vec3i centre{};
    for (int a = 0; a < 3; ++a) {
        if (far) {
            const int64_t sign = uniform_int(rng, 0, 1) ? 1 : -1;
            centre[a] = clamp_to_int32(sign * (int64_t{kTwoPow30} + uniform_int(rng, -40, 40)));
        } else {
            centre[a] = static_cast<int32_t>(uniform_int(rng, -300, 300));
        }
    }
    return centre;
}

std::vector<Vec3i> random_blob(Rng& rng, const Vec3i& centre, int32_t max_radius) {
    Vec3i radius{};
    for (int a = 0; a < 3; ++a) radius[a] = static_cast<int32_t>(uniform_int(rng, 0, max_radius));
    const double density = uniform_real(rng, 0.1, 0.9);
    std::vector<Vec3i> out;
    for (int32_t di = -radius[0]; di <= radius[0]; ++di)
        for (int32_t dj = -radius[1]; dj <= radius[1]; ++dj)
            for (int32_t dk = -radius[2]; dk <= radius[2]; ++dk)
                if (uniform_real(rng, 0.0, 1.0) < density)
                    out.push_back({centre[0] + di, centre[1] + dj, centre[2] + dk});
    return out;
}

std::vector<Vec3i> random_scatter(Rng& rng, bool far) {
    const int64_t count = uniform_int(rng, 1, 60);
    std::vector<Vec3i> out;
    const Vec3i centre = far ? random_centre(rng, true) : Vec3i{0, 0, 0};
    const int64_t spread = far ? 60 : 400;
    for (int64_t n = 0; n < count; ++n) {
        Vec3i c{};
        for (int a = 0; a < 3; ++a) c[a] = clamp_to_int32(int64_t{centre[a]} + uniform_int(rng, -spread, spread));
        out.push_back(c);
    }
    return out;
}

std::vector<Vec3i> random_line(Rng& rng) {
    const Vec3i start = random_centre(rng, false);
    const int axis = static_cast<int>(uniform_int(rng, 0, 2));
    const int64_t length = uniform_int(rng, 1, 40);
    std::vector<Vec3i> out;
    for (int64_t n = 0; n < length; ++n) {
        Vec3i c = start;
        c[axis] += static_cast<int32_t>(n);
        if (uniform_int(rng, 0, 3) != 0) out.push_back(c);
    }
    return out;
}

}  // namespace

MemberLists random_members(Rng& rng, const RandomBatchOptions& options) {
    MemberLists members(static_cast<std::size_t>(options.batch_size));
    for (auto& member : members) {
        if (uniform_real(rng, 0.0, 1.0) < options.empty_probability) continue;
        const int64_t parts = uniform_int(rng, 1, 3);
        for (int64_t p = 0; p < parts; ++p) {
            const bool far = options.allow_far && uniform_int(rng, 0, 2) == 0;
            std::vector<Vec3i> part;
            switch (uniform_int(rng, 0, 2)) {
            case 0:
                part = random_blob(rng, random_centre(rng, far), options.max_blob_radius);
                break;
            case 1:
                part = random_scatter(rng, far);
                break;
            default:
                part = random_line(rng);
                break;
            }
            member.insert(member.end(), part.begin(), part.end());
        }
        // Duplicates and arbitrary order, which from_ijk must absorb.
        const int64_t duplicates = member.empty() ? 0 : uniform_int(rng, 0, 5);
        for (int64_t d = 0; d < duplicates; ++d)
            member.push_back(
                member[static_cast<std::size_t>(uniform_int(rng, 0, static_cast<int64_t>(member.size()) - 1))]);
        std::shuffle(member.begin(), member.end(), rng);
    }
    return members;
}

std::vector<MemberTransform> random_transforms(Rng& rng, int64_t batch_size) {
    std::vector<MemberTransform> out(static_cast<std::size_t>(batch_size));
    for (auto& t : out) {
        for (int a = 0; a < 3; ++a) {
            t.voxel_size[a] = uniform_real(rng, 0.05, 3.0);
            t.origin[a] = uniform_real(rng, -10.0, 10.0);
        }
    }
    return out;
}

Vec3i random_kernel_size(Rng& rng) {
    return {static_cast<int32_t>(uniform_int(rng, 1, 6)), static_cast<int32_t>(uniform_int(rng, 1, 6)),
            static_cast<int32_t>(uniform_int(rng, 1, 6))};
}

Vec3i random_stride(Rng& rng) {
    return {static_cast<int32_t>(uniform_int(rng, 1, 5)), static_cast<int32_t>(uniform_int(rng, 1, 5)),
            static_cast<int32_t>(uniform_int(rng, 1, 5))};
}

std::vector<uint8_t> random_mask(Rng& rng, int64_t count, double keep_probability) {
    std::vector<uint8_t> mask(static_cast<std::size_t>(count));
    // Nonzero bytes other than 1 must also mean "keep".
    for (auto& m : mask)
        m = uniform_real(rng, 0.0, 1.0) < keep_probability ? static_cast<uint8_t>(uniform_int(rng, 1, 255)) : 0;
    return mask;
}

std::string str(const Vec3i& v) {
    return "(" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ", " + std::to_string(v[2]) + ")";
}

std::string str(const Vec3d& v) {
    std::ostringstream s;
    s.precision(17);
    s << "(" << v[0] << ", " << v[1] << ", " << v[2] << ")";
    return s.str();
}

MemberLists member_lists(const GridBatch& grid) {
    const std::vector<Vec3i> ijk = grid.ijk_host();
    const std::vector<int64_t>& offsets = grid.voxel_offsets();
    MemberLists out(static_cast<std::size_t>(grid.batch_size()));
    for (std::size_t m = 0; m < out.size(); ++m) out[m].assign(ijk.begin() + offsets[m], ijk.begin() + offsets[m + 1]);
    return out;
}

::testing::AssertionResult grid_is_well_formed(const GridBatch& grid, sparsegrid::Device device) {
    if (grid.device() != device || grid.context().device != device)
        return ::testing::AssertionFailure() << "grid on " << grid.device().str() << " (context "
                                             << grid.context().device.str() << "), expected " << device.str();
    if (grid.voxel_offsets_buffer().device() != device)
        return ::testing::AssertionFailure()
            << "voxel_offsets_buffer() on " << grid.voxel_offsets_buffer().device().str() << ", expected "
            << device.str();
    // An empty buffer holds no memory, so only a non-empty one has to be on the device.
    if (!grid.ijk().empty() && grid.ijk().device() != device)
        return ::testing::AssertionFailure()
            << "ijk() on " << grid.ijk().device().str() << ", expected " << device.str();
    const int64_t batch = grid.batch_size();
    const std::vector<int64_t>& offsets = grid.voxel_offsets();
    if (static_cast<int64_t>(offsets.size()) != batch + 1)
        return ::testing::AssertionFailure()
            << "voxel_offsets has " << offsets.size() << " entries, batch_size " << batch;
    if (offsets.front() != 0) return ::testing::AssertionFailure() << "voxel_offsets[0] = " << offsets.front();
    for (int64_t m = 0; m < batch; ++m) {
        if (offsets[m + 1] < offsets[m])
            return ::testing::AssertionFailure() << "voxel_offsets decrease at member " << m;
        if (grid.num_voxels(m) != offsets[m + 1] - offsets[m])
            return ::testing::AssertionFailure() << "num_voxels(" << m << ") = " << grid.num_voxels(m)
                                                 << ", offsets say " << offsets[m + 1] - offsets[m];
    }
    if (offsets.back() != grid.num_voxels())
        return ::testing::AssertionFailure()
            << "voxel_offsets.back() = " << offsets.back() << ", num_voxels() = " << grid.num_voxels();
    if (grid.voxel_offsets_buffer().to_host() != offsets)
        return ::testing::AssertionFailure() << "voxel_offsets_buffer() differs from voxel_offsets()";
    if (grid.ijk().size() != 3 * grid.num_voxels())
        return ::testing::AssertionFailure()
            << "ijk() has " << grid.ijk().size() << " ints for " << grid.num_voxels() << " voxels";
    const std::vector<Vec3i> ijk = grid.ijk_host();
    if (static_cast<int64_t>(ijk.size()) != grid.num_voxels())
        return ::testing::AssertionFailure() << "ijk_host() has " << ijk.size() << " voxels";
    const std::vector<int32_t> flat = grid.ijk().to_host();
    for (std::size_t n = 0; n < ijk.size(); ++n)
        for (int a = 0; a < 3; ++a)
            if (flat[3 * n + static_cast<std::size_t>(a)] != ijk[n][static_cast<std::size_t>(a)])
                return ::testing::AssertionFailure() << "ijk_host() differs from ijk() at voxel " << n;
    for (int64_t m = 0; m < batch; ++m)
        for (int64_t n = offsets[m] + 1; n < offsets[m + 1]; ++n)
            if (!morton_less(ijk[n - 1], ijk[n]))
                return ::testing::AssertionFailure() << "member " << m << ": voxel " << n - 1 << " " << str(ijk[n - 1])
                                                     << " is not strictly before voxel " << n << " " << str(ijk[n]);
    if (static_cast<int64_t>(grid.transforms().size()) != batch)
        return ::testing::AssertionFailure() << "transforms() has " << grid.transforms().size() << " entries";
    // The box is the smallest box of the voxels on every backend (grid_batch.h).
    const sparsegrid::CoordBox& box = grid.coordinate_box();
    if (ijk.empty()) {
        if (!box.empty()) return ::testing::AssertionFailure() << "coordinate_box of an empty grid is not empty";
    } else {
        Vec3i lo = ijk.front();
        Vec3i hi = ijk.front();
        for (const Vec3i& c : ijk)
            for (int a = 0; a < 3; ++a) {
                lo[a] = std::min(lo[a], c[a]);
                hi[a] = std::max(hi[a], c[a]);
            }
        if (box.lo != lo || box.hi != hi)
            return ::testing::AssertionFailure() << "coordinate_box " << str(box.lo) << ".." << str(box.hi)
                                                 << ", exact box " << str(lo) << ".." << str(hi);
    }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult grid_matches(const GridBatch& grid, const OracleBatch& expected, sparsegrid::Device device) {
    ::testing::AssertionResult formed = grid_is_well_formed(grid, device);
    if (!formed) return formed;
    if (grid.batch_size() != static_cast<int64_t>(expected.size()))
        return ::testing::AssertionFailure() << "batch_size " << grid.batch_size() << ", expected " << expected.size();
    const MemberLists actual = member_lists(grid);
    for (std::size_t m = 0; m < expected.size(); ++m) {
        const std::vector<Vec3i> want = morton_sorted(expected[m]);
        const std::vector<Vec3i>& got = actual[m];
        if (want == got) continue;
        auto failure = ::testing::AssertionFailure();
        failure << "member " << m << ": expected " << want.size() << " voxels, got " << got.size();
        const std::set<Vec3i> want_set(want.begin(), want.end());
        const std::set<Vec3i> got_set(got.begin(), got.end());
        int reported = 0;
        for (const Vec3i& c : want_set)
            if (!got_set.count(c) && reported++ < 5) failure << "\n  missing " << str(c);
        for (const Vec3i& c : got_set)
            if (!want_set.count(c) && reported++ < 10) failure << "\n  unexpected " << str(c);
        if (reported == 0) {
            for (std::size_t n = 0; n < want.size(); ++n)
                if (want[n] != got[n]) {
                    failure << "\n  same set, different order: first difference at position " << n << ": expected "
                            << str(want[n]) << ", got " << str(got[n]);
                    break;
                }
        }
        return failure;
    }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult transforms_near(const std::vector<MemberTransform>& actual,
                                           const std::vector<MemberTransform>& expected, double rel_tol) {
    if (actual.size() != expected.size())
        return ::testing::AssertionFailure() << actual.size() << " transforms, expected " << expected.size();
    for (std::size_t m = 0; m < actual.size(); ++m)
        for (int a = 0; a < 3; ++a) {
            const double hs[2] = {actual[m].voxel_size[a], expected[m].voxel_size[a]};
            const double os[2] = {actual[m].origin[a], expected[m].origin[a]};
            const double h_tol = rel_tol * std::max(1.0, std::fabs(hs[1]));
            const double o_tol = rel_tol * std::max({1.0, std::fabs(os[1]), std::fabs(hs[1])});
            if (!(std::fabs(hs[0] - hs[1]) <= h_tol) || !(std::fabs(os[0] - os[1]) <= o_tol))
                return ::testing::AssertionFailure()
                    << "member " << m << ": voxel_size " << str(actual[m].voxel_size) << " origin "
                    << str(actual[m].origin) << ", expected voxel_size " << str(expected[m].voxel_size) << " origin "
                    << str(expected[m].origin);
        }
    return ::testing::AssertionSuccess();
}

std::vector<int32_t> map_host(const KernelMap& map) {
    std::vector<int32_t> host = map.neighbour_map().to_host();
    EXPECT_EQ(static_cast<int64_t>(host.size()), map.num_target() * map.kernel_volume());
    return host;
}

::testing::AssertionResult maps_equal(const KernelMap& actual, const KernelMap& expected) {
    if (actual.num_source() != expected.num_source() || actual.num_target() != expected.num_target())
        return ::testing::AssertionFailure()
            << "shape source " << actual.num_source() << " target " << actual.num_target() << ", expected source "
            << expected.num_source() << " target " << expected.num_target();
    if (actual.kernel_size() != expected.kernel_size() || actual.stride() != expected.stride())
        return ::testing::AssertionFailure()
            << "K " << str(actual.kernel_size()) << " S " << str(actual.stride()) << ", expected K "
            << str(expected.kernel_size()) << " S " << str(expected.stride());
    if (actual.direction() != expected.direction()) return ::testing::AssertionFailure() << "direction differs";
    const std::vector<int32_t> a = map_host(actual);
    const std::vector<int32_t> e = map_host(expected);
    if (a.size() != e.size()) return ::testing::AssertionFailure() << "map sizes " << a.size() << " vs " << e.size();
    const int64_t kvol = expected.kernel_volume();
    for (std::size_t n = 0; n < a.size(); ++n)
        if (a[n] != e[n])
            return ::testing::AssertionFailure()
                << "entry [target " << static_cast<int64_t>(n) / kvol << ", tap " << static_cast<int64_t>(n) % kvol
                << "] = " << a[n] << ", expected " << e[n];
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult map_matches_oracle(const KernelMap& map, const GridBatch& source, const GridBatch& target,
                                              const Vec3i& kernel_size, const Vec3i& stride, MapDirection direction) {
    if (map.num_source() != source.num_voxels() || map.num_target() != target.num_voxels())
        return ::testing::AssertionFailure()
            << "map shape source " << map.num_source() << " target " << map.num_target() << ", grids have "
            << source.num_voxels() << " and " << target.num_voxels();
    if (map.kernel_size() != kernel_size || map.stride() != stride || map.direction() != direction)
        return ::testing::AssertionFailure() << "map K/S/direction differ from the request";
    if (map.device() != source.device() || map.device() != target.device())
        return ::testing::AssertionFailure() << "map on " << map.device().str() << ", grids on "
                                             << source.device().str() << " and " << target.device().str();
    const std::vector<int32_t> got = map_host(map);
    const std::vector<int32_t> want = oracle_neighbour_map(member_lists(source), member_lists(target), kernel_size,
                                                           stride, direction);
    if (got.size() != want.size())
        return ::testing::AssertionFailure() << "map has " << got.size() << " entries, expected " << want.size();
    const int64_t kvol = kernel_volume(kernel_size);
    const std::vector<Vec3i> target_ijk = target.ijk_host();
    int64_t edges = 0;
    for (std::size_t n = 0; n < want.size(); ++n) {
        if (want[n] != -1) ++edges;
        if (got[n] != want[n]) {
            const int64_t row = static_cast<int64_t>(n) / kvol;
            return ::testing::AssertionFailure()
                << "entry [target " << row << " " << str(target_ijk[static_cast<std::size_t>(row)]) << ", tap "
                << static_cast<int64_t>(n) % kvol << "] = " << got[n] << ", expected " << want[n];
        }
    }
    if (map.num_edges() != edges)
        return ::testing::AssertionFailure() << "num_edges() = " << map.num_edges() << ", expected " << edges;
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult pairs_match_map(const KernelMap& map) {
    const sparsegrid::PairLists pairs = map.pairs_by_tap();
    const int64_t kvol = map.kernel_volume();
    if (static_cast<int64_t>(pairs.tap_offsets.size()) != kvol + 1)
        return ::testing::AssertionFailure()
            << "tap_offsets has " << pairs.tap_offsets.size() << " entries, Kvol " << kvol;
    if (pairs.tap_offsets.front() != 0) return ::testing::AssertionFailure() << "tap_offsets[0] != 0";
    for (const sparsegrid::Buffer<int32_t>* buffer : {&pairs.source_index, &pairs.target_index})
        if (!buffer->empty() && buffer->device() != map.device())
            return ::testing::AssertionFailure()
                << "pair list on " << buffer->device().str() << ", map on " << map.device().str();
    const std::vector<int32_t> dense = map_host(map);
    const std::vector<int32_t> source = pairs.source_index.to_host();
    const std::vector<int32_t> target = pairs.target_index.to_host();
    if (static_cast<int64_t>(source.size()) != pairs.num_pairs() ||
        static_cast<int64_t>(target.size()) != pairs.num_pairs())
        return ::testing::AssertionFailure() << "pair buffers have " << source.size() << "/" << target.size()
                                             << " entries, num_pairs " << pairs.num_pairs();
    for (int64_t t = 0; t < kvol; ++t) {
        std::vector<int32_t> want_source;
        std::vector<int32_t> want_target;
        for (int64_t row = 0; row < map.num_target(); ++row) {
            const int32_t entry = dense[static_cast<std::size_t>(row * kvol + t)];
            if (entry == -1) continue;
            want_source.push_back(entry);
            want_target.push_back(static_cast<int32_t>(row));
        }
        const int64_t begin = pairs.tap_offsets[static_cast<std::size_t>(t)];
        const int64_t end = pairs.tap_offsets[static_cast<std::size_t>(t + 1)];
        if (end < begin) return ::testing::AssertionFailure() << "tap_offsets decrease at tap " << t;
        if (end - begin != static_cast<int64_t>(want_source.size()))
            return ::testing::AssertionFailure()
                << "tap " << t << " has " << end - begin << " pairs, map has " << want_source.size() << " edges";
        for (int64_t e = begin; e < end; ++e) {
            if (e > begin && !(target[e - 1] < target[e]))
                return ::testing::AssertionFailure() << "tap " << t << ": targets not increasing at pair " << e;
            if (source[e] != want_source[e - begin] || target[e] != want_target[e - begin])
                return ::testing::AssertionFailure()
                    << "tap " << t << " pair " << e - begin << " = (" << source[e] << " -> " << target[e]
                    << "), expected (" << want_source[e - begin] << " -> " << want_target[e - begin] << ")";
        }
    }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult throws_error(const std::function<void()>& fn, const std::string& operation,
                                        std::initializer_list<const char*> any_of) {
    try {
        fn();
    } catch (const sparsegrid::Error& e) {
        const std::string what = e.what();
        const std::size_t at = what.find(operation);
        if (at == std::string::npos)
            return ::testing::AssertionFailure() << "message \"" << what << "\" does not name " << operation;
        const std::string rest = what.substr(at + operation.size());
        for (const char* needle : any_of)
            if (rest.find(needle) != std::string::npos) return ::testing::AssertionSuccess() << what;
        auto failure = ::testing::AssertionFailure();
        failure << "message \"" << what << "\" mentions none of:";
        for (const char* needle : any_of) failure << " \"" << needle << "\"";
        return failure;
    } catch (const std::exception& e) {
        return ::testing::AssertionFailure() << "threw a non-sparsegrid exception: " << e.what();
    } catch (...) {
        return ::testing::AssertionFailure() << "threw a non-std exception";
    }
    return ::testing::AssertionFailure() << "did not throw (expected a " << operation << " error)";
}

std::vector<uint64_t> test_seeds() { return {1, 2, 3, 5, 8, 13, 21, 34, 55, 89}; }

}  // namespace sparsegrid_test
