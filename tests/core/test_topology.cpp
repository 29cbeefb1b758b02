// Topology operations against the brute-force oracle (as sets and in the documented order), their
// world transforms, and the algebraic properties that tie them together. Every test runs on each
// backend present (test_util.h).
#include "oracle.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace sparsegrid_test {
namespace {

class TopologyTest : public BackendTest {};
INSTANTIATE_TEST_SUITE_P(, TopologyTest, ::testing::ValuesIn(available_backends()), backend_name);

struct RandomCase {
    uint64_t seed = 0;
    MemberLists members;
    std::vector<MemberTransform> transforms;
    GridBatch grid;
    OracleBatch oracle;
};

/// Case `index` of the seed list on ctx's device: batch sizes cycle through 1..8. `far` adds members
/// near +-2^30.
RandomCase make_case(std::size_t index, bool far, const sparsegrid::Context& ctx) {
    RandomCase c;
    c.seed = test_seeds()[index] + (far ? 1000 : 0);
    Rng rng(c.seed);
    RandomBatchOptions options;
    options.batch_size = 1 + static_cast<int64_t>(index % 8);
    options.allow_far = far;
    c.members = random_members(rng, options);
    c.transforms = random_transforms(rng, options.batch_size);
    c.grid = GridBatch::from_ijk(c.members, c.transforms, ctx);
    c.oracle = oracle_from_lists(c.members);
    return c;
}

std::string trace(const RandomCase& c) {
    return "seed=" + std::to_string(c.seed) + " batch_size=" + std::to_string(c.members.size());
}

/// The (K, S) pairs every randomized op runs: fixed interesting ones plus random ones from the seed.
std::vector<std::pair<Vec3i, Vec3i>> kernel_cases(uint64_t seed) {
    std::vector<std::pair<Vec3i, Vec3i>> out{
        {{1, 1, 1}, {1, 1, 1}}, {{3, 3, 3}, {1, 1, 1}}, {{2, 2, 2}, {2, 2, 2}},
        {{3, 3, 3}, {2, 2, 2}}, {{3, 2, 5}, {1, 2, 3}}, {{4, 1, 6}, {4, 5, 2}},
    };
    Rng rng(seed * 7919 + 17);
    for (int n = 0; n < 3; ++n) out.push_back({random_kernel_size(rng), random_stride(rng)});
    return out;
}

std::vector<MemberTransform> map_transforms(const std::vector<MemberTransform>& in,
                                            MemberTransform (*fn)(const MemberTransform&, const Vec3i&),
                                            const Vec3i& arg) {
    std::vector<MemberTransform> out;
    for (const auto& t : in) out.push_back(fn(t, arg));
    return out;
}

/// How often check_op saw a result inside / outside int32, so tests can assert both branches ran.
struct BranchCount {
    int in_range = 0;
    int overflow = 0;
};

/// Runs `op`; when the oracle's answer fits int32 it must match (set, order, transforms, and the
/// input's device) and otherwise the op must raise an overflow error naming `operation`.
void check_op(BranchCount& count, const std::string& operation, const std::function<GridBatch()>& op,
              const OracleBatch& expected, const std::vector<MemberTransform>& expected_transforms,
              const GridBatch& input);

void check_op(const std::string& operation, const std::function<GridBatch()>& op, const OracleBatch& expected,
              const std::vector<MemberTransform>& expected_transforms, const GridBatch& input) {
    BranchCount ignored;
    check_op(ignored, operation, op, expected, expected_transforms, input);
}

void check_op(BranchCount& count, const std::string& operation, const std::function<GridBatch()>& op,
              const OracleBatch& expected, const std::vector<MemberTransform>& expected_transforms,
              const GridBatch& input) {
    const std::vector<int32_t> input_before = input.ijk().to_host();
    if (fits_int32(expected)) {
        ++count.in_range;
        GridBatch out;
        try {
            out = op();
        } catch (const std::exception& e) {
            ADD_FAILURE() << operation << " threw although the result fits int32: " << e.what();
            return;
        }
        EXPECT_TRUE(grid_matches(out, expected, input.device())) << operation;
        EXPECT_TRUE(transforms_near(out.transforms(), expected_transforms)) << operation;
    } else {
        ++count.overflow;
        EXPECT_TRUE(throws_error(op, operation, {"int32", "overflow", "range", "fit"}))
            << operation << ": the result does not fit int32";
    }
    EXPECT_EQ(input.ijk().to_host(), input_before) << operation << " changed its input";
}

TEST_P(TopologyTest, FromIjkMatchesOracle) {
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const RandomCase c = make_case(i, far, ctx());
            SCOPED_TRACE(trace(c));
            EXPECT_TRUE(grid_matches(c.grid, c.oracle, device()));
            EXPECT_EQ(c.grid.transforms(), c.transforms);
        }
}

TEST_P(TopologyTest, ConvGridMatchesOracle) {
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const RandomCase c = make_case(i, far, ctx());
            SCOPED_TRACE(trace(c));
            for (const auto& [k, s] : kernel_cases(c.seed)) {
                SCOPED_TRACE("K=" + str(k) + " S=" + str(s));
                check_op(
                    "conv_grid", [&] { return c.grid.conv_grid(k, s); }, oracle_conv_grid(c.oracle, k, s),
                    map_transforms(c.transforms, transform_conv, s), c.grid);
            }
        }
}

