// Sanity checks of the oracle itself against hand-computed answers, so that a wrong oracle cannot make
// a wrong library look right.
#include "oracle.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace sparsegrid_test {
namespace {

OracleBatch line_i(int64_t lo, int64_t hi) {
    OracleBatch batch(1);
    for (int64_t i = lo; i <= hi; ++i) batch[0].insert({i, 0, 0});
    return batch;
}

TEST(Oracle, FloorDivision) {
    EXPECT_EQ(floor_div(7, 2), 3);
    EXPECT_EQ(floor_div(-7, 2), -4);
    EXPECT_EQ(floor_div(-8, 2), -4);
    EXPECT_EQ(floor_div(-1, 5), -1);
    EXPECT_EQ(floor_div(0, 3), 0);
    EXPECT_EQ(floor_mod(-7, 3), 2);
    EXPECT_EQ(floor_mod(6, 3), 0);
}

TEST(Oracle, TapIndex) {
    const Vec3i k{3, 2, 5};
    // t = t0*K1*K2 + t1*K2 + t2
    EXPECT_EQ(tap_of_index(0, k), (std::array<int64_t, 3>{0, 0, 0}));
    EXPECT_EQ(tap_of_index(1, k), (std::array<int64_t, 3>{0, 0, 1}));
    EXPECT_EQ(tap_of_index(5, k), (std::array<int64_t, 3>{0, 1, 0}));
    EXPECT_EQ(tap_of_index(10, k), (std::array<int64_t, 3>{1, 0, 0}));
    EXPECT_EQ(tap_of_index(29, k), (std::array<int64_t, 3>{2, 1, 4}));
}

TEST(Oracle, MortonOrderByHand) {
    EXPECT_EQ(biased(0), 0x80000000u);
    EXPECT_EQ(biased(-1), 0x7FFFFFFFu);
    EXPECT_EQ(biased(kInt32Min), 0u);
    EXPECT_EQ(biased(kInt32Max), 0xFFFFFFFFu);
    // Bit 0 level: i's bit is the most significant of the three.
    EXPECT_TRUE(morton_less({0, 0, 0}, {0, 0, 1}));
    EXPECT_TRUE(morton_less({0, 0, 1}, {0, 1, 0}));
    EXPECT_TRUE(morton_less({0, 1, 0}, {1, 0, 0}));
    EXPECT_TRUE(morton_less({0, 1, 1}, {1, 0, 0}));
    // A higher level beats any lower level: (0,0,2) has bit 1 set in k, (1,1,1) only bit 0.
    EXPECT_TRUE(morton_less({1, 1, 1}, {0, 0, 2}));
    // Negative coordinates precede non-negative ones on every axis.
    EXPECT_TRUE(morton_less({-1, 0, 0}, {0, 0, 0}));
    EXPECT_TRUE(morton_less({0, 0, -1}, {0, 0, 0}));
    EXPECT_TRUE(morton_less({5, 5, -1}, {0, 0, 0}));
    EXPECT_TRUE(morton_less({kInt32Min, kInt32Max, kInt32Max}, {-1, 0, 0}));
    EXPECT_FALSE(morton_less({3, 4, 5}, {3, 4, 5}));
    // (0..1)^3 in Z order.
    const std::vector<Vec3i> cube = morton_sorted(
        OracleMember{{1, 1, 1}, {0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {1, 1, 0}, {1, 0, 1}, {0, 1, 1}});
    const std::vector<Vec3i> z{{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1}, {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}};
    EXPECT_EQ(cube, z);
}

TEST(Oracle, DesignCheckValues) {
    const Vec3i k4{4, 1, 1};
    const Vec3i s4{4, 1, 1};
    EXPECT_EQ(oracle_conv_grid(line_i(0, 15), k4, s4), line_i(0, 4));
    EXPECT_EQ(oracle_conv_transpose_grid(line_i(0, 0), k4, s4), line_i(-1, 2));
    EXPECT_EQ(oracle_conv_grid(line_i(-3, 3), {1, 1, 1}, {3, 1, 1}), line_i(-1, 1));

    const MemberLists fine{{{0, 0, 0},
                            {1, 0, 0},
                            {2, 0, 0},
                            {3, 0, 0},
                            {4, 0, 0},
                            {5, 0, 0},
                            {6, 0, 0},
                            {7, 0, 0},
                            {8, 0, 0},
                            {9, 0, 0},
                            {10, 0, 0},
                            {11, 0, 0},
                            {12, 0, 0},
                            {13, 0, 0},
                            {14, 0, 0},
                            {15, 0, 0}}};
    const MemberLists coarse{{{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {3, 0, 0}, {4, 0, 0}}};
    const std::vector<int32_t> map = oracle_neighbour_map(fine, coarse, k4, s4, sparsegrid::MapDirection::Forward);
    // Row c: fine = 4c + tap - 1.
    const std::vector<int32_t> want{-1, 0,  1,  2,   //
                                    3,  4,  5,  6,   //
                                    7,  8,  9,  10,  //
                                    11, 12, 13, 14,  //
                                    15, -1, -1, -1};
    EXPECT_EQ(map, want);
    const std::vector<int32_t> transposed = oracle_neighbour_map(coarse, fine, k4, s4,
                                                                 sparsegrid::MapDirection::Transposed);
    // Fine voxel f = 4c + tap - 1: f = 0 is c=0 tap 1; f = 15 is c=4 tap 0 (and c=3 tap 4 does not exist).
    EXPECT_EQ(transposed[0 * 4 + 1], 0);
    EXPECT_EQ(transposed[0 * 4 + 0], -1);
    EXPECT_EQ(transposed[15 * 4 + 0], 4);
    EXPECT_EQ(transposed[14 * 4 + 3], 3);
    int edges = 0;
    for (int32_t e : transposed) edges += e != -1;
    EXPECT_EQ(edges, 16);
}

TEST(Oracle, SmallOps) {
    OracleBatch one(1);
    one[0].insert({-3, 0, 5});
    EXPECT_EQ(oracle_coarsened_grid(one, {2, 3, 5})[0], (OracleMember{{-2, 0, 1}}));
    EXPECT_EQ(oracle_dilated_grid(one, 1)[0].size(), 27u);
    EXPECT_EQ(oracle_refined_grid({{{-3, 0, 5}}}, {2, 1, 3}, {})[0],
              (OracleMember{{-6, 0, 15}, {-6, 0, 16}, {-6, 0, 17}, {-5, 0, 15}, {-5, 0, 16}, {-5, 0, 17}}));
    EXPECT_TRUE(oracle_refined_grid({{{-3, 0, 5}}}, {2, 1, 3}, {0})[0].empty());
    // Even kernel extends toward +: K=2, pb=0, S=1: conv_grid of {0} is {-1, 0}; transpose is {0, 1}.
    OracleBatch origin(1);
    origin[0].insert({0, 0, 0});
    EXPECT_EQ(oracle_conv_grid(origin, {2, 1, 1}, {1, 1, 1})[0], (OracleMember{{-1, 0, 0}, {0, 0, 0}}));
    EXPECT_EQ(oracle_conv_transpose_grid(origin, {2, 1, 1}, {1, 1, 1})[0], (OracleMember{{0, 0, 0}, {1, 0, 0}}));
    // K=3, pb=1: symmetric.
    EXPECT_EQ(oracle_conv_grid(origin, {3, 1, 1}, {1, 1, 1})[0], (OracleMember{{-1, 0, 0}, {0, 0, 0}, {1, 0, 0}}));
    OracleBatch big(1);
    big[0].insert({int64_t{kInt32Max} + 1, 0, 0});
    EXPECT_FALSE(fits_int32(big));
    EXPECT_TRUE(fits_int32(one));
}

}  // namespace
}  // namespace sparsegrid_test
