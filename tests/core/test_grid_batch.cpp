// GridBatch construction and accessors: from_points, world <-> index transforms, ijk_to_index lookups,
// and the full int32 coordinate range. Every test runs on each backend present (test_util.h).
#include "oracle.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace sparsegrid_test {
namespace {

class GridBatchTest : public BackendTest {};
INSTANTIATE_TEST_SUITE_P(, GridBatchTest, ::testing::ValuesIn(available_backends()), backend_name);

TEST_P(GridBatchTest, AccessorsOfTransforms) {
    const std::vector<MemberTransform> transforms{{{0.5, 0.25, 2.0}, {1.0, -2.0, 3.5}},
                                                  {{0.1, 0.3, 0.7}, {-4.0, 0.0, 9.0}}};
    const GridBatch grid = make_grid(MemberLists{{{1, 2, 3}}, {}}, transforms);
    EXPECT_EQ(grid.transforms(), transforms);
    EXPECT_EQ(grid.voxel_size(0), transforms[0].voxel_size);
    EXPECT_EQ(grid.voxel_size(1), transforms[1].voxel_size);
    EXPECT_EQ(grid.origin(0), transforms[0].origin);
    EXPECT_EQ(grid.origin(1), transforms[1].origin);
    EXPECT_EQ(grid.context().device, device());
    EXPECT_EQ(grid.device(), device());
    // xyz = o + h * ijk
    const Vec3d world = grid.index_to_world(0, {1.0, 2.0, 3.0});
    EXPECT_DOUBLE_EQ(world[0], 1.5);
    EXPECT_DOUBLE_EQ(world[1], -1.5);
    EXPECT_DOUBLE_EQ(world[2], 9.5);
    const Vec3d other = grid.index_to_world(1, {-10.0, 0.5, 2.0});
    EXPECT_NEAR(other[0], -5.0, 1e-12);
    EXPECT_NEAR(other[1], 0.15, 1e-12);
    EXPECT_NEAR(other[2], 10.4, 1e-12);
    const Vec3d index = grid.world_to_index(1, {-5.0, 0.15, 10.4});
    EXPECT_NEAR(index[0], -10.0, 1e-9);
    EXPECT_NEAR(index[1], 0.5, 1e-9);
    EXPECT_NEAR(index[2], 2.0, 1e-9);
}

TEST_P(GridBatchTest, WorldIndexRoundTrip) {
    Rng rng(77);
    SCOPED_TRACE("seed=77");
    const std::vector<MemberTransform> transforms = random_transforms(rng, 5);
    const GridBatch grid = make_grid(MemberLists(5), transforms);
    for (int n = 0; n < 500; ++n) {
        const int64_t m = uniform_int(rng, 0, 4);
        const Vec3d ijk{uniform_real(rng, -500, 500), uniform_real(rng, -500, 500), uniform_real(rng, -500, 500)};
        const Vec3d world = grid.index_to_world(m, ijk);
        const Vec3d back = grid.world_to_index(m, world);
        for (int a = 0; a < 3; ++a) {
            EXPECT_NEAR(world[a], transforms[m].origin[a] + transforms[m].voxel_size[a] * ijk[a], 1e-9);
            EXPECT_NEAR(back[a], ijk[a], 1e-9);
        }
        const Vec3d xyz{uniform_real(rng, -100, 100), uniform_real(rng, -100, 100), uniform_real(rng, -100, 100)};
        const Vec3d there = grid.index_to_world(m, grid.world_to_index(m, xyz));
        for (int a = 0; a < 3; ++a) EXPECT_NEAR(there[a], xyz[a], 1e-9);
    }
}

TEST_P(GridBatchTest, FromPointsRandom) {
    for (uint64_t seed : test_seeds()) {
        SCOPED_TRACE("seed=" + std::to_string(seed));
        Rng rng(seed + 200);
        const int64_t batch = 1 + static_cast<int64_t>(seed % 8);
        const std::vector<MemberTransform> transforms = random_transforms(rng, batch);
        std::vector<std::vector<Vec3d>> points(static_cast<std::size_t>(batch));
        OracleBatch expected(static_cast<std::size_t>(batch));
        OracleBatch by_formula(static_cast<std::size_t>(batch));
        for (int64_t m = 0; m < batch; ++m) {
            if (uniform_int(rng, 0, 5) == 0) continue;  // empty member
            const MemberTransform& t = transforms[static_cast<std::size_t>(m)];
            const int64_t count = uniform_int(rng, 1, 200);
            for (int64_t n = 0; n < count; ++n) {
                // A voxel and a point well inside it ...
                Coord64 voxel{};
                Vec3d xyz{};
                for (int a = 0; a < 3; ++a) {
                    voxel[a] = uniform_int(rng, -60, 60);
                    const double u = uniform_real(rng, -0.49, 0.49);
                    xyz[a] = t.origin[a] + t.voxel_size[a] * (static_cast<double>(voxel[a]) + u);
                }
                points[static_cast<std::size_t>(m)].push_back(xyz);
                expected[static_cast<std::size_t>(m)].insert(voxel);
                // ... and an arbitrary point, by the documented formula.
                Vec3d any{};
                Coord64 any_voxel{};
                for (int a = 0; a < 3; ++a) {
                    any[a] = uniform_real(rng, -50.0, 50.0);
                    any_voxel[a] = static_cast<int64_t>(std::floor((any[a] - t.origin[a]) / t.voxel_size[a] + 0.5));
                }
                points[static_cast<std::size_t>(m)].push_back(any);
                expected[static_cast<std::size_t>(m)].insert(any_voxel);
            }
        }
        const GridBatch grid = GridBatch::from_points(points, transforms, ctx());
        EXPECT_TRUE(grid_matches(grid, expected, device()));
        EXPECT_EQ(grid.transforms(), transforms);
        // Span version, same answer.
        const FlatTriples<double> flat = flatten(points);
        const GridBatch spans = GridBatch::from_points(on_device(flat.values), flat.offsets, transforms, ctx());
        EXPECT_TRUE(grid_is_well_formed(spans, device()));
        EXPECT_EQ(spans.ijk_host(), grid.ijk_host());
        EXPECT_EQ(spans.voxel_offsets(), grid.voxel_offsets());
    }
}

TEST_P(GridBatchTest, FromPointsVoxelBoundaries) {
    // Dyadic transforms make every computation exact, so boundaries are decided by the formula alone:
    // floor((x - o)/h + 1/2): a point exactly half way between voxel centres i and i+1 belongs to i+1.
    const MemberTransform t0{{0.5, 0.25, 2.0}, {0.25, -1.0, 3.0}};
    const MemberTransform t1{{1.0, 1.0, 1.0}, {0.0, 0.0, 0.0}};
    auto at = [](const MemberTransform& t, const Vec3d& ijk) {
        return Vec3d{t.origin[0] + t.voxel_size[0] * ijk[0], t.origin[1] + t.voxel_size[1] * ijk[1],
                     t.origin[2] + t.voxel_size[2] * ijk[2]};
    };
    const std::vector<std::vector<Vec3d>> points{
        {at(t0, {0.5, -0.5, 2.5}), at(t0, {-3.5, 7.5, -0.5}), at(t0, {-1.0, 0.0, 1.0})},
        {{-0.5, 0.5, -1.5}, {0.4999999, -0.5000001, 2.0}, {-7.25, -7.75, 3.4999}}};
    const GridBatch grid = GridBatch::from_points(points, {t0, t1}, ctx());
    OracleBatch expected(2);
    expected[0] = {{1, 0, 3}, {-3, 8, 0}, {-1, 0, 1}};
    expected[1] = {{0, 1, -1}, {0, -1, 2}, {-7, -8, 3}};
    EXPECT_TRUE(grid_matches(grid, expected, device()));

    // Just either side of a boundary with a non-dyadic transform.
    const MemberTransform t2{{0.3, 0.7, 1.1}, {-0.2, 0.45, 5.0}};
    std::vector<std::vector<Vec3d>> near{{}};
    OracleBatch near_expected(1);
    for (int32_t i = -5; i <= 5; ++i) {
        const Vec3d boundary = at(t2, {i + 0.5, i + 0.5, i + 0.5});
        near[0].push_back({boundary[0] - 1e-7, boundary[1] + 1e-7, boundary[2] - 1e-7});
        near_expected[0].insert({i, i + 1, i});
    }
    EXPECT_TRUE(grid_matches(GridBatch::from_points(near, {t2}, ctx()), near_expected, device()));
}

TEST_P(GridBatchTest, FromPointsInt32Limits) {
    const MemberTransform unit{};
    // floor(x + 1/2) must land in int32: INT32_MAX and INT32_MIN themselves are fine.
    const GridBatch edges = GridBatch::from_points(
        std::vector<std::vector<Vec3d>>{{{2147483647.0, -2147483648.5, 0.0}, {2147483647.4, -2147483648.0, -0.5}}},
        {unit}, ctx());
    OracleBatch expected(1);
    expected[0].insert({kInt32Max, kInt32Min, 0});
    EXPECT_TRUE(grid_matches(edges, expected, device()));
}

TEST_P(GridBatchTest, IjkToIndexMatchesMap) {
    for (bool far : {false, true})
        for (std::size_t i = 0; i < test_seeds().size(); ++i) {
            const uint64_t seed = test_seeds()[i] + 300 + (far ? 1 : 0);
            SCOPED_TRACE("seed=" + std::to_string(seed));
            Rng rng(seed);
            RandomBatchOptions options;
            options.batch_size = 1 + static_cast<int64_t>(i % 8);
            options.allow_far = far;
            const GridBatch grid = make_grid(random_members(rng, options));
            const MemberLists lists = member_lists(grid);
            // Oracle: (member, ijk) -> global index.
            std::map<std::pair<int64_t, Vec3i>, int64_t> where;
            int64_t running = 0;
            for (std::size_t m = 0; m < lists.size(); ++m)
                for (const Vec3i& c : lists[m]) where[{static_cast<int64_t>(m), c}] = running++;
            // Queries: present voxels, voxels of other members, neighbours (mostly absent), extremes.
            MemberLists queries(lists.size());
            for (std::size_t m = 0; m < lists.size(); ++m) {
                for (const Vec3i& c : lists[m]) {
                    if (uniform_int(rng, 0, 1)) queries[m].push_back(c);
                    queries[m].push_back({c[0], c[1], c[2] == kInt32Max ? kInt32Min : c[2] + 1});
                }
                for (std::size_t other = 0; other < lists.size(); ++other)
                    if (other != m && !lists[other].empty()) queries[m].push_back(lists[other].front());
                queries[m].push_back({kInt32Min, kInt32Min, kInt32Min});
                queries[m].push_back({kInt32Max, kInt32Max, kInt32Max});
                queries[m].push_back({0, 0, 0});
                std::shuffle(queries[m].begin(), queries[m].end(), rng);
            }
            std::vector<int64_t> want;
            for (std::size_t m = 0; m < queries.size(); ++m)
                for (const Vec3i& q : queries[m]) {
                    const auto found = where.find({static_cast<int64_t>(m), q});
                    want.push_back(found == where.end() ? -1 : found->second);
                }
            EXPECT_EQ(grid.ijk_to_index(queries), want);
            // Span version.
            const FlatTriples<int32_t> flat = flatten(queries);
            const sparsegrid::Buffer<int64_t> result = grid.ijk_to_index(on_device(flat.values), flat.offsets);
            EXPECT_EQ(result.device(), device());
            EXPECT_EQ(result.to_host(), want);
            // Every voxel finds itself.
            std::vector<int64_t> identity(static_cast<std::size_t>(grid.num_voxels()));
            for (std::size_t n = 0; n < identity.size(); ++n) identity[n] = static_cast<int64_t>(n);
            EXPECT_EQ(grid.ijk_to_index(lists), identity);
        }
}

TEST_P(GridBatchTest, IjkToIndexPerMember) {
    // (1,2,3) exists in member 1 only: querying it for member 0 gives -1.
    const GridBatch grid = make_grid(MemberLists{{{0, 0, 0}}, {{1, 2, 3}, {0, 0, 0}}, {}});
    EXPECT_EQ(grid.ijk_to_index(MemberLists{{{1, 2, 3}, {0, 0, 0}}, {{1, 2, 3}, {0, 0, 0}, {3, 2, 1}}, {{0, 0, 0}}}),
              (std::vector<int64_t>{-1, 0, 2, 1, -1, -1}));
    // No queries at all.
    EXPECT_TRUE(grid.ijk_to_index(MemberLists(3)).empty());
}

TEST_P(GridBatchTest, Int32ExtremesRoundTrip) {
    const MemberLists members{{{kInt32Min, kInt32Max, 0},
                               {kInt32Max, kInt32Max, kInt32Max},
                               {kInt32Min, kInt32Min, kInt32Min},
                               {0, kInt32Min, kInt32Max},
                               {-1, 0, 1},
                               {kInt32Max, kInt32Min, kInt32Max},
                               {kInt32Min, kInt32Min, kInt32Min}},
                              {{kInt32Max, 0, 0}},
                              {}};
    const GridBatch grid = make_grid(members);
    const OracleBatch oracle = oracle_from_lists(members);
    EXPECT_TRUE(grid_matches(grid, oracle, device()));
    // ijk() round trip as raw ints.
    std::vector<int32_t> flat;
    for (const auto& member : member_lists(grid))
        for (const Vec3i& c : member) flat.insert(flat.end(), c.begin(), c.end());
    EXPECT_EQ(grid.ijk().to_host(), flat);
    EXPECT_EQ(grid.coordinate_box().lo, (Vec3i{kInt32Min, kInt32Min, kInt32Min}));
    EXPECT_EQ(grid.coordinate_box().hi, (Vec3i{kInt32Max, kInt32Max, kInt32Max}));
    // Operations whose output stays in range accept the extremes.
    EXPECT_TRUE(grid_matches(grid.conv_grid(1, 1), oracle, device()));
    EXPECT_TRUE(grid_matches(grid.conv_transpose_grid(1, 1), oracle, device()));
    EXPECT_TRUE(grid_matches(grid.dilated_grid(0), oracle, device()));
    EXPECT_TRUE(grid_matches(grid.refined_grid(1), oracle, device()));
    for (const Vec3i& f : {Vec3i{2, 2, 2}, Vec3i{3, 7, 1}, Vec3i{kInt32Max, 2, 5}})
        EXPECT_TRUE(grid_matches(grid.coarsened_grid(f), oracle_coarsened_grid(oracle, f), device()))
            << "factor " << str(f);
    // conv_grid with K=2 (pb=0), S=2 is floor(ijk/2); K=1 with any stride divides exactly: in range.
    EXPECT_TRUE(grid_matches(grid.conv_grid(2, 2), oracle_conv_grid(oracle, {2, 2, 2}, {2, 2, 2}), device()));
    EXPECT_TRUE(
        grid_matches(grid.conv_grid({1, 1, 1}, {5, 3, 4}), oracle_conv_grid(oracle, {1, 1, 1}, {5, 3, 4}), device()));
    const std::vector<uint8_t> mask{1, 0, 1, 0, 1, 1, 0};
    const DeviceArray<uint8_t> device_mask = on_device(mask);
    EXPECT_TRUE(grid_matches(grid.pruned_grid(device_mask), oracle_pruned_grid(member_lists(grid), mask), device()));
    EXPECT_TRUE(grid_matches(grid.merged_grid(grid.pruned_grid(device_mask)), oracle, device()));
    // Lookups at the extremes.
    ASSERT_EQ(grid.num_voxels(), 7);  // 6 distinct in member 0, 1 in member 1
    EXPECT_EQ(grid.ijk_to_index(member_lists(grid)), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
    const KernelMap self = sparsegrid::neighbour_map(grid, grid, {1, 1, 1}, {1, 1, 1});
    EXPECT_EQ(map_host(self), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
}

TEST_P(GridBatchTest, ExactBoundsAccepted) {
    // Largest inputs whose outputs still fit must not raise.
    const GridBatch top = make_grid(MemberLists{{{kTwoPow30 - 1, -kTwoPow30, 0}}});
    // refined_grid(2): 2*(2^30-1)+1 = 2^31-1, 2*(-2^30) = -2^31.
    EXPECT_TRUE(grid_matches(top.refined_grid(2), oracle_refined_grid(member_lists(top), {2, 2, 2}, {}), device()));
    // conv_transpose_grid(2,2): the same children.
    EXPECT_TRUE(
        grid_matches(top.conv_transpose_grid(2, 2), oracle_refined_grid(member_lists(top), {2, 2, 2}, {}), device()));
    // dilated_grid(1) one step inside the edges.
    const GridBatch inner = make_grid(MemberLists{{{kInt32Max - 1, kInt32Min + 1, 0}}});
    EXPECT_TRUE(
        grid_matches(inner.dilated_grid(1), oracle_dilated_grid(oracle_from_lists(member_lists(inner)), 1), device()));
    EXPECT_TRUE(grid_matches(inner.conv_grid(3, 1),
                             oracle_conv_grid(oracle_from_lists(member_lists(inner)), {3, 3, 3}, {1, 1, 1}), device()));
}

/// Forwards to the device's default allocator and keeps count, to see that every buffer goes through
/// the context's allocator and is given back.
class CountingAllocator : public sparsegrid::Allocator {
public:
    void* allocate(std::size_t bytes, sparsegrid::Device device, void* stream) override {
        ++allocations;
        outstanding += static_cast<int64_t>(bytes);
        return sparsegrid::default_allocator(device).allocate(bytes, device, stream);
    }
    void deallocate(void* ptr, std::size_t bytes, sparsegrid::Device device, void* stream) noexcept override {
        ++deallocations;
        outstanding -= static_cast<int64_t>(bytes);
        sparsegrid::default_allocator(device).deallocate(ptr, bytes, device, stream);
    }
    int64_t allocations = 0;
    int64_t deallocations = 0;
    int64_t outstanding = 0;
};

TEST_P(GridBatchTest, ContextAllocatorOwnsAllMemory) {
    CountingAllocator counting;
    sparsegrid::Context counted = ctx();
    counted.allocator = &counting;
    {
        Rng rng(99);
        RandomBatchOptions options;
        options.batch_size = 3;
        options.empty_probability = 0.0;
        const GridBatch grid = GridBatch::from_ijk(random_members(rng, options), {}, counted);
        EXPECT_EQ(grid.context().allocator, &counting);
        const int64_t after_build = counting.allocations;
        EXPECT_GT(after_build, 0);
        // Derived grids and maps allocate through the same context.
        const GridBatch coarse = grid.conv_grid(3, 2);
        EXPECT_EQ(coarse.context().allocator, &counting);
        EXPECT_GT(counting.allocations, after_build);
        const KernelMap map = sparsegrid::neighbour_map(grid, coarse, {3, 3, 3}, {2, 2, 2});
        const sparsegrid::PairLists pairs = map.pairs_by_tap();
        const KernelMap back = map.transposed();
        EXPECT_TRUE(map_matches_oracle(map, grid, coarse, {3, 3, 3}, {2, 2, 2}, MapDirection::Forward));
        EXPECT_TRUE(pairs_match_map(map));
        EXPECT_TRUE(maps_equal(back.transposed(), map));
        EXPECT_GT(counting.outstanding, 0);
    }
    EXPECT_EQ(counting.outstanding, 0) << "buffers were not given back";
    EXPECT_EQ(counting.allocations, counting.deallocations);
}

TEST_P(GridBatchTest, BufferPrefixSharesStorage) {
    using sparsegrid::Buffer;
    const Buffer<int32_t> whole = Buffer<int32_t>::from_host(std::vector<int32_t>{1, 2, 3, 4, 5}, ctx());
    const Buffer<int32_t> front = whole.prefix(3);
    EXPECT_EQ(front.size(), 3);
    EXPECT_EQ(front.data(), whole.data());
    EXPECT_EQ(front.device(), whole.device());
    EXPECT_EQ(front.to_host(ctx().stream), (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(whole.prefix(5).to_host(ctx().stream), whole.to_host(ctx().stream));
    const Buffer<int32_t> none = whole.prefix(0);
    EXPECT_TRUE(none.empty());
    EXPECT_EQ(none.data(), nullptr);
    EXPECT_EQ(none.device(), whole.device());
    for (const int64_t bad : {int64_t{-1}, int64_t{6}}) {
        try {
            (void)whole.prefix(bad);
            ADD_FAILURE() << "prefix(" << bad << ") did not raise";
        } catch (const sparsegrid::Error& e) {
            EXPECT_NE(std::string(e.what()).find("count must be in [0, 5]"), std::string::npos) << e.what();
        }
    }
}

TEST_P(GridBatchTest, GeneratedGridsHoldExactlyTheirVoxels) {
    // Grids whose size depends on the data (from_ijk, conv_grid(2, 2), coarsened_grid(2^p), pruned and
    // clipped grids) hold exactly their voxels, equal to the oracle's, with duplicates and empty members
    // in the input; the selections' indices likewise.
    Rng rng(7);
    RandomBatchOptions options;
    options.batch_size = 4;
    options.empty_probability = 0.25;
    MemberLists members = random_members(rng, options);
    members[0].insert(members[0].end(), members[0].begin(), members[0].end());  // every voxel twice
    const GridBatch grid = make_grid(members);
    const OracleBatch oracle = oracle_from_lists(members);
    EXPECT_EQ(grid.ijk().size(), 3 * grid.num_voxels());
    EXPECT_TRUE(grid_matches(grid, oracle, device()));
    const GridBatch coarse = grid.conv_grid(2, 2);
    EXPECT_EQ(coarse.ijk().size(), 3 * coarse.num_voxels());
    EXPECT_TRUE(grid_matches(coarse, oracle_conv_grid(oracle, {2, 2, 2}, {2, 2, 2}), device()));
    const GridBatch coarser = grid.coarsened_grid(4);
    EXPECT_EQ(coarser.ijk().size(), 3 * coarser.num_voxels());
    EXPECT_TRUE(grid_matches(coarser, oracle_coarsened_grid(oracle, {4, 4, 4}), device()));
    std::vector<uint8_t> mask(static_cast<size_t>(grid.num_voxels()));
    for (size_t n = 0; n < mask.size(); ++n) mask[n] = n % 3 == 0;
    const sparsegrid::SelectedGrid pruned = grid.pruned_grid_with_index(on_device(mask));
    EXPECT_EQ(pruned.grid.ijk().size(), 3 * pruned.grid.num_voxels());
    EXPECT_TRUE(grid_matches(pruned.grid, oracle_pruned_grid(member_lists(grid), mask), device()));
    EXPECT_EQ(pruned.kept_index.size(), pruned.grid.num_voxels());
    const std::vector<int64_t> kept = pruned.kept_index.to_host(ctx().stream);
    for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(kept[i], static_cast<int64_t>(3 * i)) << i;
    const sparsegrid::SelectedGrid clipped = grid.clipped_grid({Vec3i{-3, -3, -3}}, {Vec3i{4, 4, 4}});
    EXPECT_EQ(clipped.grid.ijk().size(), 3 * clipped.grid.num_voxels());
    EXPECT_EQ(clipped.kept_index.size(), clipped.grid.num_voxels());
    std::vector<int64_t> inside;
    const std::vector<Vec3i> all = grid.ijk_host();
    for (size_t n = 0; n < all.size(); ++n) {
        bool in = true;
        for (int a = 0; a < 3; ++a) in = in && all[n][a] >= -3 && all[n][a] <= 4;
        if (in) inside.push_back(static_cast<int64_t>(n));
    }
    EXPECT_EQ(clipped.kept_index.to_host(ctx().stream), inside);
    const sparsegrid::SelectedGrid nothing = grid.pruned_grid_with_index(
        on_device(std::vector<uint8_t>(mask.size(), 0)));
    EXPECT_EQ(nothing.grid.num_voxels(), 0);
    EXPECT_EQ(nothing.grid.ijk().size(), 0);
    EXPECT_EQ(nothing.kept_index.size(), 0);
}

TEST(GridBatch, CudaRequestsWithoutCudaBackendRaise) {
    if (sparsegrid::cuda_backend_available()) GTEST_SKIP() << "built with CUDA";
    EXPECT_THROW(sparsegrid::default_allocator(sparsegrid::Device::cuda()), sparsegrid::Error);
    sparsegrid::Context ctx;
    ctx.device = sparsegrid::Device::cuda();
    EXPECT_THROW(GridBatch::from_ijk(MemberLists{{{0, 0, 0}}}, {}, ctx), sparsegrid::Error);
}

}  // namespace
}  // namespace sparsegrid_test