/// Two grids alike: voxels, order, member offsets, transforms (bitwise) and device.
void expect_same_grid(const GridBatch& got, const GridBatch& want, const std::string& what) {
    EXPECT_EQ(got.ijk().to_host(), want.ijk().to_host()) << what;
    EXPECT_EQ(got.voxel_offsets(), want.voxel_offsets()) << what;
    EXPECT_EQ(got.coordinate_box(), want.coordinate_box()) << what;
    EXPECT_EQ(got.transforms(), want.transforms()) << what;
    EXPECT_EQ(got.device(), want.device()) << what;
}

TEST_P(TopologyTest, PyramidEqualsTheCallsItReplaces) {
    const std::vector<Vec3i> factors = {{2, 2, 2}, {4, 4, 4}, {3, 1, 2}, {1, 1, 1}, {8, 8, 8}};
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const RandomCase c = make_case(i, far, ctx());
            SCOPED_TRACE(trace(c));
            std::vector<std::pair<Vec3i, Vec3i>> cases = kernel_cases(c.seed);
            cases.push_back({{2, 3, 1}, {2, 2, 1}});
            cases.push_back({{1, 3, 3}, {2, 2, 2}});  // K < S on one axis: levels one from the other
            for (const auto& [k, s] : cases) {
                SCOPED_TRACE("K=" + str(k) + " S=" + str(s));
                std::vector<GridBatch> chain;
                bool chain_throws = false;
                try {
                    for (int l = 0; l < 4; ++l) chain.push_back((l == 0 ? c.grid : chain.back()).conv_grid(k, s));
                } catch (const sparsegrid::Error&) {
                    chain_throws = true;
                }
                if (chain_throws) {
                    EXPECT_THROW(c.grid.pyramid(k, s, 4, factors), sparsegrid::Error);
                    continue;
                }
                const sparsegrid::GridPyramid pyramid = c.grid.pyramid(k, s, 4, factors);
                ASSERT_EQ(pyramid.levels.size(), 4u);
                ASSERT_EQ(pyramid.coarsened.size(), factors.size());
                for (int l = 0; l < 4; ++l) expect_same_grid(pyramid.levels[l], chain[l], "level " + std::to_string(l));
                for (std::size_t f = 0; f < factors.size(); ++f)
                    expect_same_grid(pyramid.coarsened[f], c.grid.coarsened_grid(factors[f]),
                                     "coarsened by " + str(factors[f]));
            }
            // No levels, no factors, and the K = S = 1 levels (this grid).
            EXPECT_TRUE(c.grid.pyramid({3, 3, 3}, {2, 2, 2}, 0).levels.empty());
            const sparsegrid::GridPyramid same = c.grid.pyramid({1, 1, 1}, {1, 1, 1}, 2);
            for (const GridBatch& level : same.levels) expect_same_grid(level, c.grid, "K = S = 1");
        }
}

TEST_P(TopologyTest, PyramidOfManyGridsEqualsTheCallsItReplaces) {
    // 4 levels and 14 coarsened grids: more grids than one shared bitmap buffer takes on CUDA (16), so
    // they are built one by one there, with one sync for all still.
    std::vector<Vec3i> factors;
    for (int32_t f = 2; f < 16; ++f) factors.push_back({f, 1 + f % 3, 2});
    for (std::size_t i = 0; i < 3; ++i) {
        const RandomCase c = make_case(i, false, ctx());
        SCOPED_TRACE(trace(c));
        const sparsegrid::GridPyramid pyramid = c.grid.pyramid({3, 3, 3}, {2, 2, 2}, 4, factors);
        GridBatch level = c.grid;
        for (int l = 0; l < 4; ++l) {
            level = level.conv_grid({3, 3, 3}, {2, 2, 2});
            expect_same_grid(pyramid.levels[l], level, "level " + std::to_string(l));
        }
        for (std::size_t f = 0; f < factors.size(); ++f)
            expect_same_grid(pyramid.coarsened[f], c.grid.coarsened_grid(factors[f]),
                             "coarsened by " + str(factors[f]));
    }
}

TEST_P(TopologyTest, PyramidArgumentsAreChecked) {
    const RandomCase c = make_case(0, false, ctx());
    EXPECT_TRUE(throws_error([&] { c.grid.pyramid({3, 3, 3}, {2, 2, 2}, -1); }, "pyramid", {"levels", ">= 0"}));
    EXPECT_TRUE(throws_error(
        [&] {
            c.grid.pyramid({3, 3, 3}, {2, 2, 2}, 2, std::vector<Vec3i>{Vec3i{2, 0, 2}});
        },
        "pyramid", {"coarsening factor"}));
    EXPECT_TRUE(throws_error([&] { c.grid.pyramid({3, 0, 3}, {2, 2, 2}, 2); }, "pyramid", {"kernel_size"}));
}

