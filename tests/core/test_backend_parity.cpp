// CPU/CUDA parity: both backends produce the same voxels in the same order and the same kernel maps,
// bit for bit (DESIGN.md, "One semantic definition, two backends"). Every operation runs on both
// backends from the same host inputs, and everything either returns is read back and compared
// exactly: ijk arrays, member offsets (host and device copies), coordinate boxes, transforms,
// ijk_to_index lookups, neighbour maps in both directions, their per-tap pair lists and transposed()
// maps. Where the CPU raises sparsegrid::Error (overflow), CUDA must raise it too.
//
// Inputs are large: ~1M random voxels (dense blobs, noisy ellipsoid shells, scattered points, all with
// negative coordinates), far coordinates that need the wide keys, the synthetic surface batches of
// shapes.h and the reference batch of data/. The tests need a CUDA device and skip without one; the
// CPU side of each comparison is the CPU backend, itself checked against the oracle by the other
// tests. Seeds are fixed and printed.
#include "oracle.h"
#include "test_util.h"

#include <sparsegrid/io.h>
#include <sparsegrid/shapes.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#ifndef SPARSEGRID_SOURCE_DIR
#error "SPARSEGRID_SOURCE_DIR (the source tree, for data/) is defined by tests/CMakeLists.txt"
#endif

