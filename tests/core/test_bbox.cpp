// GridBatch::bbox: per-member inclusive bounds against a brute-force scan of each member's voxels, with
// empty members, negative and far coordinates and the int32 limits, on each backend present.
#include "test_util.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace sparsegrid_test {
namespace {

using sparsegrid::CoordBox;

class BboxTest : public BackendTest {};
INSTANTIATE_TEST_SUITE_P(, BboxTest, ::testing::ValuesIn(available_backends()), backend_name);

/// The smallest box of each member's voxels; the empty box (0, -1) for an empty member.
std::vector<CoordBox> brute_force_boxes(const MemberLists& members) {
    std::vector<CoordBox> boxes(members.size());
    for (std::size_t m = 0; m < members.size(); ++m) {
        if (members[m].empty()) continue;
        boxes[m].lo = boxes[m].hi = members[m][0];
        for (const Vec3i& v : members[m])
            for (int a = 0; a < 3; ++a) {
                boxes[m].lo[a] = std::min(boxes[m].lo[a], v[a]);
                boxes[m].hi[a] = std::max(boxes[m].hi[a], v[a]);
            }
    }
    return boxes;
}

std::string describe(const std::vector<CoordBox>& boxes) {
    std::string out;
    for (const CoordBox& b : boxes) out += "[" + str(b.lo) + " .. " + str(b.hi) + "] ";
    return out;
}

TEST_P(BboxTest, MatchesBruteForceOnRandomBatches) {
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const uint64_t seed = test_seeds()[i] + (far ? 1000 : 0);
            SCOPED_TRACE("seed=" + std::to_string(seed));
            Rng rng(seed);
            RandomBatchOptions options;
            options.batch_size = 1 + static_cast<int64_t>(i % 8);
            options.allow_far = far;
            options.empty_probability = 0.3;
            const MemberLists members = random_members(rng, options);
            const GridBatch grid = make_grid(members);
            const std::vector<CoordBox> expected = brute_force_boxes(members);
            const std::vector<CoordBox> actual = grid.bbox_host();
            EXPECT_EQ(actual, expected) << describe(actual) << "vs " << describe(expected);
            // The device buffer: B x 6 on the grid's device, the same values.
            const sparsegrid::Buffer<int32_t> buffer = grid.bbox();
            EXPECT_EQ(buffer.device(), device());
            ASSERT_EQ(buffer.size(), 6 * grid.batch_size());
            // Every member box lies inside the batch box, and empty members are marked hi < lo.
            for (std::size_t m = 0; m < actual.size(); ++m) {
                EXPECT_EQ(actual[m].empty(), members[m].empty()) << "member " << m;
                if (actual[m].empty()) continue;
                for (int a = 0; a < 3; ++a) {
                    EXPECT_GE(actual[m].lo[a], grid.coordinate_box().lo[a]);
                    EXPECT_LE(actual[m].hi[a], grid.coordinate_box().hi[a]);
                }
            }
        }
}

TEST_P(BboxTest, HandWrittenBoxesAndInt32Limits) {
    const GridBatch grid = make_grid({{{-3, 5, 0}, {2, -7, 1}, {0, 0, -9}},
                                      {},
                                      {{kInt32Min, kInt32Max, 0}, {kInt32Max, kInt32Min, -1}},
                                      {{4, 4, 4}}});
    const std::vector<CoordBox> boxes = grid.bbox_host();
    ASSERT_EQ(boxes.size(), 4u);
    EXPECT_EQ(boxes[0].lo, (Vec3i{-3, -7, -9}));
    EXPECT_EQ(boxes[0].hi, (Vec3i{2, 5, 1}));
    EXPECT_TRUE(boxes[1].empty());
    EXPECT_EQ(boxes[1].lo, (Vec3i{0, 0, 0}));
    EXPECT_EQ(boxes[1].hi, (Vec3i{-1, -1, -1}));
    EXPECT_EQ(boxes[2].lo, (Vec3i{kInt32Min, kInt32Min, -1}));
    EXPECT_EQ(boxes[2].hi, (Vec3i{kInt32Max, kInt32Max, 0}));
    EXPECT_EQ(boxes[3].lo, (Vec3i{4, 4, 4}));
    EXPECT_EQ(boxes[3].hi, (Vec3i{4, 4, 4}));
}

TEST_P(BboxTest, BatchWithoutVoxels) {
    const GridBatch grid = make_grid({{}, {}, {}});
    const std::vector<CoordBox> boxes = grid.bbox_host();
    ASSERT_EQ(boxes.size(), 3u);
    for (const CoordBox& box : boxes) EXPECT_EQ(box, CoordBox{});
}

}  // namespace
}  // namespace sparsegrid_test