TEST_P(TopologyTest, ConvTransposeGridMatchesOracle) {
    BranchCount count;
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const RandomCase c = make_case(i, far, ctx());
            SCOPED_TRACE(trace(c));
            for (const auto& [k, s] : kernel_cases(c.seed)) {
                SCOPED_TRACE("K=" + str(k) + " S=" + str(s));
                check_op(
                    count, "conv_transpose_grid", [&] { return c.grid.conv_transpose_grid(k, s); },
                    oracle_conv_transpose_grid(c.oracle, k, s),
                    map_transforms(c.transforms, transform_conv_transpose, s), c.grid);
            }
        }
    // The far batches (near +-2^30) must have exercised the overflow branch, the others the in-range one.
    EXPECT_GT(count.in_range, 50);
    EXPECT_GT(count.overflow, 10);
}

TEST_P(TopologyTest, CoarsenedGridMatchesOracle) {
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const RandomCase c = make_case(i, far, ctx());
            SCOPED_TRACE(trace(c));
            Rng rng(c.seed + 11);
            std::vector<Vec3i> factors{{1, 1, 1}, {2, 2, 2}, {3, 1, 2}, {7, 5, 4}};
            for (int n = 0; n < 2; ++n) factors.push_back(random_stride(rng));
            for (const Vec3i& f : factors) {
                SCOPED_TRACE("factor=" + str(f));
                check_op(
                    "coarsened_grid", [&] { return c.grid.coarsened_grid(f); }, oracle_coarsened_grid(c.oracle, f),
                    map_transforms(c.transforms, transform_coarsened, f), c.grid);
            }
        }
}

TEST_P(TopologyTest, RefinedGridMatchesOracle) {
    BranchCount count;
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const RandomCase c = make_case(i, far, ctx());
            SCOPED_TRACE(trace(c));
            Rng rng(c.seed + 23);
            const MemberLists lists = member_lists(c.grid);
            std::vector<Vec3i> factors{{1, 1, 1}, {2, 2, 2}, {3, 1, 2}};
            factors.push_back({static_cast<int32_t>(uniform_int(rng, 1, 3)),
                               static_cast<int32_t>(uniform_int(rng, 1, 3)),
                               static_cast<int32_t>(uniform_int(rng, 1, 3))});
            for (const Vec3i& f : factors) {
                SCOPED_TRACE("factor=" + str(f));
                const auto expected_transforms = map_transforms(c.transforms, transform_refined, f);
                check_op(
                    count, "refined_grid", [&] { return c.grid.refined_grid(f); }, oracle_refined_grid(lists, f, {}),
                    expected_transforms, c.grid);
                for (double keep : {0.0, 0.5, 1.0}) {
                    const std::vector<uint8_t> mask = random_mask(rng, c.grid.num_voxels(), keep);
                    const DeviceArray<uint8_t> device_mask = on_device(mask);
                    SCOPED_TRACE("mask keep probability " + std::to_string(keep));
                    check_op(
                        count, "refined_grid", [&] { return c.grid.refined_grid(f, device_mask); },
                        oracle_refined_grid(lists, f, mask), expected_transforms, c.grid);
                }
            }
        }
    EXPECT_GT(count.in_range, 50);
    EXPECT_GT(count.overflow, 10);
}

TEST_P(TopologyTest, DilatedGridMatchesOracle) {
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const RandomCase c = make_case(i, far, ctx());
            SCOPED_TRACE(trace(c));
            for (int32_t d : {0, 1, 2}) {
                SCOPED_TRACE("distance=" + std::to_string(d));
                check_op(
                    "dilated_grid", [&] { return c.grid.dilated_grid(d); }, oracle_dilated_grid(c.oracle, d),
                    c.transforms, c.grid);
            }
        }
}

TEST_P(TopologyTest, PrunedGridMatchesOracleAndKeepsOrder) {
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const RandomCase c = make_case(i, far, ctx());
            SCOPED_TRACE(trace(c));
            Rng rng(c.seed + 31);
            const MemberLists lists = member_lists(c.grid);
            const std::vector<Vec3i> all = c.grid.ijk_host();
            for (double keep : {0.0, 0.3, 0.7, 1.0}) {
                SCOPED_TRACE("keep probability " + std::to_string(keep));
                const std::vector<uint8_t> mask = random_mask(rng, c.grid.num_voxels(), keep);
                const DeviceArray<uint8_t> device_mask = on_device(mask);
                check_op(
                    "pruned_grid", [&] { return c.grid.pruned_grid(device_mask); }, oracle_pruned_grid(lists, mask),
                    c.transforms, c.grid);
                // Order preserved: exactly the masked subsequence, with offsets counting kept voxels.
                const GridBatch pruned = c.grid.pruned_grid(device_mask);
                std::vector<Vec3i> subsequence;
                std::vector<int64_t> offsets{0};
                for (int64_t m = 0; m < c.grid.batch_size(); ++m) {
                    for (int64_t n = c.grid.voxel_offsets()[m]; n < c.grid.voxel_offsets()[m + 1]; ++n)
                        if (mask[static_cast<std::size_t>(n)]) subsequence.push_back(all[static_cast<std::size_t>(n)]);
                    offsets.push_back(static_cast<int64_t>(subsequence.size()));
                }
                EXPECT_EQ(pruned.ijk_host(), subsequence);
                EXPECT_EQ(pruned.voxel_offsets(), offsets);
                // With the index: the same grid, and each kept voxel's index in the grid it came from.
                const sparsegrid::SelectedGrid selected = c.grid.pruned_grid_with_index(device_mask);
                std::vector<int64_t> kept;
                for (int64_t n = 0; n < c.grid.num_voxels(); ++n)
                    if (mask[static_cast<std::size_t>(n)]) kept.push_back(n);
                EXPECT_EQ(selected.grid.ijk_host(), subsequence);
                EXPECT_EQ(selected.grid.voxel_offsets(), offsets);
                EXPECT_EQ(selected.grid.transforms(), c.grid.transforms());
                EXPECT_EQ(selected.kept_index.device(), c.grid.device());
                EXPECT_EQ(selected.kept_index.to_host(c.grid.context().stream), kept);
            }
        }
}