namespace sparsegrid_test {
namespace {

using sparsegrid::Context;
using sparsegrid::neighbour_map;
using sparsegrid::PairLists;

/// Kernel maps with more entries than this are not built (their size is printed instead): each
/// comparison holds a map, its transposed twin and the pair lists of both on each backend plus host
/// copies. ~134M entries (512 MiB per map) keeps that within a few GiB.
constexpr int64_t kMaxMapEntries = int64_t{1} << 27;
/// Generative operations with many taps (conv_transpose_grid (3,2) and (4,4)) grow a grid 8 to 64
/// times; they run on the fine grid up to this size, and always on its coarsened level.
constexpr int64_t kMaxFineVoxelsForLargeUpsampling = 300000;

const Context& reference_context() {
    static const Context ctx = cpu_context();
    return ctx;
}

const Context& candidate_context() {
    static const Context ctx = cuda_context();
    return ctx;
}

void print_note(const std::string& text) { std::cout << "[   NOTE   ] " << text << std::endl; }

void print_seed(const std::string& what, uint64_t seed) {
    std::cout << "[   SEED   ] " << what << ": seed " << seed << std::endl;
}

/// The same grid on the CPU and on CUDA.
struct GridPair {
    GridBatch cpu;
    GridBatch cuda;
    /// This pair's grid on the backend of `grid`.
    const GridBatch& on_backend_of(const GridBatch& grid) const { return grid.device().is_cpu() ? cpu : cuda; }
};

class BackendParity : public ::testing::Test {
protected:
    void SetUp() override {
        if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device: CPU/CUDA parity needs one";
    }
};

// ---- exact comparisons ------------------------------------------------------------------------------

template <typename T>
::testing::AssertionResult same_values(const std::string& what, const std::vector<T>& cpu, const std::vector<T>& cuda,
                                       int64_t row_width = 1) {
    if (cpu.size() != cuda.size())
        return ::testing::AssertionFailure()
            << what << ": " << cuda.size() << " values on CUDA, " << cpu.size() << " on the CPU";
    const auto [at_cpu, at_cuda] = std::mismatch(cpu.begin(), cpu.end(), cuda.begin());
    if (at_cpu == cpu.end()) return ::testing::AssertionSuccess();
    const int64_t at = at_cpu - cpu.begin();
    return ::testing::AssertionFailure() << what << ": first difference at [" << at / row_width << "]["
                                         << at % row_width << "] of " << cpu.size() / row_width << " rows: CUDA "
                                         << *at_cuda << ", CPU " << *at_cpu;
}

::testing::AssertionResult on_devices(const std::string& what, sparsegrid::Device cpu, sparsegrid::Device cuda) {
    if (cpu == reference_context().device && cuda == candidate_context().device) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << " on " << cpu.str() << " and " << cuda.str() << ", expected "
                                         << reference_context().device.str() << " and "
                                         << candidate_context().device.str();
}

/// Offsets, ijk, box and transforms of the two grids are identical.
::testing::AssertionResult same_grid(const GridPair& grids) {
    const GridBatch& cpu = grids.cpu;
    const GridBatch& cuda = grids.cuda;
    if (auto r = on_devices("grids", cpu.device(), cuda.device()); !r) return r;
    if (auto r = on_devices("voxel_offsets_buffer()", cpu.voxel_offsets_buffer().device(),
                            cuda.voxel_offsets_buffer().device());
        !r)
        return r;
    if (cuda.num_voxels() > 0)
        if (auto r = on_devices("ijk()", cpu.ijk().device(), cuda.ijk().device()); !r) return r;
    if (cpu.batch_size() != cuda.batch_size())
        return ::testing::AssertionFailure()
            << "batch_size: CUDA " << cuda.batch_size() << ", CPU " << cpu.batch_size();
    if (auto r = same_values("voxel_offsets()", cpu.voxel_offsets(), cuda.voxel_offsets()); !r) return r;
    if (auto r = same_values("voxel_offsets_buffer()", cpu.voxel_offsets(), cuda.voxel_offsets_buffer().to_host()); !r)
        return r;
    if (auto r = same_values("ijk() [voxel][axis]", cpu.ijk().to_host(), cuda.ijk().to_host(), 3); !r) return r;
    const sparsegrid::CoordBox& cpu_box = cpu.coordinate_box();
    const sparsegrid::CoordBox& cuda_box = cuda.coordinate_box();
    if (cpu_box.lo != cuda_box.lo || cpu_box.hi != cuda_box.hi)
        return ::testing::AssertionFailure()
            << "coordinate_box(): CUDA " << str(cuda_box.lo) << ".." << str(cuda_box.hi) << ", CPU " << str(cpu_box.lo)
            << ".." << str(cpu_box.hi);
    if (cpu.transforms().size() != cuda.transforms().size())
        return ::testing::AssertionFailure()
            << "transforms(): " << cuda.transforms().size() << " on CUDA, " << cpu.transforms().size() << " on the CPU";
    for (std::size_t m = 0; m < cpu.transforms().size(); ++m)
        if (std::memcmp(&cpu.transforms()[m], &cuda.transforms()[m], sizeof(MemberTransform)) != 0)
            return ::testing::AssertionFailure()
                << "transforms()[" << m << "]: CUDA voxel_size " << str(cuda.transforms()[m].voxel_size) << " origin "
                << str(cuda.transforms()[m].origin) << ", CPU voxel_size " << str(cpu.transforms()[m].voxel_size)
                << " origin " << str(cpu.transforms()[m].origin);
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_map(const KernelMap& cpu, const KernelMap& cuda) {
    if (auto r = on_devices("maps", cpu.device(), cuda.device()); !r) return r;
    if (auto r = maps_equal(cuda, cpu); !r) return r;
    if (cpu.num_edges() != cuda.num_edges())
        return ::testing::AssertionFailure() << "num_edges(): CUDA " << cuda.num_edges() << ", CPU " << cpu.num_edges();
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_pairs(const KernelMap& cpu_map, const KernelMap& cuda_map) {
    const PairLists cpu = cpu_map.pairs_by_tap();
    const PairLists cuda = cuda_map.pairs_by_tap();
    if (cuda.num_pairs() > 0)
        if (auto r = on_devices("pair lists", cpu.source_index.device(), cuda.source_index.device()); !r) return r;
    if (auto r = same_values("pairs_by_tap().tap_offsets", cpu.tap_offsets, cuda.tap_offsets); !r) return r;
    if (auto r = same_values("pairs_by_tap().source_index", cpu.source_index.to_host(), cuda.source_index.to_host());
        !r)
        return r;
    return same_values("pairs_by_tap().target_index", cpu.target_index.to_host(), cuda.target_index.to_host());
}

// ---- running operations on both backends -----------------------------------------------------------

/// Runs the CPU and the CUDA call. A sparsegrid::Error on the CPU must be one on CUDA too, and then
/// nothing is returned; otherwise both grids must be identical and are returned.
std::optional<GridPair> same_result(const std::string& what, const std::function<GridBatch()>& cpu_call,
                                    const std::function<GridBatch()>& cuda_call) {
    std::optional<GridBatch> cpu;
    std::optional<GridBatch> cuda;
    std::string cpu_error;
    std::string cuda_error;
    try {
        cpu = cpu_call();
    } catch (const sparsegrid::Error& e) {
        cpu_error = e.what();
    }
    try {
        cuda = cuda_call();
    } catch (const sparsegrid::Error& e) {
        cuda_error = e.what();
    }
    if (!cpu && !cuda) print_note(what + ": both raised (CPU: " + cpu_error + ")");
    if (!cpu || !cuda) {
        EXPECT_EQ(cpu.has_value(), cuda.has_value())
            << what << ": the CPU " << (cpu ? "succeeded" : "raised \"" + cpu_error + "\"") << ", CUDA "
            << (cuda ? "succeeded" : "raised \"" + cuda_error + "\"");
        return std::nullopt;
    }
    GridPair out{*cpu, *cuda};
    EXPECT_TRUE(same_grid(out)) << what;
    return out;
}

/// A grid built by `build` in the CPU and in the CUDA context, compared as in same_result.
std::optional<GridPair> same_build(const std::string& what, const std::function<GridBatch(const Context&)>& build) {
    return same_result(
        what, [&] { return build(reference_context()); }, [&] { return build(candidate_context()); });
}

/// `op` applied to both grids of `input`, compared as in same_result.
std::optional<GridPair> same_op(const std::string& what, const GridPair& input,
                                const std::function<GridBatch(const GridBatch&)>& op) {
    return same_result(
        what, [&] { return op(input.cpu); }, [&] { return op(input.cuda); });
}

MapDirection opposite(MapDirection d) {
    return d == MapDirection::Forward ? MapDirection::Transposed : MapDirection::Forward;
}

/// neighbour_map(source, target, K, S, direction) on both backends, with its pair lists, its
/// transposed() map and pair lists, and the map built directly in the opposite direction.
void expect_same_maps(const std::string& what, const GridPair& source, const GridPair& target, const Vec3i& k,
                      const Vec3i& s, MapDirection direction) {
    const std::string label = what + ": neighbour_map K=" + str(k) + " S=" + str(s) +
        (direction == MapDirection::Forward ? " forward" : " transposed");
    SCOPED_TRACE(label);
    const int64_t entries = std::max(source.cpu.num_voxels(), target.cpu.num_voxels()) * kernel_volume(k);
    if (entries > kMaxMapEntries) {
        print_note(label + ": not built (" + std::to_string(entries) + " entries)");
        return;
    }
    const KernelMap cpu = neighbour_map(source.cpu, target.cpu, k, s, direction);
    const KernelMap cuda = neighbour_map(source.cuda, target.cuda, k, s, direction);
    EXPECT_TRUE(same_map(cpu, cuda));
    EXPECT_TRUE(same_pairs(cpu, cuda));
    const KernelMap cpu_transposed = cpu.transposed();
    const KernelMap cuda_transposed = cuda.transposed();
    EXPECT_TRUE(same_map(cpu_transposed, cuda_transposed)) << "transposed()";
    EXPECT_TRUE(same_pairs(cpu_transposed, cuda_transposed)) << "transposed()";
    const KernelMap cuda_opposite = neighbour_map(target.cuda, source.cuda, k, s, opposite(direction));
    EXPECT_TRUE(same_map(cpu_transposed, cuda_opposite)) << "opposite direction built by neighbour_map";
}

/// ijk_to_index on both backends (span and host-list overloads) for every voxel, a neighbour of each,
/// voxels of other members, random coordinates around the grid and the int32 extremes.
void expect_same_lookups(const GridPair& grid, uint64_t seed) {
    SCOPED_TRACE("ijk_to_index");
    Rng rng(seed);
    const MemberLists lists = member_lists(grid.cpu);
    const sparsegrid::CoordBox& box = grid.cpu.coordinate_box();
    MemberLists queries(lists.size());
    for (std::size_t m = 0; m < lists.size(); ++m) {
        for (const Vec3i& c : lists[m]) {
            queries[m].push_back(c);
            if (uniform_int(rng, 0, 3) == 0)
                queries[m].push_back({c[0], c[1], c[2] == kInt32Max ? kInt32Min : c[2] + 1});
        }
        for (std::size_t other = 0; other < lists.size(); ++other)
            if (other != m && !lists[other].empty()) queries[m].push_back(lists[other][lists[other].size() / 2]);
        if (!box.empty())
            for (int n = 0; n < 1000; ++n) {
                Vec3i c{};
                for (int a = 0; a < 3; ++a) c[a] = static_cast<int32_t>(uniform_int(rng, box.lo[a], box.hi[a]));
                queries[m].push_back(c);
            }
        queries[m].push_back({kInt32Min, kInt32Min, kInt32Min});
        queries[m].push_back({kInt32Max, kInt32Max, kInt32Max});
        std::shuffle(queries[m].begin(), queries[m].end(), rng);
    }
    const FlatTriples<int32_t> flat = flatten(queries);
    const sparsegrid::Buffer<int64_t> cpu = grid.cpu.ijk_to_index(to_device(flat.values, reference_context()),
                                                                  flat.offsets);
    const sparsegrid::Buffer<int64_t> cuda = grid.cuda.ijk_to_index(to_device(flat.values, candidate_context()),
                                                                    flat.offsets);
    EXPECT_TRUE(on_devices("ijk_to_index results", cpu.device(), cuda.device()));
    const std::vector<int64_t> cpu_host = cpu.to_host();
    EXPECT_TRUE(same_values("ijk_to_index (span)", cpu_host, cuda.to_host()));
    EXPECT_TRUE(same_values("ijk_to_index (host lists)", cpu_host, grid.cuda.ijk_to_index(queries)));
}

/// from_points on both backends: for every voxel a point inside it, and for every fourth voxel a point
/// exactly half way to the next voxel centre on one axis, where rounding decides.
void expect_same_from_points(const MemberLists& members, const std::vector<MemberTransform>& transforms,
                             uint64_t seed) {
    Rng rng(seed);
    std::vector<std::vector<Vec3d>> points(members.size());
    for (std::size_t m = 0; m < members.size(); ++m) {
        const MemberTransform& t = transforms[m];
        for (const Vec3i& c : members[m]) {
            Vec3d offset{uniform_real(rng, -0.5, 0.5), uniform_real(rng, -0.5, 0.5), uniform_real(rng, -0.5, 0.5)};
            if (uniform_int(rng, 0, 3) == 0) offset[static_cast<std::size_t>(uniform_int(rng, 0, 2))] = 0.5;
            Vec3d xyz{};
            for (int a = 0; a < 3; ++a)
                xyz[a] = t.origin[a] + t.voxel_size[a] * (static_cast<double>(c[a]) + offset[a]);
            points[m].push_back(xyz);
        }
    }
    same_build("from_points", [&](const Context& ctx) { return GridBatch::from_points(points, transforms, ctx); });
}

/// Every operation of the API on `members` on both backends. Each output is compared, and so are the
/// kernel maps that connect it with its input.
void expect_parity_of_every_operation(const std::string& label, const MemberLists& members,
                                      const std::vector<MemberTransform>& transforms, uint64_t seed) {
    print_seed(label, seed);
    SCOPED_TRACE(label + " seed=" + std::to_string(seed));
    Rng rng(seed);

    const std::optional<GridPair> built = same_build(
        "from_ijk", [&](const Context& ctx) { return GridBatch::from_ijk(members, transforms, ctx); });
    ASSERT_TRUE(built.has_value()) << "from_ijk raised";
    const GridPair& grid = *built;
    print_note(label + ": " + std::to_string(grid.cpu.num_voxels()) + " voxels in " +
               std::to_string(grid.cpu.batch_size()) + " members");

    // Construction from spans of device memory (the host-list overload above uploads by itself).
    const FlatTriples<int32_t> flat = flatten(members);
    same_build("from_ijk (span)", [&](const Context& ctx) {
        return GridBatch::from_ijk(to_device(flat.values, ctx), flat.offsets, transforms, ctx);
    });
    expect_same_from_points(members, transforms, seed + 1);
    expect_same_lookups(grid, seed + 2);

    // Same-resolution and downsampling operations, with the maps from the input to their output.
    const std::vector<std::pair<Vec3i, Vec3i>> conv_cases{{{2, 2, 2}, {2, 2, 2}},
                                                          {{3, 3, 3}, {2, 2, 2}},
                                                          {{3, 3, 3}, {1, 1, 1}},
                                                          {{1, 1, 1}, {3, 3, 3}},
                                                          {{3, 2, 5}, {1, 2, 3}}};
    for (const auto& [k, s] : conv_cases) {
        const std::string what = "conv_grid K=" + str(k) + " S=" + str(s);
        if (const auto out = same_op(what, grid, [&](const GridBatch& g) { return g.conv_grid(k, s); }))
            expect_same_maps(what, grid, *out, k, s, MapDirection::Forward);
    }
    expect_same_maps("submanifold", grid, grid, {3, 3, 3}, {1, 1, 1}, MapDirection::Forward);
    expect_same_maps("submanifold", grid, grid, {3, 2, 5}, {1, 1, 1}, MapDirection::Transposed);

    const std::optional<GridPair> coarse = same_op("coarsened_grid(2)", grid,
                                                   [](const GridBatch& g) { return g.coarsened_grid(2); });
    same_op("coarsened_grid(3)", grid, [](const GridBatch& g) { return g.coarsened_grid(3); });
    if (coarse) expect_same_maps("coarsened_grid(2)", grid, *coarse, {2, 2, 2}, {2, 2, 2}, MapDirection::Forward);

    for (int32_t d : {1, 2}) {
        const std::string what = "dilated_grid(" + std::to_string(d) + ")";
        if (const auto out = same_op(what, grid, [&](const GridBatch& g) { return g.dilated_grid(d); }); out && d == 1)
            expect_same_maps(what, grid, *out, {3, 3, 3}, {1, 1, 1}, MapDirection::Forward);
    }

    const std::vector<uint8_t> prune_mask = random_mask(rng, grid.cpu.num_voxels(), 0.6);
    const std::optional<GridPair> pruned = same_op(
        "pruned_grid", grid, [&](const GridBatch& g) { return g.pruned_grid(to_device(prune_mask, g.context())); });

    // merged_grid with a different batch of the same transforms: every member shifted by one voxel
    // along a member-dependent axis, a random half of its voxels kept.
    MemberLists shifted(members.size());
    for (std::size_t m = 0; m < members.size(); ++m)
        for (const Vec3i& c : members[m]) {
            Vec3i moved = c;
            const std::size_t axis = m % 3;
            if (moved[axis] < kInt32Max) ++moved[axis];
            if (uniform_int(rng, 0, 1)) shifted[m].push_back(moved);
        }
    if (const auto other = same_build("from_ijk (merge partner)", [&](const Context& ctx) {
            return GridBatch::from_ijk(shifted, transforms, ctx);
        })) {
        same_op("merged_grid", grid, [&](const GridBatch& g) { return g.merged_grid(other->on_backend_of(g)); });
        if (pruned)
            same_op("merged_grid (pruned)", *pruned,
                    [&](const GridBatch& g) { return g.merged_grid(other->on_backend_of(g)); });
    }

    const std::vector<uint8_t> refine_mask = random_mask(rng, grid.cpu.num_voxels(), 0.5);
    for (const Vec3i& f : {Vec3i{2, 2, 2}, Vec3i{2, 3, 1}}) {
        same_op("refined_grid " + str(f), grid, [&](const GridBatch& g) { return g.refined_grid(f); });
        same_op("refined_grid " + str(f) + " with mask", grid,
                [&](const GridBatch& g) { return g.refined_grid(f, to_device(refine_mask, g.context())); });
    }

    // Generative (transposed) operations, with the transposed-direction maps from input to output:
    // on the fine grid, and on coarser levels where decoders use them (and where the maps of the
    // largest kernels stay small enough to build).
    struct Level {
        std::string name;
        const GridPair* grid;
        bool small_enough_for_large_upsampling;
    };
    std::vector<Level> levels{{"fine", &grid, grid.cpu.num_voxels() <= kMaxFineVoxelsForLargeUpsampling}};
    std::optional<GridPair> coarsest;
    if (coarse) {
        levels.push_back({"coarsened(2)", &*coarse, true});
        coarsest = same_op("coarsened_grid(4) of coarsened_grid(2)", *coarse,
                           [](const GridBatch& g) { return g.coarsened_grid(4); });
        if (coarsest) levels.push_back({"coarsened(8)", &*coarsest, true});
    }
    struct TransposeCase {
        Vec3i k;
        Vec3i s;
        bool large_upsampling;
    };
    const std::vector<TransposeCase> transpose_cases{{{2, 2, 2}, {2, 2, 2}, false},
                                                     {{3, 3, 3}, {1, 1, 1}, false},
                                                     {{3, 3, 3}, {2, 2, 2}, true},
                                                     {{4, 4, 4}, {4, 4, 4}, true}};
    for (const Level& level : levels)
        for (const auto& [k, s, large] : transpose_cases) {
            if (large && !level.small_enough_for_large_upsampling) {
                print_note(label + ": conv_transpose_grid K=" + str(k) + " S=" + str(s) + " not run on the " +
                           level.name + " grid (" + std::to_string(level.grid->cpu.num_voxels()) + " voxels)");
                continue;
            }
            const std::string what = "conv_transpose_grid K=" + str(k) + " S=" + str(s) + " of the " + level.name +
                " grid";
            if (const auto out = same_op(what, *level.grid,
                                         [&](const GridBatch& g) { return g.conv_transpose_grid(k, s); }))
                expect_same_maps(what, *level.grid, *out, k, s, MapDirection::Transposed);
        }
}

// ---- inputs -----------------------------------------------------------------------------------------

Vec3i random_point(Rng& rng, int32_t lo, int32_t hi) {
    return {static_cast<int32_t>(uniform_int(rng, lo, hi)), static_cast<int32_t>(uniform_int(rng, lo, hi)),
            static_cast<int32_t>(uniform_int(rng, lo, hi))};
}

/// A solid ellipsoid with semi-axes in [min_radius, max_radius], each voxel kept with `density`.
void add_blob(Rng& rng, const Vec3i& centre, int32_t min_radius, int32_t max_radius, double density,
              std::vector<Vec3i>& out) {
    int32_t r[3];
    for (int a = 0; a < 3; ++a) r[a] = static_cast<int32_t>(uniform_int(rng, min_radius, max_radius));
    for (int32_t i = -r[0]; i <= r[0]; ++i)
        for (int32_t j = -r[1]; j <= r[1]; ++j)
            for (int32_t k = -r[2]; k <= r[2]; ++k) {
                const double q = double(i) * i / (double(r[0]) * r[0]) + double(j) * j / (double(r[1]) * r[1]) +
                    double(k) * k / (double(r[2]) * r[2]);
                if (q <= 1.0 && uniform_real(rng, 0.0, 1.0) < density)
                    out.push_back({centre[0] + i, centre[1] + j, centre[2] + k});
            }
}

/// A noisy ellipsoid shell about 1.5 voxels thick, with semi-axes in [min_radius, max_radius] and a few
/// holes.
void add_shell(Rng& rng, const Vec3i& centre, int32_t min_radius, int32_t max_radius, std::vector<Vec3i>& out) {
    double r[3];
    for (int a = 0; a < 3; ++a) r[a] = uniform_real(rng, min_radius, max_radius);
    const double mean_radius = (r[0] + r[1] + r[2]) / 3.0;
    const int32_t extent[3] = {static_cast<int32_t>(r[0]) + 2, static_cast<int32_t>(r[1]) + 2,
                               static_cast<int32_t>(r[2]) + 2};
    for (int32_t i = -extent[0]; i <= extent[0]; ++i)
        for (int32_t j = -extent[1]; j <= extent[1]; ++j)
            for (int32_t k = -extent[2]; k <= extent[2]; ++k) {
                const double q = std::sqrt(i * i / (r[0] * r[0]) + j * j / (r[1] * r[1]) + k * k / (r[2] * r[2]));
                if (std::abs(q - 1.0) * mean_radius < 0.75 && uniform_real(rng, 0.0, 1.0) < 0.97)
                    out.push_back({centre[0] + i, centre[1] + j, centre[2] + k});
            }
}

/// `count` points (a multiple of 100) around `centre`: half uniform in a cube of half side `spread`,
/// half in clusters of 50 within +-3 of random cluster centres.
void add_scatter(Rng& rng, const Vec3i& centre, int32_t spread, int64_t count, std::vector<Vec3i>& out) {
    for (int64_t n = 0; n < count / 2; ++n) {
        const Vec3i d = random_point(rng, -spread, spread);
        out.push_back({centre[0] + d[0], centre[1] + d[1], centre[2] + d[2]});
    }
    for (int64_t cluster = 0; cluster < count / 100; ++cluster) {
        const Vec3i c = random_point(rng, -spread, spread);
        for (int n = 0; n < 50; ++n) {
            const Vec3i d = random_point(rng, -3, 3);
            out.push_back({centre[0] + c[0] + d[0], centre[1] + c[1] + d[1], centre[2] + c[2] + d[2]});
        }
    }
}

/// About 1M voxels in 16 members: dense blobs, noisy shells, scattered points and mixtures of the three,
/// centred anywhere in [-2000, 2000]^3; member 13 is empty. Duplicates added and order shuffled, as
/// from_ijk accepts them.
MemberLists large_random_members(Rng& rng) {
    MemberLists members(16);
    for (std::size_t m = 0; m < members.size(); ++m) {
        if (m == 13) continue;
        std::vector<Vec3i>& member = members[m];
        const Vec3i centre = random_point(rng, -2000, 2000);
        switch (m % 4) {
        case 0:
            for (int b = 0; b < 6; ++b) {
                const Vec3i d = random_point(rng, -60, 60);
                add_blob(rng, {centre[0] + d[0], centre[1] + d[1], centre[2] + d[2]}, 12, 24, 0.85, member);
            }
            break;
        case 1:
            add_shell(rng, centre, 40, 80, member);
            break;
        case 2:
            add_scatter(rng, centre, 1500, 16000, member);
            break;
        default:
            add_blob(rng, centre, 14, 20, 0.9, member);
            add_shell(rng, centre, 25, 40, member);
            add_scatter(rng, centre, 400, 5000, member);
            break;
        }
        const std::size_t original = member.size();
        for (std::size_t n = 0; n < original / 20; ++n)
            member.push_back(member[static_cast<std::size_t>(uniform_int(rng, 0, static_cast<int64_t>(original) - 1))]);
        std::shuffle(member.begin(), member.end(), rng);
    }
    return members;
}

/// Members around +-2^29: more than 21 bits per coordinate, so keys are wider than 64 bits, while
/// most operations (up to an upsampling by 2) stay within int32.
MemberLists far_members(Rng& rng) {
    constexpr int32_t kTwoPow29 = int32_t{1} << 29;
    MemberLists members(5);
    add_blob(rng, {kTwoPow29 - 20, -kTwoPow29 + 20, 7}, 4, 8, 0.8, members[0]);
    for (int n = 0; n < 5000; ++n) members[1].push_back(random_point(rng, -kTwoPow29, kTwoPow29));
    add_shell(rng, {-kTwoPow29 / 2, kTwoPow29 / 2, -5}, 10, 20, members[2]);
    add_blob(rng, {3, -4, 5}, 3, 6, 0.7, members[3]);
    // members[4] stays empty
    return members;
}

/// The corners and edges of the int32 range, scattered points over all of it, and a small blob at the
/// origin: every operation that reaches past the range must raise on both backends.
MemberLists int32_limit_members(Rng& rng) {
    MemberLists members(3);
    for (int32_t i : {kInt32Min, kInt32Min + 1, -1, 0, kInt32Max - 1, kInt32Max})
        for (int32_t j : {kInt32Min, 0, kInt32Max})
            for (int32_t k : {kInt32Min, kInt32Max}) members[0].push_back({i, j, k});
    for (int n = 0; n < 5000; ++n) members[1].push_back(random_point(rng, kInt32Min, kInt32Max));
    add_blob(rng, {0, 0, 0}, 3, 5, 0.8, members[2]);
    return members;
}

// ---- tests ------------------------------------------------------------------------------------------

TEST_F(BackendParity, LargeRandomBatch) {
    const uint64_t seed = 20261202;
    print_seed("large random batch members", seed);
    Rng rng(seed);
    const MemberLists members = large_random_members(rng);
    const std::vector<MemberTransform> transforms = random_transforms(rng, static_cast<int64_t>(members.size()));
    expect_parity_of_every_operation("large random batch", members, transforms, seed + 1);
}

TEST_F(BackendParity, FarCoordinatesAndInt32Limits) {
    const uint64_t seed = 4242;
    print_seed("far and int32-limit members", seed);
    Rng rng(seed);
    const MemberLists far = far_members(rng);
    expect_parity_of_every_operation("far coordinates", far, random_transforms(rng, static_cast<int64_t>(far.size())),
                                     seed + 1);
    const MemberLists limits = int32_limit_members(rng);
    expect_parity_of_every_operation("int32 limits", limits,
                                     random_transforms(rng, static_cast<int64_t>(limits.size())), seed + 2);
}

TEST_F(BackendParity, SyntheticSurfaceBatches) {
    for (uint64_t shape_seed : {uint64_t{0}, uint64_t{77}}) {
        print_seed("synthetic_surface_batch(16, 64)", shape_seed);
        const MemberLists members = sparsegrid::synthetic_surface_batch(16, 64, shape_seed);
        Rng rng(shape_seed + 500);
        const std::vector<MemberTransform> transforms = random_transforms(rng, 16);
        expect_parity_of_every_operation("synthetic surfaces seed " + std::to_string(shape_seed), members, transforms,
                                         shape_seed + 501);
    }
}

TEST_F(BackendParity, ReferenceBatch) {
    const std::string path = std::string(SPARSEGRID_SOURCE_DIR) + "/data/reference_batch_r64.txt";
    const MemberLists all = sparsegrid::read_voxel_batch(path);
    ASSERT_GE(all.size(), 16u) << path;
    // The batch-16 workload of DESIGN.md, with the unit transform of a 64^3 grid of the unit cube.
    const MemberLists batch16 = sparsegrid::first_members(all, 16);
    MemberTransform unit_cube;
    unit_cube.voxel_size = {1.0 / 64, 1.0 / 64, 1.0 / 64};
    unit_cube.origin = {0.5 / 64, 0.5 / 64, 0.5 / 64};
    expect_parity_of_every_operation("reference batch-16", batch16, std::vector<MemberTransform>(16, unit_cube), 16);
    // The whole file, with random transforms.
    Rng rng(48);
    expect_parity_of_every_operation("reference batch (all members)", all,
                                     random_transforms(rng, static_cast<int64_t>(all.size())), 49);
}

}  // namespace
}  // namespace sparsegrid_test
