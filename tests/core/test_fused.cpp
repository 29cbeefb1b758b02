// Generated grid + kernel map built together: identical to building the grid and then looking up its
// map, on every backend (the fused K = S = 2 transposed build never looks anything up).
#include "oracle.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace sparsegrid_test {
namespace {

using sparsegrid::GridAndMap;

class FusedTest : public BackendTest {};
INSTANTIATE_TEST_SUITE_P(, FusedTest, ::testing::ValuesIn(available_backends()), backend_name);

const std::vector<std::pair<Vec3i, Vec3i>> kFusedCases{
    {{2, 2, 2}, {2, 2, 2}}, {{3, 3, 3}, {2, 2, 2}}, {{2, 2, 2}, {1, 1, 1}}, {{4, 4, 4}, {4, 4, 4}},
    {{2, 2, 1}, {2, 2, 1}}, {{3, 2, 5}, {1, 2, 3}}, {{1, 1, 1}, {1, 1, 1}},
};

::testing::AssertionResult same_grid(const GridBatch& actual, const GridBatch& expected) {
    if (actual.voxel_offsets() != expected.voxel_offsets()) return ::testing::AssertionFailure() << "offsets differ";
    if (actual.ijk_host() != expected.ijk_host()) return ::testing::AssertionFailure() << "voxels differ";
    return ::testing::AssertionSuccess();
}

TEST_P(FusedTest, ConvTransposeGridAndMapEqualsSeparateBuilds) {
    for (std::size_t index = 0; index < test_seeds().size(); ++index) {
        const uint64_t seed = test_seeds()[index] + 7000;
        SCOPED_TRACE("seed " + std::to_string(seed));
        Rng rng(seed);
        RandomBatchOptions options;
        options.batch_size = 1 + static_cast<int64_t>(index % 8);
        const GridBatch grid = make_grid(random_members(rng, options), random_transforms(rng, options.batch_size));
        for (const auto& [k, s] : kFusedCases) {
            SCOPED_TRACE("K=" + str(k) + " S=" + str(s));
            const GridAndMap fused = sparsegrid::conv_transpose_grid_and_map(grid, k, s);
            const GridBatch expected_grid = grid.conv_transpose_grid(k, s);
            EXPECT_TRUE(same_grid(fused.grid, expected_grid));
            EXPECT_TRUE(transforms_near(fused.grid.transforms(), expected_grid.transforms(), 0.0));
            EXPECT_TRUE(
                maps_equal(fused.map, sparsegrid::neighbour_map(grid, fused.grid, k, s, MapDirection::Transposed)));
            EXPECT_TRUE(map_matches_oracle(fused.map, grid, fused.grid, k, s, MapDirection::Transposed));
        }
    }
}

TEST_P(FusedTest, ConvGridAndMapEqualsSeparateBuilds) {
    for (std::size_t index = 0; index < test_seeds().size(); ++index) {
        const uint64_t seed = test_seeds()[index] + 8000;
        SCOPED_TRACE("seed " + std::to_string(seed));
        Rng rng(seed);
        RandomBatchOptions options;
        options.batch_size = 1 + static_cast<int64_t>((index + 2) % 8);
        const GridBatch grid = make_grid(random_members(rng, options), random_transforms(rng, options.batch_size));
        for (const auto& [k, s] : kFusedCases) {
            SCOPED_TRACE("K=" + str(k) + " S=" + str(s));
            const GridAndMap fused = sparsegrid::conv_grid_and_map(grid, k, s);
            EXPECT_TRUE(same_grid(fused.grid, grid.conv_grid(k, s)));
            EXPECT_TRUE(map_matches_oracle(fused.map, grid, fused.grid, k, s, MapDirection::Forward));
        }
    }
}

TEST_P(FusedTest, SubdivisionMapOfEmptyAndSingleVoxelMembers) {
    const GridBatch grid = make_grid({{}, {{-1, 0, 5}}, {}});
    const GridAndMap fused = sparsegrid::conv_transpose_grid_and_map(grid, {2, 2, 2}, {2, 2, 2});
    ASSERT_EQ(fused.grid.num_voxels(), 8);
    EXPECT_EQ(fused.grid.voxel_offsets(), (std::vector<int64_t>{0, 0, 8, 8}));
    const std::vector<int32_t> map = map_host(fused.map);
    // Child t of the only voxel (index 0) is reached through tap t and through no other tap.
    for (int32_t row = 0; row < 8; ++row)
        for (int32_t t = 0; t < 8; ++t) EXPECT_EQ(map[row * 8 + t], t == row ? 0 : -1) << "row " << row << " tap " << t;
}

}  // namespace
}  // namespace sparsegrid_test