TEST_P(TopologyTest, MergedGridMatchesOracle) {
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const RandomCase c = make_case(i, far, ctx());
            SCOPED_TRACE(trace(c));
            Rng rng(c.seed + 41);
            RandomBatchOptions options;
            options.batch_size = c.grid.batch_size();
            options.allow_far = far;
            const MemberLists other_members = random_members(rng, options);
            const GridBatch other = make_grid(other_members, c.transforms);
            check_op(
                "merged_grid", [&] { return c.grid.merged_grid(other); },
                oracle_merged_grid(c.oracle, oracle_from_lists(other_members)), c.transforms, c.grid);
            check_op(
                "merged_grid", [&] { return other.merged_grid(c.grid); },
                oracle_merged_grid(c.oracle, oracle_from_lists(other_members)), c.transforms, other);
            check_op(
                "merged_grid", [&] { return c.grid.merged_grid(c.grid); }, c.oracle, c.transforms, c.grid);
            const GridBatch empty = make_grid(MemberLists(c.members.size()), c.transforms);
            check_op(
                "merged_grid", [&] { return c.grid.merged_grid(empty); }, c.oracle, c.transforms, c.grid);
            check_op(
                "merged_grid", [&] { return empty.merged_grid(c.grid); }, c.oracle, c.transforms, empty);
        }
}

TEST_P(TopologyTest, ScalarOverloadsEqualVectorOnes) {
    const RandomCase c = make_case(3, false, ctx());
    SCOPED_TRACE(trace(c));
    EXPECT_EQ(c.grid.conv_grid(3, 2).ijk_host(), c.grid.conv_grid(Vec3i{3, 3, 3}, Vec3i{2, 2, 2}).ijk_host());
    EXPECT_EQ(c.grid.conv_transpose_grid(3, 2).ijk_host(),
              c.grid.conv_transpose_grid(Vec3i{3, 3, 3}, Vec3i{2, 2, 2}).ijk_host());
    EXPECT_EQ(c.grid.coarsened_grid(3).ijk_host(), c.grid.coarsened_grid(Vec3i{3, 3, 3}).ijk_host());
    EXPECT_EQ(c.grid.refined_grid(2).ijk_host(), c.grid.refined_grid(Vec3i{2, 2, 2}).ijk_host());
    EXPECT_TRUE(grid_matches(c.grid.conv_grid(3, 2), oracle_conv_grid(c.oracle, {3, 3, 3}, {2, 2, 2}), device()));
}

// ---- check values from DESIGN.md ------------------------------------------------------------------

std::vector<Vec3i> line(int32_t lo, int32_t hi, int axis = 0) {
    std::vector<Vec3i> out;
    for (int32_t v = lo; v <= hi; ++v) {
        Vec3i c{0, 0, 0};
        c[axis] = v;
        out.push_back(c);
    }
    return out;
}

TEST_P(TopologyTest, DesignCheckValuesEveryAxis) {
    for (int axis = 0; axis < 3; ++axis) {
        SCOPED_TRACE("axis " + std::to_string(axis));
        Vec3i k4{1, 1, 1}, s4{1, 1, 1}, s3{1, 1, 1};
        k4[axis] = 4;
        s4[axis] = 4;
        s3[axis] = 3;
        // Lines along one axis are sorted by that coordinate in the documented order (non-negative part).
        EXPECT_EQ(make_grid(MemberLists{line(0, 15, axis)}).conv_grid(k4, s4).ijk_host(), line(0, 4, axis));
        EXPECT_EQ(make_grid(MemberLists{line(0, 0, axis)}).conv_transpose_grid(k4, s4).ijk_host(), line(-1, 2, axis));
        EXPECT_EQ(make_grid(MemberLists{line(-3, 3, axis)}).conv_grid(Vec3i{1, 1, 1}, s3).ijk_host(),
                  line(-1, 1, axis));
    }
    // Scalar overload: all three axes at once.
    const GridBatch origin = make_grid(MemberLists{{{0, 0, 0}}});
    const GridBatch cube = origin.conv_transpose_grid(4, 4);
    OracleBatch expected(1);
    for (int64_t i = -1; i <= 2; ++i)
        for (int64_t j = -1; j <= 2; ++j)
            for (int64_t k = -1; k <= 2; ++k) expected[0].insert({i, j, k});
    EXPECT_TRUE(grid_matches(cube, expected, device()));
}

