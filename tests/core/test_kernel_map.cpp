// Kernel maps against the oracle's literal enumeration of the edge relation, their per-tap pair lists,
// and transposition. Every test runs on each backend present (test_util.h).
#include "core/storage.h"
#include "oracle.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace sparsegrid_test {
namespace {

using sparsegrid::neighbour_map;

class KernelMapTest : public BackendTest {};
INSTANTIATE_TEST_SUITE_P(, KernelMapTest, ::testing::ValuesIn(available_backends()), backend_name);

struct MapCase {
    uint64_t seed = 0;
    GridBatch grid;
};

/// Case `index` of the seed list on ctx's device.
MapCase make_map_case(std::size_t index, bool far, const sparsegrid::Context& ctx) {
    MapCase c;
    c.seed = test_seeds()[index] + (far ? 5000 : 3000);
    Rng rng(c.seed);
    RandomBatchOptions options;
    options.batch_size = 1 + static_cast<int64_t>((index + 3) % 8);
    options.allow_far = far;
    const MemberLists members = random_members(rng, options);
    c.grid = GridBatch::from_ijk(members, random_transforms(rng, options.batch_size), ctx);
    return c;
}

std::vector<std::pair<Vec3i, Vec3i>> map_kernel_cases(uint64_t seed) {
    std::vector<std::pair<Vec3i, Vec3i>> out{
        {{1, 1, 1}, {1, 1, 1}}, {{3, 3, 3}, {1, 1, 1}}, {{2, 2, 2}, {2, 2, 2}}, {{3, 3, 3}, {2, 2, 2}},
        {{3, 2, 5}, {1, 2, 3}}, {{4, 4, 4}, {4, 4, 4}}, {{6, 1, 2}, {5, 3, 1}},
    };
    Rng rng(seed * 104729 + 3);
    for (int n = 0; n < 3; ++n) out.push_back({random_kernel_size(rng), random_stride(rng)});
    return out;
}

MapDirection opposite(MapDirection d) {
    return d == MapDirection::Forward ? MapDirection::Transposed : MapDirection::Forward;
}

/// Every check a map gets: oracle entries, pair lists, transposed() against a fresh opposite-direction
/// build, and transposed twice against itself.
void check_map(const GridBatch& source, const GridBatch& target, const Vec3i& k, const Vec3i& s, MapDirection d) {
    const KernelMap map = neighbour_map(source, target, k, s, d);
    EXPECT_TRUE(map_matches_oracle(map, source, target, k, s, d));
    EXPECT_TRUE(pairs_match_map(map));
    const KernelMap transposed = map.transposed();
    EXPECT_TRUE(maps_equal(transposed, neighbour_map(target, source, k, s, opposite(d))));
    EXPECT_TRUE(map_matches_oracle(transposed, target, source, k, s, opposite(d)));
    EXPECT_TRUE(pairs_match_map(transposed));
    EXPECT_TRUE(maps_equal(transposed.transposed(), map));
    EXPECT_EQ(transposed.num_edges(), map.num_edges());
}

TEST_P(KernelMapTest, ForwardToConvGridMatchesOracle) {
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const MapCase c = make_map_case(i, far, ctx());
            SCOPED_TRACE("seed=" + std::to_string(c.seed) + " batch_size=" + std::to_string(c.grid.batch_size()));
            for (const auto& [k, s] : map_kernel_cases(c.seed)) {
                SCOPED_TRACE("K=" + str(k) + " S=" + str(s));
                const GridBatch coarse = c.grid.conv_grid(k, s);
                check_map(c.grid, coarse, k, s, MapDirection::Forward);
                // Every coarse voxel of the complete conv output has at least one input.
                const std::vector<int32_t> dense = map_host(neighbour_map(c.grid, coarse, k, s));
                const int64_t kvol = kernel_volume(k);
                for (int64_t row = 0; row < coarse.num_voxels(); ++row) {
                    bool any = false;
                    for (int64_t t = 0; t < kvol; ++t)
                        any = any || dense[static_cast<std::size_t>(row * kvol + t)] != -1;
                    ASSERT_TRUE(any) << "coarse voxel " << row << " has no input";
                }
            }
        }
}

