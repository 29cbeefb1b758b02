// Host synchronisations per operation (STYLE.md habit 6; DESIGN.md: at most one where an output size
// is data dependent, none where it is known in advance). Each call is measured alone, as the change of
// sparsegrid::host_synchronizations() around it: its inputs are prepared before (uploads do not sync,
// building the input grids does, outside the measurement) and its results are read back after.
//
// The CUDA bounds below are the documented costs. The CPU backend never synchronises: that part runs
// on every machine; the CUDA part needs a device and skips without one. The measured CUDA results are
// also compared with the CPU's, so a call cannot pass by doing nothing.
#include "oracle.h"
#include "test_util.h"

#include <sparsegrid/shapes.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace sparsegrid_test {
namespace {

using sparsegrid::Context;
using sparsegrid::neighbour_map;

/// One measured call: its syncs, the most CUDA may take, and its result read back afterwards.
struct Measurement {
    std::string operation;
    int64_t cuda_bound = 0;
    int64_t syncs = 0;
    std::function<std::vector<int64_t>()> read_result;
};

/// Everything a grid returns, flattened for comparison: offsets, then ijk.
std::vector<int64_t> grid_contents(const GridBatch& grid) {
    std::vector<int64_t> out(grid.voxel_offsets().begin(), grid.voxel_offsets().end());
    for (int32_t v : grid.ijk().to_host()) out.push_back(v);
    return out;
}

std::vector<int64_t> map_contents(const KernelMap& map) {
    std::vector<int64_t> out{map.num_source(), map.num_target()};
    for (int32_t v : map.neighbour_map().to_host()) out.push_back(v);
    return out;
}

std::vector<int64_t> pair_contents(const sparsegrid::PairLists& pairs) {
    std::vector<int64_t> out(pairs.tap_offsets.begin(), pairs.tap_offsets.end());
    for (int32_t v : pairs.source_index.to_host()) out.push_back(v);
    for (int32_t v : pairs.target_index.to_host()) out.push_back(v);
    return out;
}

class SyncLog {
public:
    /// Runs `call` alone between two reads of the counter and returns its result.
    template <typename Call>
    auto measure(const std::string& operation, int64_t cuda_bound, Call&& call) {
        const int64_t before = sparsegrid::host_synchronizations();
        auto result = call();
        const int64_t syncs = sparsegrid::host_synchronizations() - before;
        m_measurements.push_back({operation, cuda_bound, syncs, {}});
        return result;
    }
    GridBatch grid(const std::string& operation, int64_t cuda_bound, const std::function<GridBatch()>& call) {
        GridBatch result = measure(operation, cuda_bound, call);
        m_measurements.back().read_result = [result] { return grid_contents(result); };
        return result;
    }
    KernelMap map(const std::string& operation, int64_t cuda_bound, const std::function<KernelMap()>& call) {
        KernelMap result = measure(operation, cuda_bound, call);
        m_measurements.back().read_result = [result] { return map_contents(result); };
        return result;
    }
    const std::vector<Measurement>& measurements() const { return m_measurements; }
    std::vector<Measurement>& measurements() { return m_measurements; }

private:
    std::vector<Measurement> m_measurements;
};

/// The mesh input of from_mesh: a UV sphere per member (radius 5 to 12 voxels of the member, centres
/// at positive and negative coordinates), no faces for the last member.
struct SphereMeshes {
    std::vector<double> vertices;
    std::vector<int32_t> faces;
    std::vector<int64_t> vertex_offsets{0}, face_offsets{0};
};

SphereMeshes sphere_meshes(const std::vector<MemberTransform>& transforms) {
    constexpr int kRings = 12, kSegments = 24;
    const double pi = std::acos(-1.0);
    SphereMeshes out;
    for (std::size_t m = 0; m < transforms.size(); ++m) {
        if (m + 1 < transforms.size()) {
            const MemberTransform& t = transforms[m];
            const double radius = 5.0 + static_cast<double>(m);
            const double sign = m % 2 == 0 ? 1.0 : -1.0;
            const double centre[3] = {sign * (20.0 + 3.0 * static_cast<double>(m)), 7.3, -sign * 11.6};
            const int32_t base = static_cast<int32_t>(out.vertices.size() / 3);
            for (int r = 0; r <= kRings; ++r)
                for (int g = 0; g < kSegments; ++g) {
                    const double theta = pi * r / kRings, phi = 2.0 * pi * g / kSegments;
                    const double unit[3] = {std::sin(theta) * std::cos(phi), std::sin(theta) * std::sin(phi),
                                            std::cos(theta)};
                    for (int a = 0; a < 3; ++a)
                        out.vertices.push_back(t.origin[a] + t.voxel_size[a] * (centre[a] + radius * unit[a]));
                }
            for (int r = 0; r < kRings; ++r)
                for (int g = 0; g < kSegments; ++g) {
                    const int32_t v00 = base + r * kSegments + g, v01 = base + r * kSegments + (g + 1) % kSegments;
                    const int32_t v10 = v00 + kSegments, v11 = v01 + kSegments;
                    out.faces.insert(out.faces.end(),
                                     {v00 - base, v10 - base, v11 - base, v00 - base, v11 - base, v01 - base});
                }
        }
        out.vertex_offsets.push_back(static_cast<int64_t>(out.vertices.size() / 3));
        out.face_offsets.push_back(static_cast<int64_t>(out.faces.size() / 3));
    }
    return out;
}

/// Runs every measured operation in `ctx` on a batch of 8 synthetic surfaces (half of them moved to
/// negative coordinates, |c| < 2^18) plus an empty member.
std::vector<Measurement> measure_every_operation(const Context& ctx) {
    const uint64_t seed = 11;
    std::printf("[   SEED   ] host syncs: synthetic_surface_batch(8, 48, %llu), masks seed %llu\n",
                static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed + 1));
    MemberLists members = sparsegrid::synthetic_surface_batch(8, 48, seed);
    for (std::size_t m = 1; m < members.size(); m += 2)
        for (Vec3i& c : members[m]) c = {c[0] - 40, c[1] - 7, c[2] - 100};
    members.emplace_back();
    Rng rng(seed + 1);
    const std::vector<MemberTransform> transforms = random_transforms(rng, static_cast<int64_t>(members.size()));