TEST_P(TopologyTest, HandWrittenOrder) {
    const GridBatch grid = make_grid(
        MemberLists{{{1, 0, 0}, {0, 0, 1}, {0, 1, 0}, {-1, 0, 0}, {0, 0, 0}, {0, 0, -1}, {2, 2, 2}}, {{5, 5, 5}}});
    const std::vector<Vec3i> expected{{-1, 0, 0}, {0, 0, -1}, {0, 0, 0}, {0, 0, 1},
                                      {0, 1, 0},  {1, 0, 0},  {2, 2, 2}, {5, 5, 5}};
    EXPECT_EQ(grid.ijk_host(), expected);
    EXPECT_EQ(grid.voxel_offsets(), (std::vector<int64_t>{0, 7, 8}));
}

// ---- transforms -----------------------------------------------------------------------------------

TEST_P(TopologyTest, TransformsFollowDesign) {
    const std::vector<MemberTransform> transforms{{{0.5, 0.25, 2.0}, {1.0, -2.0, 3.5}},
                                                  {{0.1, 0.3, 0.7}, {-4.0, 0.0, 9.0}}};
    const GridBatch grid = make_grid(MemberLists{{{0, 0, 0}, {3, -2, 7}}, {{-5, 1, 1}}}, transforms);
    const Vec3i k{3, 2, 5};
    const Vec3i s{1, 2, 3};
    const Vec3i f{2, 3, 4};
    std::vector<MemberTransform> want;
    // conv_grid: h' = S*h, o' = o.
    want = {{{0.5, 0.5, 6.0}, {1.0, -2.0, 3.5}}, {{0.1, 0.6, 2.1}, {-4.0, 0.0, 9.0}}};
    EXPECT_TRUE(transforms_near(grid.conv_grid(k, s).transforms(), want));
    // conv_transpose_grid: h' = h/S, o' = o.
    want = {{{0.5, 0.125, 2.0 / 3.0}, {1.0, -2.0, 3.5}}, {{0.1, 0.15, 0.7 / 3.0}, {-4.0, 0.0, 9.0}}};
    EXPECT_TRUE(transforms_near(grid.conv_transpose_grid(k, s).transforms(), want));
    // coarsened_grid: h' = f*h, o' = o + (f-1)*h/2.
    want = {{{1.0, 0.75, 8.0}, {1.25, -1.75, 6.5}}, {{0.2, 0.9, 2.8}, {-3.95, 0.3, 10.05}}};
    EXPECT_TRUE(transforms_near(grid.coarsened_grid(f).transforms(), want));
    // refined_grid: h' = h/f, o' = o - (f-1)*h'/2.
    want = {{{0.25, 0.25 / 3.0, 0.5}, {1.0 - 0.125, -2.0 - 0.25 / 3.0, 3.5 - 0.75}},
            {{0.05, 0.1, 0.175}, {-4.025, -0.1, 9.0 - 0.2625}}};
    EXPECT_TRUE(transforms_near(grid.refined_grid(f).transforms(), want));
    // dilated / pruned / merged keep the transforms.
    EXPECT_EQ(grid.dilated_grid(2).transforms(), transforms);
    EXPECT_EQ(grid.pruned_grid(on_device(std::vector<uint8_t>{1, 0, 1})).transforms(), transforms);
    EXPECT_EQ(grid.merged_grid(grid.dilated_grid(1)).transforms(), transforms);
    // World positions of the same voxel centres agree across refine / coarsen: the centre of refined
    // block f*c + (f-1)/2 is the centre of coarse voxel c.
    const GridBatch refined = grid.refined_grid(f);
    for (int64_t m = 0; m < 2; ++m) {
        const Vec3d c{3.0, -2.0, 7.0};
        const Vec3d centre{f[0] * c[0] + (f[0] - 1) / 2.0, f[1] * c[1] + (f[1] - 1) / 2.0,
                           f[2] * c[2] + (f[2] - 1) / 2.0};
        const Vec3d a = grid.index_to_world(m, c);
        const Vec3d b = refined.index_to_world(m, centre);
        for (int ax = 0; ax < 3; ++ax) EXPECT_NEAR(a[ax], b[ax], 1e-12) << "member " << m << " axis " << ax;
    }
}

// ---- algebraic properties -------------------------------------------------------------------------

TEST_P(TopologyTest, RefineThenCoarsenIsIdentity) {
    for (std::size_t i = 0; i < test_seeds().size(); ++i) {
        const RandomCase c = make_case(i, false, ctx());
        SCOPED_TRACE(trace(c));
        for (const Vec3i& f : {Vec3i{1, 1, 1}, Vec3i{2, 2, 2}, Vec3i{3, 2, 1}, Vec3i{4, 4, 4}}) {
            SCOPED_TRACE("factor=" + str(f));
            const GridBatch back = c.grid.refined_grid(f).coarsened_grid(f);
            EXPECT_EQ(back.ijk_host(), c.grid.ijk_host());
            EXPECT_EQ(back.voxel_offsets(), c.grid.voxel_offsets());
            EXPECT_TRUE(transforms_near(back.transforms(), c.transforms));
        }
    }
}