TEST_P(KernelMapTest, TransposedToConvTransposeGridMatchesOracle) {
    for (std::size_t i = 0; i < test_seeds().size(); ++i) {
        const MapCase c = make_map_case(i, false, ctx());
        SCOPED_TRACE("seed=" + std::to_string(c.seed) + " batch_size=" + std::to_string(c.grid.batch_size()));
        for (const auto& [k, s] : map_kernel_cases(c.seed)) {
            SCOPED_TRACE("K=" + str(k) + " S=" + str(s));
            const GridBatch fine = c.grid.conv_transpose_grid(k, s);
            check_map(c.grid, fine, k, s, MapDirection::Transposed);
            // Every generated voxel has at least one input (unlike a wrong offset sign would give).
            const std::vector<int32_t> dense = map_host(neighbour_map(c.grid, fine, k, s, MapDirection::Transposed));
            const int64_t kvol = kernel_volume(k);
            for (int64_t row = 0; row < fine.num_voxels(); ++row) {
                bool any = false;
                for (int64_t t = 0; t < kvol; ++t) any = any || dense[static_cast<std::size_t>(row * kvol + t)] != -1;
                ASSERT_TRUE(any) << "generated voxel " << row << " has no input";
            }
        }
    }
}

TEST_P(KernelMapTest, MapsBetweenUnrelatedGrids) {
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const MapCase c = make_map_case(i, far, ctx());
            const MapCase other = [&] {
                MapCase o;
                o.seed = c.seed + 77;
                Rng rng(o.seed);
                RandomBatchOptions options;
                options.batch_size = c.grid.batch_size();
                options.allow_far = far;
                o.grid = make_grid(random_members(rng, options));
                return o;
            }();
            SCOPED_TRACE("seed=" + std::to_string(c.seed) + " other seed=" + std::to_string(other.seed));
            Rng rng(c.seed + 99);
            for (int n = 0; n < 3; ++n) {
                const Vec3i k = random_kernel_size(rng);
                const Vec3i s = random_stride(rng);
                SCOPED_TRACE("K=" + str(k) + " S=" + str(s));
                // Same grid, stride 1 (submanifold) in both directions.
                check_map(c.grid, c.grid, k, {1, 1, 1}, MapDirection::Forward);
                check_map(c.grid, c.grid, k, {1, 1, 1}, MapDirection::Transposed);
                // Same grid with a stride: still looked up, not assumed.
                check_map(c.grid, c.grid, k, s, MapDirection::Forward);
                check_map(c.grid, c.grid, k, s, MapDirection::Transposed);
                // Unrelated grids.
                check_map(c.grid, other.grid, k, s, MapDirection::Forward);
                check_map(other.grid, c.grid, k, s, MapDirection::Transposed);
                check_map(c.grid.dilated_grid(1), c.grid.coarsened_grid(s), k, s, MapDirection::Forward);
            }
        }
}

TEST_P(KernelMapTest, AGridBuildsItsLookupOnce) {
    // The lookup of a map's source grid is built with its first map and kept with the grid: later maps
    // from it (other kernels, strides, targets, directions) reuse it, and give the oracle's answers.
    const MapCase c = make_map_case(1, false, ctx());
    const GridBatch coarse = c.grid.coarsened_grid(2);
    const GridBatch other = coarse.conv_grid(3, 1);  // built before counting: its own lookups do not count
    const int64_t before = sparsegrid::detail::lookup_builds();
    check_map(c.grid, c.grid, {3, 3, 3}, {1, 1, 1}, MapDirection::Forward);
    EXPECT_EQ(sparsegrid::detail::lookup_builds(), before + 1);
    check_map(c.grid, c.grid, {5, 1, 3}, {1, 1, 1}, MapDirection::Transposed);
    EXPECT_EQ(sparsegrid::detail::lookup_builds(), before + 1);
    // check_map also builds the opposite maps, from the targets: one lookup for each of them.
    check_map(c.grid, coarse, {2, 2, 2}, {2, 2, 2}, MapDirection::Forward);
    check_map(c.grid, other, {3, 3, 3}, {2, 2, 2}, MapDirection::Forward);
    EXPECT_EQ(sparsegrid::detail::lookup_builds(), before + 3);
    check_map(coarse, c.grid, {2, 2, 2}, {2, 2, 2}, MapDirection::Transposed);
    check_map(other, c.grid, {3, 3, 3}, {1, 2, 1}, MapDirection::Transposed);
    EXPECT_EQ(sparsegrid::detail::lookup_builds(), before + 3) << "one lookup per grid, whatever its maps";
}

