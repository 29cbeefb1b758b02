// GridBatch::clipped_grid: per-member box clips against a brute-force filter of each member's voxels
// (set, order, offsets, the kept voxels' old indices, transforms), box broadcast, boxes keeping nothing
// or everything, the int32 limits and argument errors, on each backend present.
#include "test_util.h"

#include <gtest/gtest.h>

namespace sparsegrid_test {
namespace {

using sparsegrid::ClippedGrid;

class ClippedGridTest : public BackendTest {};
INSTANTIATE_TEST_SUITE_P(, ClippedGridTest, ::testing::ValuesIn(available_backends()), backend_name);

struct Expected {
    std::vector<Vec3i> ijk;
    std::vector<int64_t> offsets{0};
    std::vector<int64_t> kept_index;
};

/// The voxels of `grid` (in its order) inside their member's box, written as the definition says.
Expected brute_force_clip(const GridBatch& grid, const std::vector<Vec3i>& lo, const std::vector<Vec3i>& hi) {
    Expected expected;
    const std::vector<Vec3i> all = grid.ijk_host();
    for (int64_t m = 0; m < grid.batch_size(); ++m) {
        const std::size_t b = lo.size() == 1 ? 0 : static_cast<std::size_t>(m);
        for (int64_t n = grid.voxel_offsets()[m]; n < grid.voxel_offsets()[m + 1]; ++n) {
            const Vec3i& v = all[static_cast<std::size_t>(n)];
            bool inside = true;
            for (int a = 0; a < 3; ++a) inside = inside && lo[b][a] <= v[a] && v[a] <= hi[b][a];
            if (!inside) continue;
            expected.ijk.push_back(v);
            expected.kept_index.push_back(n);
        }
        expected.offsets.push_back(static_cast<int64_t>(expected.ijk.size()));
    }
    return expected;
}

void expect_clip(const GridBatch& grid, const std::vector<Vec3i>& lo, const std::vector<Vec3i>& hi,
                 sparsegrid::Device device) {
    const ClippedGrid clipped = grid.clipped_grid(lo, hi);
    const Expected expected = brute_force_clip(grid, lo, hi);
    EXPECT_TRUE(grid_is_well_formed(clipped.grid, device));
    EXPECT_EQ(clipped.grid.ijk_host(), expected.ijk);
    EXPECT_EQ(clipped.grid.voxel_offsets(), expected.offsets);
    EXPECT_EQ(clipped.kept_index.device(), device);
    EXPECT_EQ(clipped.kept_index.to_host(grid.context().stream), expected.kept_index);
    EXPECT_EQ(clipped.grid.transforms(), grid.transforms());
}

TEST_P(ClippedGridTest, MatchesBruteForceOnRandomBatchesAndBoxes) {
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const uint64_t seed = test_seeds()[i] + (far ? 1000 : 0);
            SCOPED_TRACE("seed=" + std::to_string(seed));
            Rng rng(seed);
            RandomBatchOptions options;
            options.batch_size = 1 + static_cast<int64_t>(i % 8);
            options.allow_far = far;
            const MemberLists members = random_members(rng, options);
            const GridBatch grid = make_grid(members, random_transforms(rng, options.batch_size));
            for (int round = 0; round < 4; ++round) {
                std::vector<Vec3i> lo, hi;
                for (int64_t m = 0; m < grid.batch_size(); ++m) {
                    Vec3i l{}, h{};
                    for (int a = 0; a < 3; ++a) {
                        // Mostly boxes cutting through the blobs; sometimes inverted (keeps nothing).
                        l[a] = static_cast<int32_t>(uniform_int(rng, -300, 300));
                        h[a] = static_cast<int32_t>(l[a] + uniform_int(rng, round == 3 ? -5 : 0, 400));
                    }
                    lo.push_back(l);
                    hi.push_back(h);
                }
                SCOPED_TRACE("round " + std::to_string(round));
                expect_clip(grid, lo, hi, device());
            }
            // One box for every member, and the whole int32 range (keeps everything).
            expect_clip(grid, {{-20, -20, -20}}, {{20, 20, 20}}, device());
            expect_clip(grid, {{kInt32Min, kInt32Min, kInt32Min}}, {{kInt32Max, kInt32Max, kInt32Max}}, device());
        }
}

TEST_P(ClippedGridTest, HandWrittenClipAndFeaturesFollow) {
    const GridBatch grid = make_grid({{{0, 0, 0}, {1, 0, 0}, {5, 5, 5}, {-1, 2, 3}}, {{2, 2, 2}, {3, 3, 3}}, {}});
    const ClippedGrid clipped = grid.clipped_grid({{0, 0, 0}, {3, 3, 3}, {0, 0, 0}}, {{1, 1, 1}, {9, 9, 9}, {1, 1, 1}});
    EXPECT_EQ(clipped.grid.voxel_offsets(), (std::vector<int64_t>{0, 2, 3, 3}));
    const std::vector<Vec3i> kept = clipped.grid.ijk_host();
    const std::vector<Vec3i> all = grid.ijk_host();
    const std::vector<int64_t> index = clipped.kept_index.to_host(grid.context().stream);
    ASSERT_EQ(index.size(), kept.size());
    // Features (here the coordinates themselves) follow through kept_index.
    for (std::size_t n = 0; n < kept.size(); ++n) EXPECT_EQ(kept[n], all[static_cast<std::size_t>(index[n])]);
    EXPECT_EQ(kept[2], (Vec3i{3, 3, 3}));
}

TEST_P(ClippedGridTest, ArgumentErrorsNameTheArgument) {
    const GridBatch grid = make_grid({{{0, 0, 0}}, {{1, 1, 1}}, {{2, 2, 2}}});
    EXPECT_TRUE(throws_error(
        [&] {
            grid.clipped_grid({{0, 0, 0}, {0, 0, 0}}, {{1, 1, 1}});
        },
        "clipped_grid", {"ijk_min must hold 1 or batch_size (3) coordinates, got 2"}));
    EXPECT_TRUE(throws_error(
        [&] {
            grid.clipped_grid({{0, 0, 0}}, {});
        },
        "clipped_grid", {"ijk_max must hold 1 or batch_size (3) coordinates, got 0"}));
}

}  // namespace
}  // namespace sparsegrid_test