TEST_P(TopologyTest, CoarsenOfMaskedRefineIsPrune) {
    for (std::size_t i = 0; i < test_seeds().size(); ++i) {
        const RandomCase c = make_case(i, false, ctx());
        SCOPED_TRACE(trace(c));
        Rng rng(c.seed + 53);
        for (const Vec3i& f : {Vec3i{2, 2, 2}, Vec3i{1, 3, 2}}) {
            SCOPED_TRACE("factor=" + str(f));
            const DeviceArray<uint8_t> mask = on_device(random_mask(rng, c.grid.num_voxels(), 0.5));
            const GridBatch via_refine = c.grid.refined_grid(f, mask).coarsened_grid(f);
            const GridBatch pruned = c.grid.pruned_grid(mask);
            EXPECT_EQ(via_refine.ijk_host(), pruned.ijk_host());
            EXPECT_EQ(via_refine.voxel_offsets(), pruned.voxel_offsets());
        }
    }
}

TEST_P(TopologyTest, DilateEqualsOddStrideOneConv) {
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const RandomCase c = make_case(i, far, ctx());
            SCOPED_TRACE(trace(c));
            for (int32_t d : {0, 1, 2, 3}) {
                SCOPED_TRACE("distance=" + std::to_string(d));
                const GridBatch dilated = c.grid.dilated_grid(d);
                const GridBatch conv = c.grid.conv_grid(2 * d + 1, 1);
                EXPECT_EQ(dilated.ijk_host(), conv.ijk_host());
                EXPECT_EQ(dilated.voxel_offsets(), conv.voxel_offsets());
                EXPECT_EQ(dilated.transforms(), conv.transforms());
            }
        }
}

TEST_P(TopologyTest, ConvTransposeStrideOneOddKernelEqualsDilate) {
    // With S = 1 and odd K the generated grid is the Chebyshev box (K-1)/2 around every voxel.
    for (std::size_t i = 0; i < 4; ++i) {
        const RandomCase c = make_case(i, false, ctx());
        SCOPED_TRACE(trace(c));
        EXPECT_EQ(c.grid.conv_transpose_grid(3, 1).ijk_host(), c.grid.dilated_grid(1).ijk_host());
        EXPECT_EQ(c.grid.conv_transpose_grid(5, 1).ijk_host(), c.grid.dilated_grid(2).ijk_host());
    }
}

TEST_P(TopologyTest, TwoByTwoSubdivisionEqualsRefineByTwo) {
    // conv_transpose_grid(2, 2) generates exactly the children 2c + {0,1}^3.
    for (bool far : {false})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const RandomCase c = make_case(i, far, ctx());
            SCOPED_TRACE(trace(c));
            EXPECT_EQ(c.grid.conv_transpose_grid(2, 2).ijk_host(), c.grid.refined_grid(2).ijk_host());
            EXPECT_EQ(c.grid.conv_grid(2, 2).ijk_host(), c.grid.coarsened_grid(2).ijk_host());
        }
}

TEST_P(TopologyTest, FromIjkInvariantUnderShuffleAndDuplicates) {
    for (std::size_t i = 0; i < test_seeds().size(); ++i) {
        const RandomCase c = make_case(i, true, ctx());
        SCOPED_TRACE(trace(c));
        Rng rng(c.seed + 61);
        MemberLists shuffled = c.members;
        for (auto& member : shuffled) {
            const std::size_t original = member.size();
            for (std::size_t n = 0; n < original; ++n)
                if (uniform_int(rng, 0, 2) == 0) member.push_back(member[n]);
            std::shuffle(member.begin(), member.end(), rng);
        }
        const GridBatch again = make_grid(shuffled, c.transforms);
        EXPECT_EQ(again.ijk_host(), c.grid.ijk_host());
        EXPECT_EQ(again.voxel_offsets(), c.grid.voxel_offsets());
        // And from the already sorted output.
        const GridBatch from_sorted = make_grid(member_lists(c.grid), c.transforms);
        EXPECT_EQ(from_sorted.ijk_host(), c.grid.ijk_host());
    }
}

TEST_P(TopologyTest, FromIjkSpanMatchesHostConvenience) {
    const RandomCase c = make_case(5, true, ctx());
    SCOPED_TRACE(trace(c));
    const FlatTriples<int32_t> flat = flatten(c.members);
    const DeviceArray<int32_t> ijk = on_device(flat.values);
    const GridBatch grid = GridBatch::from_ijk(ijk, flat.offsets, c.transforms, ctx());
    EXPECT_TRUE(grid_matches(grid, c.oracle, device()));
    EXPECT_EQ(grid.transforms(), c.transforms);
    // No transforms: unit voxels at the origin.
    const GridBatch unit = GridBatch::from_ijk(ijk, flat.offsets, {}, ctx());
    EXPECT_TRUE(grid_matches(unit, c.oracle, device()));
    EXPECT_EQ(unit.transforms(), std::vector<MemberTransform>(c.members.size()));
}

TEST_P(TopologyTest, EmptyMembersStayEmpty) {
    const std::vector<MemberTransform> transforms(4);
    const GridBatch grid = make_grid(MemberLists{{}, {{1, 2, 3}, {-4, 5, -6}}, {}, {{0, 0, 0}}}, transforms);
    const DeviceArray<uint8_t> all = on_device(std::vector<uint8_t>(static_cast<std::size_t>(grid.num_voxels()), 1));
    const std::vector<GridBatch> results{
        grid.conv_grid(3, 2),  grid.conv_transpose_grid(3, 2), grid.coarsened_grid(2),
        grid.refined_grid(2),  grid.refined_grid(2, all),      grid.dilated_grid(1),
        grid.pruned_grid(all), grid.merged_grid(grid),         grid.conv_grid({2, 3, 1}, {1, 2, 3})};
    for (std::size_t r = 0; r < results.size(); ++r) {
        SCOPED_TRACE("result " + std::to_string(r));
        EXPECT_TRUE(grid_is_well_formed(results[r], device()));
        ASSERT_EQ(results[r].batch_size(), 4);
        EXPECT_EQ(results[r].num_voxels(0), 0);
        EXPECT_GT(results[r].num_voxels(1), 0);
        EXPECT_EQ(results[r].num_voxels(2), 0);
        EXPECT_GT(results[r].num_voxels(3), 0);
    }
}

