// Every invalid argument and every overflow raises sparsegrid::Error naming the operation and the
// argument ("<operation>: <argument> must be <expectation>, got <value>"); nothing wraps silently.
// Every test runs on each backend present (test_util.h); inputs read through pointers are on its device.
#include "oracle.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace sparsegrid_test {
namespace {

using sparsegrid::neighbour_map;
using sparsegrid::Span;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

#define OVERFLOW_WORDS \
    { "int32", "overflow", "range", "fit" }

class ErrorsTest : public BackendTest {
protected:
    /// `batch` members of the same three voxels.
    GridBatch small_grid(int64_t batch = 2) const {
        MemberLists members(static_cast<std::size_t>(batch));
        for (int64_t m = 0; m < batch; ++m) members[static_cast<std::size_t>(m)] = {{0, 0, 0}, {1, 2, 3}, {-4, 5, -6}};
        return make_grid(members);
    }
    GridBatch single(const Vec3i& voxel) const { return make_grid(MemberLists{{voxel}}); }
};
INSTANTIATE_TEST_SUITE_P(, ErrorsTest, ::testing::ValuesIn(available_backends()), backend_name);

TEST_P(ErrorsTest, KernelSizeAndStrideMustBePositive) {
    const GridBatch grid = small_grid();
    EXPECT_THROW(grid.conv_grid(0, 1), sparsegrid::Error);
    EXPECT_TRUE(throws_error([&] { grid.conv_grid(0, 1); }, "conv_grid", {"kernel_size"}));
    EXPECT_TRUE(throws_error([&] { grid.conv_grid(-3, 1); }, "conv_grid", {"kernel_size"}));
    EXPECT_TRUE(throws_error([&] { grid.conv_grid({3, 0, 3}, {1, 1, 1}); }, "conv_grid", {"kernel_size"}));
    EXPECT_THROW(grid.conv_grid(3, 0), sparsegrid::Error);
    EXPECT_TRUE(throws_error([&] { grid.conv_grid(3, 0); }, "conv_grid", {"stride"}));
    EXPECT_TRUE(throws_error([&] { grid.conv_grid({3, 3, 3}, {1, 1, -2}); }, "conv_grid", {"stride"}));
    EXPECT_TRUE(throws_error([&] { grid.conv_transpose_grid(0, 2); }, "conv_transpose_grid", {"kernel_size"}));
    EXPECT_TRUE(throws_error(
        [&] {
            grid.conv_transpose_grid({-1, 2, 2}, {2, 2, 2});
        },
        "conv_transpose_grid", {"kernel_size"}));
    EXPECT_TRUE(throws_error([&] { grid.conv_transpose_grid(2, 0); }, "conv_transpose_grid", {"stride"}));
    EXPECT_TRUE(throws_error(
        [&] {
            grid.conv_transpose_grid({2, 2, 2}, {2, -1, 2});
        },
        "conv_transpose_grid", {"stride"}));
    EXPECT_TRUE(throws_error(
        [&] {
            neighbour_map(grid, grid, {0, 3, 3}, {1, 1, 1});
        },
        "neighbour_map", {"kernel_size"}));
    EXPECT_TRUE(throws_error([&] { neighbour_map(grid, grid, {3, 3, 3}, {1, 0, 1}); }, "neighbour_map", {"stride"}));
    EXPECT_TRUE(throws_error(
        [&] {
            neighbour_map(grid, grid, {3, 3, 3}, {1, 1, 0}, MapDirection::Transposed);
        },
        "neighbour_map", {"stride"}));
}

TEST_P(ErrorsTest, FactorsAndDistanceMustBeValid) {
    const GridBatch grid = small_grid();
    EXPECT_THROW(grid.coarsened_grid(0), sparsegrid::Error);
    EXPECT_TRUE(throws_error([&] { grid.coarsened_grid(0); }, "coarsened_grid", {"factor"}));
    EXPECT_TRUE(throws_error([&] { grid.coarsened_grid({2, -2, 2}); }, "coarsened_grid", {"factor"}));
    EXPECT_TRUE(throws_error([&] { grid.refined_grid(0); }, "refined_grid", {"factor"}));
    EXPECT_TRUE(throws_error([&] { grid.refined_grid({1, 1, -1}); }, "refined_grid", {"factor"}));
    EXPECT_THROW(grid.dilated_grid(-1), sparsegrid::Error);
    EXPECT_TRUE(throws_error([&] { grid.dilated_grid(-1); }, "dilated_grid", {"distance"}));
    EXPECT_NO_THROW(grid.dilated_grid(0));
}

TEST_P(ErrorsTest, MaskLengthMustMatch) {
    const GridBatch grid = small_grid();  // 6 voxels
    const DeviceArray<uint8_t> short_mask = on_device(std::vector<uint8_t>(5, 1));
    const DeviceArray<uint8_t> long_mask = on_device(std::vector<uint8_t>(7, 1));
    const DeviceArray<uint8_t> no_mask = on_device(std::vector<uint8_t>{});
    EXPECT_THROW(grid.pruned_grid(short_mask), sparsegrid::Error);
    EXPECT_TRUE(throws_error([&] { grid.pruned_grid(short_mask); }, "pruned_grid", {"mask"}));
    EXPECT_TRUE(throws_error([&] { grid.pruned_grid(long_mask); }, "pruned_grid", {"mask"}));
    EXPECT_TRUE(throws_error([&] { grid.pruned_grid(no_mask); }, "pruned_grid", {"mask"}));
    EXPECT_TRUE(throws_error([&] { grid.pruned_grid_with_index(short_mask); }, "pruned_grid_with_index", {"mask"}));
    EXPECT_TRUE(throws_error([&] { grid.refined_grid(2, short_mask); }, "refined_grid", {"mask"}));
    EXPECT_TRUE(throws_error([&] { grid.refined_grid({2, 1, 2}, long_mask); }, "refined_grid", {"mask"}));
}

TEST_P(ErrorsTest, MergedGridNeedsSameBatchAndTransforms) {
    const GridBatch two = small_grid(2);
    const GridBatch three = small_grid(3);
    EXPECT_THROW(two.merged_grid(three), sparsegrid::Error);
    EXPECT_TRUE(throws_error([&] { two.merged_grid(three); }, "merged_grid", {"batch"}));
    EXPECT_TRUE(throws_error([&] { three.merged_grid(two); }, "merged_grid", {"batch"}));
    MemberTransform shifted;
    shifted.origin = {0.0, 0.0, 1e-9};
    const GridBatch moved = make_grid(MemberLists{{{0, 0, 0}}, {}}, {MemberTransform{}, shifted});
    EXPECT_TRUE(throws_error([&] { two.merged_grid(moved); }, "merged_grid", {"transform"}));
    MemberTransform scaled;
    scaled.voxel_size = {1.0, 2.0, 1.0};
    const GridBatch bigger = make_grid(MemberLists{{}, {}}, {scaled, MemberTransform{}});
    EXPECT_TRUE(throws_error([&] { bigger.merged_grid(two); }, "merged_grid", {"transform"}));
    // A different-transform result of an op, e.g. merging a grid with its own coarsened version.
    EXPECT_TRUE(throws_error([&] { two.merged_grid(two.coarsened_grid(2)); }, "merged_grid", {"transform"}));
}

TEST_P(ErrorsTest, NeighbourMapNeedsSameBatchSize) {
    const GridBatch two = small_grid(2);
    const GridBatch three = small_grid(3);
    EXPECT_THROW(neighbour_map(two, three, {3, 3, 3}, {1, 1, 1}), sparsegrid::Error);
    EXPECT_TRUE(throws_error([&] { neighbour_map(two, three, {3, 3, 3}, {1, 1, 1}); }, "neighbour_map", {"batch"}));
    EXPECT_TRUE(throws_error(
        [&] {
            neighbour_map(three, two, {2, 2, 2}, {2, 2, 2}, MapDirection::Transposed);
        },
        "neighbour_map", {"batch"}));
}

TEST_P(ErrorsTest, FromIjkOffsets) {
    const DeviceArray<int32_t> ijk = on_device(std::vector<int32_t>{0, 0, 0, 1, 1, 1, 2, 2, 2});  // 3 triples
    const Span<const int32_t> span = ijk.span();
    const sparsegrid::Context& c = ctx();
    EXPECT_NO_THROW(GridBatch::from_ijk(span, {0, 1, 3}, {}, c));
    EXPECT_THROW(GridBatch::from_ijk(span, {1, 3}, {}, c), sparsegrid::Error);
    EXPECT_TRUE(throws_error([&] { GridBatch::from_ijk(span, {1, 3}, {}, c); }, "from_ijk", {"offset"}));
    EXPECT_TRUE(throws_error([&] { GridBatch::from_ijk(span, {-1, 3}, {}, c); }, "from_ijk", {"offset"}));
    EXPECT_TRUE(throws_error([&] { GridBatch::from_ijk(span, {0, 2, 1, 3}, {}, c); }, "from_ijk", {"offset"}));
    EXPECT_TRUE(throws_error([&] { GridBatch::from_ijk(span, {0, 2}, {}, c); }, "from_ijk", {"offset", "ijk"}));
    EXPECT_TRUE(throws_error([&] { GridBatch::from_ijk(span, {0, 4}, {}, c); }, "from_ijk", {"offset", "ijk"}));
    EXPECT_TRUE(throws_error([&] { GridBatch::from_ijk(span, {0}, {}, c); }, "from_ijk", {"offset", "batch"}));
    EXPECT_TRUE(throws_error([&] { GridBatch::from_ijk(span, {}, {}, c); }, "from_ijk", {"offset", "batch"}));
    const DeviceArray<int32_t> ragged = on_device(std::vector<int32_t>{0, 0, 0, 1, 1, 1, 2});  // 7 ints
    EXPECT_TRUE(throws_error(
        [&] {
            GridBatch::from_ijk(ragged, {0, 2}, {}, c);
        },
        "from_ijk", {"ijk", "multiple", "3"}));
}

TEST_P(ErrorsTest, TransformsCountAndVoxelSizes) {
    const MemberLists members{{{0, 0, 0}}, {{1, 1, 1}}};
    const sparsegrid::Context& c = ctx();
    EXPECT_THROW(GridBatch::from_ijk(members, std::vector<MemberTransform>(1), c), sparsegrid::Error);
    EXPECT_TRUE(throws_error([&] { GridBatch::from_ijk(members, std::vector<MemberTransform>(1), c); }, "from_ijk",
                             {"transform"}));
    EXPECT_TRUE(throws_error([&] { GridBatch::from_ijk(members, std::vector<MemberTransform>(3), c); }, "from_ijk",
                             {"transform"}));
    const DeviceArray<int32_t> ijk = on_device(std::vector<int32_t>{0, 0, 0, 1, 1, 1});
    EXPECT_TRUE(throws_error(
        [&] {
            GridBatch::from_ijk(ijk, {0, 1, 2}, std::vector<MemberTransform>(3), c);
        },
        "from_ijk", {"transform"}));
    const std::vector<std::vector<Vec3d>> points{{{0.0, 0.0, 0.0}}, {}};
    EXPECT_TRUE(throws_error([&] { GridBatch::from_points(points, {}, c); }, "from_points", {"transform"}));
    EXPECT_TRUE(throws_error([&] { GridBatch::from_points(points, std::vector<MemberTransform>(1), c); }, "from_points",
                             {"transform"}));

    for (double bad : {0.0, -1.0, -0.0, kInf, -kInf, kNaN}) {
        for (int axis = 0; axis < 3; ++axis) {
            SCOPED_TRACE("voxel size " + std::to_string(bad) + " on axis " + std::to_string(axis));
            MemberTransform t;
            t.voxel_size[axis] = bad;
            const std::vector<MemberTransform> transforms{MemberTransform{}, t};
            EXPECT_THROW(GridBatch::from_ijk(members, transforms, c), sparsegrid::Error);
            EXPECT_TRUE(throws_error([&] { GridBatch::from_ijk(members, transforms, c); }, "from_ijk",
                                     {"voxel_size", "voxel size"}));
            EXPECT_TRUE(throws_error([&] { GridBatch::from_points(points, transforms, c); }, "from_points",
                                     {"voxel_size", "voxel size"}));
        }
    }
}

TEST_P(ErrorsTest, FromPointsNonFiniteAndOutOfRange) {
    const std::vector<MemberTransform> unit(1);
    const sparsegrid::Context& c = ctx();
    auto one_point = [](const Vec3d& p) { return std::vector<std::vector<Vec3d>>{{{0.0, 0.0, 0.0}, p}}; };
    for (const Vec3d& bad : {Vec3d{kNaN, 0.0, 0.0}, Vec3d{0.0, kInf, 0.0}, Vec3d{0.0, 0.0, -kInf}}) {
        SCOPED_TRACE("point " + str(bad));
        EXPECT_THROW(GridBatch::from_points(one_point(bad), unit, c), sparsegrid::Error);
        EXPECT_TRUE(throws_error([&] { GridBatch::from_points(one_point(bad), unit, c); }, "from_points",
                                 {"xyz", "point", "finite"}));
    }
    for (const Vec3d& far : {Vec3d{1e10, 0.0, 0.0}, Vec3d{0.0, -1e10, 0.0}, Vec3d{0.0, 0.0, 2147483647.5},
                             Vec3d{-2147483649.0, 0.0, 0.0}, Vec3d{1e300, 0.0, 0.0}}) {
        SCOPED_TRACE("point " + str(far));
        EXPECT_THROW(GridBatch::from_points(one_point(far), unit, c), sparsegrid::Error);
        EXPECT_TRUE(throws_error([&] { GridBatch::from_points(one_point(far), unit, c); }, "from_points",
                                 {"xyz", "point", "int32", "range"}));
    }
    // In range in world units, out of range once divided by a tiny voxel size.
    MemberTransform tiny;
    tiny.voxel_size = {1e-9, 1.0, 1.0};
    EXPECT_TRUE(throws_error(
        [&] {
            GridBatch::from_points(one_point({10.0, 0.0, 0.0}), {tiny}, c);
        },
        "from_points", {"xyz", "point", "int32", "range"}));
    // Span version, NaN in the second member.
    const DeviceArray<double> flat = on_device(std::vector<double>{0.0, 0.0, 0.0, 1.0, kNaN, 1.0});
    EXPECT_TRUE(throws_error(
        [&] {
            GridBatch::from_points(flat, {0, 1, 2}, std::vector<MemberTransform>(2), c);
        },
        "from_points", {"xyz", "point", "finite"}));
    const DeviceArray<double> ragged = on_device(std::vector<double>{0.0, 0.0, 0.0, 1.0});
    EXPECT_TRUE(throws_error(
        [&] {
            GridBatch::from_points(ragged, {0, 1}, unit, c);
        },
        "from_points", {"xyz", "multiple", "3", "offset"}));
}

TEST_P(ErrorsTest, IjkToIndexOffsets) {
    const GridBatch grid = small_grid(2);
    const DeviceArray<int32_t> queries = on_device(std::vector<int32_t>{0, 0, 0, 1, 2, 3});
    EXPECT_TRUE(throws_error([&] { grid.ijk_to_index(queries, {0, 2}); }, "ijk_to_index", {"offset", "batch"}));
    EXPECT_TRUE(throws_error([&] { grid.ijk_to_index(queries, {0, 1, 3}); }, "ijk_to_index", {"offset", "query"}));
    EXPECT_TRUE(throws_error(
        [&] {
            grid.ijk_to_index(MemberLists{{{0, 0, 0}}});
        },
        "ijk_to_index", {"offset", "batch", "queries", "member"}));
}

// ---- overflow: never wrap -------------------------------------------------------------------------

TEST_P(ErrorsTest, ConvTransposeOverflow) {
    for (const Vec3i& voxel :
         {Vec3i{kTwoPow30, 0, 0}, Vec3i{kInt32Max, 0, 0}, Vec3i{0, kTwoPow30, 0}, Vec3i{0, 0, kInt32Max}}) {
        SCOPED_TRACE("voxel " + str(voxel));
        const GridBatch grid = single(voxel);
        EXPECT_THROW(grid.conv_transpose_grid(2, 2), sparsegrid::Error);
        EXPECT_TRUE(throws_error([&] { grid.conv_transpose_grid(2, 2); }, "conv_transpose_grid", OVERFLOW_WORDS));
    }
    // Downward: 2 * (-2^30 - 1) < INT32_MIN; K=3 reaches one below S*c.
    EXPECT_TRUE(throws_error(
        [&] {
            single({-kTwoPow30 - 1, 0, 0}).conv_transpose_grid(2, 2);
        },
        "conv_transpose_grid", OVERFLOW_WORDS));
    EXPECT_TRUE(throws_error(
        [&] {
            single({0, kInt32Min, 0}).conv_transpose_grid(3, 1);
        },
        "conv_transpose_grid", OVERFLOW_WORDS));
    EXPECT_TRUE(throws_error(
        [&] {
            single({0, 0, kInt32Max}).conv_transpose_grid(3, 1);
        },
        "conv_transpose_grid", OVERFLOW_WORDS));
    EXPECT_TRUE(throws_error(
        [&] {
            single({-kTwoPow30, 0, 0}).conv_transpose_grid({1, 1, 1}, {3, 1, 1});
        },
        "conv_transpose_grid", OVERFLOW_WORDS));
    // Overflow in one member of several still raises.
    const GridBatch mixed = make_grid(MemberLists{{{0, 0, 0}}, {}, {{1, 1, kTwoPow30}}});
    EXPECT_TRUE(throws_error([&] { mixed.conv_transpose_grid(2, 2); }, "conv_transpose_grid", OVERFLOW_WORDS));
}

TEST_P(ErrorsTest, RefineOverflow) {
    EXPECT_THROW(single({kInt32Max, 0, 0}).refined_grid(2), sparsegrid::Error);
    EXPECT_TRUE(throws_error([&] { single({kInt32Max, 0, 0}).refined_grid(2); }, "refined_grid", OVERFLOW_WORDS));
    EXPECT_TRUE(throws_error([&] { single({0, kTwoPow30, 0}).refined_grid(2); }, "refined_grid", OVERFLOW_WORDS));
    EXPECT_TRUE(throws_error([&] { single({0, 0, kInt32Min}).refined_grid(2); }, "refined_grid", OVERFLOW_WORDS));
    EXPECT_TRUE(throws_error(
        [&] {
            single({0, 0, -kTwoPow30 - 1}).refined_grid({1, 1, 2});
        },
        "refined_grid", OVERFLOW_WORDS));
    // A masked-out voxel cannot overflow: only kept voxels are refined.
    const GridBatch two = make_grid(MemberLists{{{0, 0, 0}, {kInt32Max, 0, 0}}});
    const DeviceArray<uint8_t> keep_origin = on_device(std::vector<uint8_t>{1, 0});
    GridBatch refined;
    ASSERT_NO_THROW(refined = two.refined_grid(2, keep_origin));
    EXPECT_EQ(refined.num_voxels(), 8);
    const DeviceArray<uint8_t> keep_both = on_device(std::vector<uint8_t>{1, 1});
    EXPECT_TRUE(throws_error([&] { two.refined_grid(2, keep_both); }, "refined_grid", OVERFLOW_WORDS));
}

TEST_P(ErrorsTest, OutputsPastTheGridSizeLimitRaiseBeforeAllocating) {
    // 1291^3 = 2,151,685,171 voxels from one: more than 2^31 - 1, refused before anything is allocated
    // (building it would need tens of GB); 1290^3 = 2,146,689,000 would fit the limit.
    const GridBatch one = single({0, 0, 0});
    EXPECT_TRUE(throws_error([&] { one.refined_grid(1291); }, "refined_grid", {"2147483647", "2151685171"}));
    EXPECT_TRUE(throws_error([&] { one.refined_grid({2048, 1024, 1025}); }, "refined_grid", {"2^31 - 1"}));
    // Per-axis factors whose product overflows int64 raise as well.
    EXPECT_THROW(one.refined_grid({2000000000, 2000000000, 2000000000}), sparsegrid::Error);
}

TEST_P(ErrorsTest, DilateOverflow) {
    for (const Vec3i& voxel :
         {Vec3i{kInt32Max, 0, 0}, Vec3i{kInt32Min, 0, 0}, Vec3i{0, kInt32Max, 0}, Vec3i{0, 0, kInt32Min}}) {
        SCOPED_TRACE("voxel " + str(voxel));
        EXPECT_THROW(single(voxel).dilated_grid(1), sparsegrid::Error);
        EXPECT_TRUE(throws_error([&] { single(voxel).dilated_grid(1); }, "dilated_grid", OVERFLOW_WORDS));
        EXPECT_NO_THROW(single(voxel).dilated_grid(0));
    }
    EXPECT_TRUE(throws_error([&] { single({kInt32Max - 2, 0, 0}).dilated_grid(3); }, "dilated_grid", OVERFLOW_WORDS));
    EXPECT_TRUE(throws_error(
        [&] {
            single({0, 0, 0}).dilated_grid(kInt32Max);
        },
        "dilated_grid", {"int32", "overflow", "range", "fit", "distance", "large"}));
}

TEST_P(ErrorsTest, ConvGridOverflow) {
    // conv_grid with K=3, S=1 reaches one step past each edge.
    EXPECT_TRUE(throws_error([&] { single({kInt32Max, 0, 0}).conv_grid(3, 1); }, "conv_grid", OVERFLOW_WORDS));
    EXPECT_TRUE(throws_error([&] { single({0, kInt32Min, 0}).conv_grid(3, 1); }, "conv_grid", OVERFLOW_WORDS));
    // K=2 (pb=0), S=1 reaches one step below only.
    EXPECT_TRUE(throws_error([&] { single({0, 0, kInt32Min}).conv_grid(2, 1); }, "conv_grid", OVERFLOW_WORDS));
    EXPECT_NO_THROW(single({0, 0, kInt32Max}).conv_grid(2, 1));
}

TEST_P(ErrorsTest, ExtremeCoordinatesAccepted) {
    // The edges of the int32 range are valid coordinates and survive every op that keeps them in range.
    const MemberLists members{{{kInt32Min, kInt32Max, kInt32Min}, {kInt32Max, kInt32Min, kInt32Max}}};
    GridBatch grid;
    ASSERT_NO_THROW(grid = make_grid(members));
    const std::vector<int32_t> raw = grid.ijk().to_host();
    EXPECT_EQ(raw, (std::vector<int32_t>{kInt32Min, kInt32Max, kInt32Min, kInt32Max, kInt32Min, kInt32Max}));
    GridBatch coarse;
    ASSERT_NO_THROW(coarse = grid.coarsened_grid(2));
    EXPECT_EQ(
        coarse.ijk_host(),
        (std::vector<Vec3i>{{-kTwoPow30, kTwoPow30 - 1, -kTwoPow30}, {kTwoPow30 - 1, -kTwoPow30, kTwoPow30 - 1}}));
    GridBatch same;
    ASSERT_NO_THROW(same = grid.conv_grid(1, 1));
    EXPECT_EQ(same.ijk_host(), grid.ijk_host());
}

}  // namespace
}  // namespace sparsegrid_test

#undef OVERFLOW_WORDS