    // Inputs, prepared outside the measurements.
    const FlatTriples<int32_t> flat = flatten(members);
    const DeviceArray<int32_t> ijk = to_device(flat.values, ctx);
    const GridBatch grid = GridBatch::from_ijk(members, transforms, ctx);
    const DeviceArray<uint8_t> mask = to_device(random_mask(rng, grid.num_voxels(), 0.5), ctx);
    MemberLists other_members = member_lists(grid);
    for (auto& member : other_members)
        for (Vec3i& c : member) c[0] += 1;
    const GridBatch other = GridBatch::from_ijk(other_members, transforms, ctx);
    const DeviceArray<int32_t> queries = to_device(flat.values, ctx);
    const SphereMeshes meshes = sphere_meshes(transforms);
    const DeviceArray<double> mesh_vertices = to_device(meshes.vertices, ctx);
    const DeviceArray<int32_t> mesh_faces = to_device(meshes.faces, ctx);

    SyncLog log;
    log.grid("from_ijk (|c| < 2^18)", 1, [&] { return GridBatch::from_ijk(ijk, flat.offsets, transforms, ctx); });
    const GridBatch coarse_k2s2 = log.grid("conv_grid(2, 2)", 1, [&] { return grid.conv_grid(2, 2); });
    const GridBatch coarse_k3s2 = log.grid("conv_grid(3, 2)", 1, [&] { return grid.conv_grid(3, 2); });
    log.grid("conv_grid(3, 1)", 1, [&] { return grid.conv_grid(3, 1); });
    const GridBatch fine_k2s2 = log.grid("conv_transpose_grid(2, 2)", 0,
                                         [&] { return grid.conv_transpose_grid(2, 2); });
    const GridBatch fine_k3s2 = log.grid("conv_transpose_grid(3, 2)", 1,
                                         [&] { return grid.conv_transpose_grid(3, 2); });
    log.grid("coarsened_grid(2)", 1, [&] { return grid.coarsened_grid(2); });
    log.grid("refined_grid(2)", 0, [&] { return grid.refined_grid(2); });
    log.grid("refined_grid(2, mask)", 1, [&] { return grid.refined_grid(2, mask); });
    log.grid("pruned_grid(mask)", 1, [&] { return grid.pruned_grid(mask); });
    log.grid("pruned_grid_with_index(mask)", 1, [&] { return grid.pruned_grid_with_index(mask).grid; });
    log.grid("dilated_grid(1)", 1, [&] { return grid.dilated_grid(1); });
    log.grid("dilated_grid(2)", 1, [&] { return grid.dilated_grid(2); });
    log.grid("merged_grid", 1, [&] { return grid.merged_grid(other); });
    log.grid("clipped_grid", 1, [&] { return grid.clipped_grid({{-30, -20, -60}}, {{30, 40, 20}}).grid; });
    // Documented in grid_batch.h: 1 sync for every level and coarsened grid together.
    const sparsegrid::GridPyramid pyramid = log.measure("pyramid(3, 2, 4 levels, 3 coarsened)", 1, [&] {
        return grid.pyramid({3, 3, 3}, {2, 2, 2}, 4, {{2, 2, 2}, {4, 4, 4}, {8, 8, 8}});
    });
    log.measurements().back().read_result = [pyramid] {
        std::vector<int64_t> out;
        for (const auto* grids : {&pyramid.levels, &pyramid.coarsened})
            for (const GridBatch& g : *grids) {
                const std::vector<int64_t> contents = grid_contents(g);
                out.insert(out.end(), contents.begin(), contents.end());
            }
        return out;
    };
    // Documented in grid_batch.h: the hit count (with the checks), then the member offsets.
    log.grid("from_mesh (8 spheres)", 2, [&] {
        return GridBatch::from_mesh(mesh_vertices, meshes.vertex_offsets, mesh_faces, meshes.face_offsets, transforms,
                                    ctx);
    });