/// Coarsening and pruning number their output by one scan over the batch, which also yields the member
/// offsets: empty members first, between others, in a row and last, and members that the prune empties,
/// keep their place and size (exactly the oracle's grids).
TEST_P(TopologyTest, CompactionsKeepEmptyMembersAtEveryPosition) {
    const MemberLists members{{},
                              {{0, 0, 0}, {1, 1, 1}, {2, 0, 0}, {-1, -1, -1}, {5, -3, 2}, {4, 4, 4}},
                              {},
                              {},
                              {{7, 7, 7}, {6, 7, 7}, {-8, 0, 9}},
                              {{100, -100, 3}},
                              {}};
    const GridBatch grid = make_grid(members, std::vector<MemberTransform>(members.size()));
    const OracleBatch oracle = oracle_from_lists(members);
    for (int32_t factor : {2, 4, 3}) {  // powers of two keep voxel order; 3 takes the general path
        SCOPED_TRACE("factor " + std::to_string(factor));
        EXPECT_TRUE(grid_matches(grid.coarsened_grid(factor), oracle_coarsened_grid(oracle, {factor, factor, factor}),
                                 device()));
    }
    EXPECT_TRUE(grid_matches(grid.conv_grid(2, 2), oracle_conv_grid(oracle, {2, 2, 2}, {2, 2, 2}), device()));
    const std::vector<std::vector<uint8_t>> masks{
        {1, 0, 1, 1, 0, 1, 0, 0, 0, 1},  // member 4 emptied
        {0, 0, 0, 0, 0, 0, 1, 1, 1, 0},  // only member 4 kept: the members after it end empty
        {0, 0, 0, 0, 0, 0, 0, 0, 0, 1},  // only the last non-empty member
        {1, 0, 0, 0, 0, 0, 0, 0, 0, 0},  // only the first voxel
        std::vector<uint8_t>(10, 0)};
    ASSERT_EQ(grid.num_voxels(), 10);
    const MemberLists lists = member_lists(grid);
    for (std::size_t k = 0; k < masks.size(); ++k) {
        SCOPED_TRACE("mask " + std::to_string(k));
        const DeviceArray<uint8_t> mask = on_device(masks[k]);
        const GridBatch pruned = grid.pruned_grid(mask);
        EXPECT_TRUE(grid_matches(pruned, oracle_pruned_grid(lists, masks[k]), device()));
        EXPECT_EQ(pruned.batch_size(), static_cast<int64_t>(members.size()));
    }
}

/// The same over 300 members, two thirds of them empty (runs of them included, at both ends), so that
/// finding the members that start at a voxel searches a long offset table.
TEST_P(TopologyTest, CompactionsOfManyMembersMostlyEmpty) {
    Rng rng(20261206);
    MemberLists members(300);
    for (std::size_t m = 0; m < members.size(); ++m) {
        if (m < 7 || m + 9 >= members.size() || uniform_int(rng, 0, 2) != 0) continue;  // empty
        const int64_t count = uniform_int(rng, 1, 12);
        for (int64_t i = 0; i < count; ++i)
            members[m].push_back({static_cast<int32_t>(uniform_int(rng, -20, 20)),
                                  static_cast<int32_t>(uniform_int(rng, -20, 20)),
                                  static_cast<int32_t>(uniform_int(rng, -20, 20))});
    }
    const GridBatch grid = make_grid(members, std::vector<MemberTransform>(members.size()));
    const OracleBatch oracle = oracle_from_lists(members);
    for (int32_t factor : {2, 8}) {
        SCOPED_TRACE("factor " + std::to_string(factor));
        EXPECT_TRUE(grid_matches(grid.coarsened_grid(factor), oracle_coarsened_grid(oracle, {factor, factor, factor}),
                                 device()));
    }
    const MemberLists lists = member_lists(grid);
    for (double keep : {0.0, 0.1, 0.5, 1.0}) {
        SCOPED_TRACE("keep " + std::to_string(keep));
        const std::vector<uint8_t> mask = random_mask(rng, grid.num_voxels(), keep);
        const DeviceArray<uint8_t> device_mask = on_device(mask);
        EXPECT_TRUE(grid_matches(grid.pruned_grid(device_mask), oracle_pruned_grid(lists, mask), device()));
    }
}