TEST_P(KernelMapTest, SubmanifoldOddKernelIsSymmetric) {
    // Same grid, stride 1, odd K: tap t from a to b  <=>  tap Kvol-1-t from b to a.
    const MapCase c = make_map_case(4, false, ctx());
    SCOPED_TRACE("seed=" + std::to_string(c.seed));
    for (const Vec3i& k : {Vec3i{3, 3, 3}, Vec3i{5, 1, 3}}) {
        const KernelMap map = neighbour_map(c.grid, c.grid, k, {1, 1, 1});
        const std::vector<int32_t> dense = map_host(map);
        const int64_t kvol = kernel_volume(k);
        for (int64_t row = 0; row < map.num_target(); ++row)
            for (int64_t t = 0; t < kvol; ++t) {
                const int32_t src = dense[static_cast<std::size_t>(row * kvol + t)];
                if (src == -1) continue;
                ASSERT_EQ(dense[static_cast<std::size_t>(src * kvol + (kvol - 1 - t))], row);
            }
        // Centre tap is the identity.
        for (int64_t row = 0; row < map.num_target(); ++row)
            ASSERT_EQ(dense[static_cast<std::size_t>(row * kvol + (kvol - 1) / 2)], row);
    }
}

TEST_P(KernelMapTest, DesignDegrees) {
    // K=S=4 on the line i=0..15 (K=S=1 on j, k): coarse voxels 0..4 with degrees {3, 4, 4, 4, 1}.
    std::vector<Vec3i> line;
    for (int32_t i = 0; i < 16; ++i) line.push_back({i, 0, 0});
    const GridBatch fine = make_grid(MemberLists{line});
    const Vec3i k{4, 1, 1};
    const Vec3i s{4, 1, 1};
    const GridBatch coarse = fine.conv_grid(k, s);
    ASSERT_EQ(coarse.ijk_host(), (std::vector<Vec3i>{{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {3, 0, 0}, {4, 0, 0}}));
    const KernelMap map = neighbour_map(fine, coarse, k, s);
    const std::vector<int32_t> dense = map_host(map);
    ASSERT_EQ(dense.size(), 20u);
    const std::vector<int> want_degree{3, 4, 4, 4, 1};
    for (int c = 0; c < 5; ++c) {
        int degree = 0;
        for (int t = 0; t < 4; ++t) degree += dense[static_cast<std::size_t>(c * 4 + t)] != -1;
        EXPECT_EQ(degree, want_degree[static_cast<std::size_t>(c)]) << "coarse voxel " << c;
    }
    // Exact rows: fine = 4c + tap - 1.
    EXPECT_EQ(dense, (std::vector<int32_t>{-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, -1, -1, -1}));
    EXPECT_EQ(map.num_edges(), 16);
    const sparsegrid::PairLists pairs = map.pairs_by_tap();
    EXPECT_EQ(pairs.tap_offsets, (std::vector<int64_t>{0, 4, 8, 12, 16}));
    EXPECT_EQ(pairs.source_index.to_host(),
              (std::vector<int32_t>{3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14}));
    EXPECT_EQ(pairs.target_index.to_host(), (std::vector<int32_t>{1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}));
    // Transposed direction of the same edges: conv_transpose_grid(4,4) of {0} is {-1,0,1,2}, one edge each.
    const GridBatch origin = make_grid(MemberLists{{{0, 0, 0}}});
    const GridBatch generated = origin.conv_transpose_grid(k, s);
    ASSERT_EQ(generated.ijk_host(), (std::vector<Vec3i>{{-1, 0, 0}, {0, 0, 0}, {1, 0, 0}, {2, 0, 0}}));
    const KernelMap up = neighbour_map(origin, generated, k, s, MapDirection::Transposed);
    EXPECT_EQ(map_host(up), (std::vector<int32_t>{0, -1, -1, -1, -1, 0, -1, -1, -1, -1, 0, -1, -1, -1, -1, 0}));
}

TEST_P(KernelMapTest, TapNumberingIsRowMajorOverAxes) {
    // One coarse voxel at the origin, K = {3,2,5}, S = 1, source holding one voxel per tap position:
    // tap t = t0*K1*K2 + t1*K2 + t2 must find the fine voxel (t0-1, t1-0, t2-2).
    const Vec3i k{3, 2, 5};
    std::vector<Vec3i> fine;
    for (int32_t a = -1; a <= 1; ++a)
        for (int32_t b = 0; b <= 1; ++b)
            for (int32_t c = -2; c <= 2; ++c) fine.push_back({a, b, c});
    const GridBatch source = make_grid(MemberLists{fine});
    const GridBatch target = make_grid(MemberLists{{{0, 0, 0}}});
    const std::vector<int32_t> dense = map_host(neighbour_map(source, target, k, {1, 1, 1}));
    const std::vector<Vec3i> source_ijk = source.ijk_host();
    ASSERT_EQ(dense.size(), 30u);
    for (int32_t t0 = 0; t0 < 3; ++t0)
        for (int32_t t1 = 0; t1 < 2; ++t1)
            for (int32_t t2 = 0; t2 < 5; ++t2) {
                const int32_t t = t0 * 10 + t1 * 5 + t2;
                const int32_t entry = dense[static_cast<std::size_t>(t)];
                ASSERT_GE(entry, 0) << "tap " << t;
                EXPECT_EQ(source_ijk[static_cast<std::size_t>(entry)], (Vec3i{t0 - 1, t1, t2 - 2})) << "tap " << t;
            }
}

TEST_P(KernelMapTest, MembersDoNotInteract) {
    // Member 1 holds the voxels member 0 would need; member 0's rows must stay -1.
    const GridBatch source = make_grid(MemberLists{{}, {{0, 0, 0}, {1, 0, 0}}});
    const GridBatch target = make_grid(MemberLists{{{0, 0, 0}}, {}});
    const KernelMap map = neighbour_map(source, target, {3, 3, 3}, {1, 1, 1});
    const std::vector<int32_t> dense = map_host(map);
    ASSERT_EQ(dense.size(), 27u);
    for (int32_t e : dense) EXPECT_EQ(e, -1);
    EXPECT_EQ(map.num_edges(), 0);
}

TEST_P(KernelMapTest, SymmetricMapsAtTheEndsOfTheKeyRange) {
    // Coordinates -8 .. 7 on every axis fill a 4-bit key range exactly (the smallest that holds the
    // box): an offset that leaves the box at one end must not find the voxels at the other end, which a
    // key moved without the box test would wrap onto. Lines along each axis at the box's faces and
    // edges, a diagonal, and a member in between.
    MemberLists members(3);
    for (int32_t v = -8; v <= 7; ++v) {
        members[0].push_back({v, -8, 7});
        members[0].push_back({-8, v, -8});
        members[0].push_back({7, 7, v});
        members[0].push_back({v, 0, -8});
        members[2].push_back({v, v, v});
        members[2].push_back({-8, -v - 1, 7});
    }
    members[1] = {{-8, -8, -8}, {7, 7, 7}, {0, 0, 0}};
    const GridBatch grid = make_grid(members);
    for (const Vec3i& k : {Vec3i{3, 3, 3}, Vec3i{5, 5, 5}, Vec3i{7, 1, 3}})
        for (MapDirection d : {MapDirection::Forward, MapDirection::Transposed}) {
            SCOPED_TRACE("K=" + str(k) + (d == MapDirection::Forward ? " forward" : " transposed"));
            const KernelMap map = neighbour_map(grid, grid, k, {1, 1, 1}, d);
            EXPECT_TRUE(map_matches_oracle(map, grid, grid, k, {1, 1, 1}, d));
            EXPECT_TRUE(pairs_match_map(map));
        }
}

TEST_P(KernelMapTest, SymmetricMapsOfOddKernelShapesMatchTheOracle) {
    // Same grid, stride 1, odd kernels of every orientation up to 27 taps and beyond, both directions,
    // on random batches (far members included) and on a solid block whose voxels fill the lookup as
    // densely as a grid can (every probe of a tap finds a voxel, so the table's collisions count).
    std::vector<MemberLists> batches;
    for (std::size_t index : {std::size_t{1}, std::size_t{6}}) {
        Rng rng(test_seeds()[index] + 7000);
        RandomBatchOptions options;
        options.batch_size = 1 + static_cast<int64_t>(index % 5);
        options.allow_far = index == 6;
        batches.push_back(random_members(rng, options));
    }
    MemberLists block(2);
    for (int32_t i = -6; i < 6; ++i)
        for (int32_t j = -5; j < 7; ++j)
            for (int32_t l = -4; l < 8; ++l) block[(i + j + l) % 7 == 0 ? 0 : 1].push_back({i, j, l});
    batches.push_back(block);
    const std::vector<Vec3i> kernels{{1, 1, 3}, {3, 1, 1}, {1, 3, 1}, {3, 3, 1},  {3, 1, 3}, {1, 3, 3},
                                     {3, 3, 3}, {5, 5, 1}, {1, 5, 5}, {1, 1, 27}, {9, 3, 1}, {5, 5, 3}};
    for (std::size_t b = 0; b < batches.size(); ++b) {
        const GridBatch grid = make_grid(batches[b]);
        for (const Vec3i& k : kernels)
            for (MapDirection d : {MapDirection::Forward, MapDirection::Transposed}) {
                SCOPED_TRACE("batch " + std::to_string(b) + " K=" + str(k) +
                             (d == MapDirection::Forward ? " forward" : " transposed"));
                const KernelMap map = neighbour_map(grid, grid, k, {1, 1, 1}, d);
                EXPECT_TRUE(map_matches_oracle(map, grid, grid, k, {1, 1, 1}, d));
                EXPECT_TRUE(pairs_match_map(map));
            }
    }
}

TEST_P(KernelMapTest, FarCoordinatesDoNotWrap) {
    // S*c + tap - pb computed in 32 bits would wrap onto voxels that exist on the other side of the
    // int32 range; those must not be found.
    const int32_t c = kTwoPow30 + 5;
    const int32_t wrapped = static_cast<int32_t>(static_cast<int64_t>(2) * c - (int64_t{1} << 32));  // -2^31 + 10
    const GridBatch coarse = make_grid(MemberLists{{{c, 0, 0}}});
    const GridBatch fine = make_grid(MemberLists{{{wrapped, 0, 0}, {wrapped + 1, 0, 0}}});
    const Vec3i k{2, 1, 1};
    const Vec3i s{2, 1, 1};
    KernelMap forward;
    ASSERT_NO_THROW(forward = neighbour_map(fine, coarse, k, s, MapDirection::Forward));
    EXPECT_EQ(map_host(forward), (std::vector<int32_t>{-1, -1}));
    EXPECT_TRUE(map_matches_oracle(forward, fine, coarse, k, s, MapDirection::Forward));
    KernelMap transposed;
    ASSERT_NO_THROW(transposed = neighbour_map(coarse, fine, k, s, MapDirection::Transposed));
    EXPECT_EQ(map_host(transposed), (std::vector<int32_t>{-1, -1, -1, -1}));

    // Stride 1 at the int32 edges: INT32_MAX + 1 must not find INT32_MIN, INT32_MIN - 1 not INT32_MAX.
    const GridBatch edges = make_grid(MemberLists{{{kInt32Max, 0, 0}, {kInt32Min, 0, 0}}});
    const KernelMap around = neighbour_map(edges, edges, {3, 1, 1}, {1, 1, 1});
    EXPECT_TRUE(map_matches_oracle(around, edges, edges, {3, 1, 1}, {1, 1, 1}, MapDirection::Forward));
    // Order: INT32_MIN first. Rows: [tap -1, tap 0, tap +1].
    EXPECT_EQ(map_host(around), (std::vector<int32_t>{-1, 0, -1, -1, 1, -1}));
}

TEST_P(KernelMapTest, EmptyGrids) {
    const GridBatch empty = make_grid(MemberLists(3));
    const GridBatch some = make_grid(MemberLists{{{0, 0, 0}}, {}, {{1, 1, 1}, {2, 2, 2}}});
    for (const auto& [source, target] : {std::pair<GridBatch, GridBatch>{empty, empty}, {empty, some}, {some, empty}}) {
        for (MapDirection d : {MapDirection::Forward, MapDirection::Transposed}) {
            const KernelMap map = neighbour_map(source, target, {3, 2, 1}, {2, 1, 1}, d);
            EXPECT_TRUE(map_matches_oracle(map, source, target, {3, 2, 1}, {2, 1, 1}, d));
            EXPECT_TRUE(pairs_match_map(map));
            EXPECT_EQ(map.num_edges(), 0);
            EXPECT_EQ(map.pairs_by_tap().tap_offsets, std::vector<int64_t>(7, 0));
            EXPECT_TRUE(maps_equal(map.transposed(), neighbour_map(target, source, {3, 2, 1}, {2, 1, 1}, opposite(d))));
        }
    }
}

}  // namespace
}  // namespace sparsegrid_test