    const KernelMap submanifold = log.map("neighbour_map K=3 S=1 (same grid)", 0, [&] {
        return neighbour_map(grid, grid, {3, 3, 3}, {1, 1, 1});
    });
    const KernelMap down_k3s2 = log.map("neighbour_map K=3 S=2 forward", 0, [&] {
        return neighbour_map(grid, coarse_k3s2, {3, 3, 3}, {2, 2, 2});
    });
    log.map("neighbour_map K=2 S=2 forward", 0, [&] { return neighbour_map(grid, coarse_k2s2, {2, 2, 2}, {2, 2, 2}); });
    const KernelMap up_k2s2 = log.map("neighbour_map K=2 S=2 transposed", 0, [&] {
        return neighbour_map(grid, fine_k2s2, {2, 2, 2}, {2, 2, 2}, MapDirection::Transposed);
    });
    log.map("neighbour_map K=3 S=2 transposed", 0, [&] {
        return neighbour_map(grid, fine_k3s2, {3, 3, 3}, {2, 2, 2}, MapDirection::Transposed);
    });
    log.map("neighbour_map K=(3,2,5) S=(1,2,3) forward", 0, [&] {
        return neighbour_map(grid, other, {3, 2, 5}, {1, 2, 3});
    });
    log.map("KernelMap::transposed() of K=3 S=1", 0, [&] { return submanifold.transposed(); });
    log.map("KernelMap::transposed() of K=3 S=2", 0, [&] { return down_k3s2.transposed(); });
    log.map("KernelMap::transposed() of K=2 S=2 transposed", 0, [&] { return up_k2s2.transposed(); });

    for (const KernelMap* map : {&submanifold, &up_k2s2}) {
        const std::string name = map == &submanifold ? "K=3 S=1" : "K=2 S=2 transposed";
        const sparsegrid::PairLists pairs = log.measure("pairs_by_tap of " + name, 1,
                                                        [&] { return map->pairs_by_tap(); });
        log.measurements().back().read_result = [pairs] { return pair_contents(pairs); };
    }
    // Documented in grid_batch.h: "1 launch per query batch, no sync".
    const sparsegrid::Buffer<int64_t> found = log.measure("ijk_to_index (span)", 0,
                                                          [&] { return grid.ijk_to_index(queries, flat.offsets); });
    log.measurements().back().read_result = [found] { return found.to_host(); };
    // Documented in grid_batch.h: "2 launches, no sync".
    const sparsegrid::Buffer<int32_t> boxes = log.measure("bbox", 0, [&] { return grid.bbox(); });
    log.measurements().back().read_result = [boxes] {
        const std::vector<int32_t> values = boxes.to_host();
        return std::vector<int64_t>(values.begin(), values.end());
    };

    return log.measurements();
}

void print_table(const std::string& backend, const std::vector<Measurement>& measurements) {
    std::printf("host synchronisations on %s (bound on CUDA):\n", backend.c_str());
    for (const Measurement& m : measurements)
        std::printf("  %-48s %3lld  (<= %lld)\n", m.operation.c_str(), static_cast<long long>(m.syncs),
                    static_cast<long long>(m.cuda_bound));
}

TEST(HostSyncs, CpuOperationsNeverSynchronise) {
    const std::vector<Measurement> measurements = measure_every_operation(cpu_context());
    print_table("cpu", measurements);
    for (const Measurement& m : measurements) {
        EXPECT_EQ(m.syncs, 0) << m.operation;
        EXPECT_FALSE(m.read_result().empty()) << m.operation;
    }
}

TEST(HostSyncs, CudaOperationsWithinDocumentedBounds) {
    if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
    const std::vector<Measurement> cuda = measure_every_operation(cuda_context());
    print_table("cuda", cuda);
    for (const Measurement& m : cuda) EXPECT_LE(m.syncs, m.cuda_bound) << m.operation;
    // The measured calls did the whole work: their results equal the CPU's.
    const std::vector<Measurement> cpu = measure_every_operation(cpu_context());
    ASSERT_EQ(cuda.size(), cpu.size());
    for (std::size_t n = 0; n < cuda.size(); ++n)
        EXPECT_EQ(cuda[n].read_result(), cpu[n].read_result()) << cuda[n].operation;
}

}  // namespace
}  // namespace sparsegrid_test