TEST_P(TopologyTest, BatchWithoutVoxels) {
    const std::vector<MemberTransform> transforms(3);
    const GridBatch grid = make_grid(MemberLists(3), transforms);
    EXPECT_EQ(grid.batch_size(), 3);
    EXPECT_EQ(grid.num_voxels(), 0);
    EXPECT_TRUE(grid.coordinate_box().empty());
    const DeviceArray<uint8_t> none = on_device(std::vector<uint8_t>{});
    const std::vector<GridBatch> results{grid,
                                         grid.conv_grid(3, 2),
                                         grid.conv_transpose_grid(3, 2),
                                         grid.coarsened_grid(2),
                                         grid.refined_grid(2),
                                         grid.refined_grid(2, none),
                                         grid.dilated_grid(2),
                                         grid.pruned_grid(none),
                                         grid.merged_grid(grid),
                                         grid.pyramid({3, 3, 3}, {2, 2, 2}, 2, {{4, 4, 4}}).levels[1],
                                         grid.pyramid({3, 3, 3}, {2, 2, 2}, 1, {{4, 4, 4}}).coarsened[0]};
    for (std::size_t r = 0; r < results.size(); ++r) {
        SCOPED_TRACE("result " + std::to_string(r));
        EXPECT_TRUE(grid_matches(results[r], OracleBatch(3), device()));
    }
    // Also through the span constructor with zero triples.
    const GridBatch spans = GridBatch::from_ijk(on_device(std::vector<int32_t>{}), {0, 0, 0}, {}, ctx());
    EXPECT_TRUE(grid_matches(spans, OracleBatch(2), device()));
}

TEST(Topology, DefaultGridBatchIsEmpty) {
    const GridBatch grid;
    EXPECT_EQ(grid.batch_size(), 0);
    EXPECT_EQ(grid.num_voxels(), 0);
    EXPECT_EQ(grid.device(), sparsegrid::Device::cpu());
    EXPECT_EQ(grid.voxel_offsets(), std::vector<int64_t>{0});
}

TEST_P(TopologyTest, LargeBatchMatchesOracle) {
    // 8 members of dense-ish blobs, ~20k voxels in total.
    Rng rng(424242);
    SCOPED_TRACE("seed=424242");
    MemberLists members(8);
    for (auto& member : members) {
        const Vec3i centre{static_cast<int32_t>(uniform_int(rng, -200, 200)),
                           static_cast<int32_t>(uniform_int(rng, -200, 200)),
                           static_cast<int32_t>(uniform_int(rng, -200, 200))};
        for (int32_t i = -8; i <= 8; ++i)
            for (int32_t j = -8; j <= 8; ++j)
                for (int32_t k = -8; k <= 8; ++k)
                    if (i * i + j * j + k * k <= 81 && uniform_real(rng, 0.0, 1.0) < 0.85)
                        member.push_back({centre[0] + i, centre[1] + j, centre[2] + k});
    }
    const std::vector<MemberTransform> transforms = random_transforms(rng, 8);
    const GridBatch grid = make_grid(members, transforms);
    const OracleBatch oracle = oracle_from_lists(members);
    EXPECT_GT(grid.num_voxels(), 15000);
    EXPECT_LT(grid.num_voxels(), 30000);
    EXPECT_TRUE(grid_matches(grid, oracle, device()));
    EXPECT_TRUE(grid_matches(grid.conv_grid(3, 2), oracle_conv_grid(oracle, {3, 3, 3}, {2, 2, 2}), device()));
    EXPECT_TRUE(
        grid_matches(grid.conv_grid({2, 3, 4}, {2, 1, 3}), oracle_conv_grid(oracle, {2, 3, 4}, {2, 1, 3}), device()));
    EXPECT_TRUE(grid_matches(grid.conv_transpose_grid(2, 2), oracle_conv_transpose_grid(oracle, {2, 2, 2}, {2, 2, 2}),
                             device()));
    EXPECT_TRUE(grid_matches(grid.coarsened_grid(3), oracle_coarsened_grid(oracle, {3, 3, 3}), device()));
    EXPECT_TRUE(grid_matches(grid.dilated_grid(1), oracle_dilated_grid(oracle, 1), device()));
    const std::vector<uint8_t> mask = random_mask(rng, grid.num_voxels(), 0.3);
    const DeviceArray<uint8_t> device_mask = on_device(mask);
    EXPECT_TRUE(grid_matches(grid.pruned_grid(device_mask), oracle_pruned_grid(member_lists(grid), mask), device()));
    EXPECT_TRUE(grid_matches(grid.refined_grid(2, device_mask),
                             oracle_refined_grid(member_lists(grid), {2, 2, 2}, mask), device()));

    const GridBatch coarse = grid.conv_grid(3, 2);
    const KernelMap forward = sparsegrid::neighbour_map(grid, coarse, {3, 3, 3}, {2, 2, 2});
    EXPECT_TRUE(map_matches_oracle(forward, grid, coarse, {3, 3, 3}, {2, 2, 2}, MapDirection::Forward));
    const KernelMap submanifold = sparsegrid::neighbour_map(grid, grid, {3, 3, 3}, {1, 1, 1});
    EXPECT_TRUE(map_matches_oracle(submanifold, grid, grid, {3, 3, 3}, {1, 1, 1}, MapDirection::Forward));
    EXPECT_TRUE(pairs_match_map(submanifold));
    EXPECT_TRUE(maps_equal(forward.transposed(),
                           sparsegrid::neighbour_map(coarse, grid, {3, 3, 3}, {2, 2, 2}, MapDirection::Transposed)));
}

}  // namespace
}  // namespace sparsegrid_test
