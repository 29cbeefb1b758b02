// Shared helpers of the core tests: the backends every test runs on (a value-parameterized fixture
// and uploads of host inputs to the backend's device), random batches (fixed seeds), GridBatch <->
// oracle conversion, assertions that compare a grid with the oracle as a set AND in the documented
// order, and a checker for the library's error messages.
#pragma once

#include "oracle.h"

#include <sparsegrid/sparsegrid.h>

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace sparsegrid_test {

using sparsegrid::GridBatch;
using sparsegrid::KernelMap;
using sparsegrid::MapDirection;
using sparsegrid::MemberTransform;

using Rng = std::mt19937_64;

// ---- backends ----------------------------------------------------------------------------------------

/// One backend the suite runs on: its name in test names ("cpu", "cuda") and the context operations
/// run in. CUDA uses device 0, the legacy default stream and the default allocator.
struct Backend {
    std::string name;
    sparsegrid::Context context;
};

/// Lets GoogleTest print a Backend parameter as its name.
void PrintTo(const Backend& backend, std::ostream* os);

sparsegrid::Context cpu_context();
sparsegrid::Context cuda_context();
/// True when this build has the CUDA backend and the machine a CUDA device.
bool cuda_device_present();
/// CPU always, then CUDA when cuda_device_present().
std::vector<Backend> available_backends();
/// Test name suffix of a Backend parameter: "cpu" or "cuda".
std::string backend_name(const ::testing::TestParamInfo<Backend>& info);

/// A host vector copied to a context's device (a plain copy on the CPU), viewed as the Span the API
/// takes for inputs it reads through a pointer. On CUDA those inputs must be device memory, so the
/// tests never pass host vectors there. A temporary in the call expression lives long enough:
/// `grid.pruned_grid(to_device(mask, ctx))`; the device copy is freed in stream order after the call.
template <typename T>
class DeviceArray {
public:
    DeviceArray(const std::vector<T>& host, const sparsegrid::Context& ctx)
        : m_buffer(sparsegrid::Buffer<T>::from_host(host, ctx)) {}
    sparsegrid::Span<const T> span() const { return sparsegrid::Span<const T>(m_buffer.data(), m_buffer.size()); }
    operator sparsegrid::Span<const T>() const { return span(); }
    const sparsegrid::Buffer<T>& buffer() const { return m_buffer; }

private:
    sparsegrid::Buffer<T> m_buffer;
};

template <typename T>
DeviceArray<T> to_device(const std::vector<T>& host, const sparsegrid::Context& ctx) {
    return DeviceArray<T>(host, ctx);
}

/// Per-member triples flattened the way the Span constructors and lookups take them: values of all
/// members concatenated, member-major, and B+1 offsets counted in triples.
template <typename T>
struct FlatTriples {
    std::vector<T> values;
    std::vector<int64_t> offsets{0};
};

template <typename T>
FlatTriples<T> flatten(const std::vector<std::vector<std::array<T, 3>>>& members) {
    FlatTriples<T> flat;
    for (const auto& member : members) {
        for (const auto& triple : member) flat.values.insert(flat.values.end(), triple.begin(), triple.end());
        flat.offsets.push_back(static_cast<int64_t>(flat.values.size() / 3));
    }
    return flat;
}

/// Fixture of every test that runs on each backend present:
///   class TopologyTest : public BackendTest {};
///   INSTANTIATE_TEST_SUITE_P(, TopologyTest, ::testing::ValuesIn(available_backends()), backend_name);
///   TEST_P(TopologyTest, Name) { ... make_grid(...) ... on_device(mask) ... device() ... }
/// gives the tests TopologyTest.Name/cpu and, with a CUDA device, TopologyTest.Name/cuda. (Suites are
/// named ...Test because GridBatch and KernelMap already name the library's types here.)
class BackendTest : public ::testing::TestWithParam<Backend> {
protected:
    const sparsegrid::Context& ctx() const { return GetParam().context; }
    sparsegrid::Device device() const { return ctx().device; }
    /// GridBatch::from_ijk of host lists on this backend (the host overload uploads them).
    GridBatch make_grid(const std::vector<std::vector<Vec3i>>& members,
                        const std::vector<MemberTransform>& transforms = {}) const {
        return GridBatch::from_ijk(members, transforms, ctx());
    }
    /// A copy of `host` on this backend's device, for masks, coordinate and point spans.
    template <typename T>
    DeviceArray<T> on_device(const std::vector<T>& host) const {
        return DeviceArray<T>(host, ctx());
    }
};

constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kTwoPow30 = int32_t{1} << 30;

/// Uniform integer in [lo, hi].
int64_t uniform_int(Rng& rng, int64_t lo, int64_t hi);
/// Uniform double in [lo, hi).
double uniform_real(Rng& rng, double lo, double hi);

struct RandomBatchOptions {
    int64_t batch_size = 4;
    /// Add members whose voxels lie near +-2^30 (safe for ops that do not scale coordinates).
    bool allow_far = false;
    /// Probability of an empty member.
    double empty_probability = 0.15;
    /// Blob half-extent range per axis.
    int32_t max_blob_radius = 4;
};

/// Random members (with duplicates in the lists, as from_ijk accepts them): empty members, clustered
/// blobs, scattered points and lines, coordinates up to a few hundred in magnitude (negative included),
/// and with allow_far some members near +-2^30.
MemberLists random_members(Rng& rng, const RandomBatchOptions& options);
/// Random per-member transforms (different per member, positive voxel sizes, arbitrary origins).
std::vector<MemberTransform> random_transforms(Rng& rng, int64_t batch_size);
Vec3i random_kernel_size(Rng& rng);  ///< per axis in [1, 6]
Vec3i random_stride(Rng& rng);       ///< per axis in [1, 5]
std::vector<uint8_t> random_mask(Rng& rng, int64_t count, double keep_probability);

std::string str(const Vec3i& v);
std::string str(const Vec3d& v);

/// The grid's voxels per member, in the grid's order.
MemberLists member_lists(const GridBatch& grid);

/// Structure checks of any grid: on `device` (grid, context and buffers), batch size, offsets (from 0,
/// non-decreasing, last = num_voxels, num_voxels(m) consistent, device buffer equal to host copy), ijk
/// size, strictly increasing documented order within every member, and a coordinate_box() equal to
/// the smallest box of the voxels (on every backend, as documented).
::testing::AssertionResult grid_is_well_formed(const GridBatch& grid, sparsegrid::Device device);
/// grid_is_well_formed plus: member m holds exactly expected[m], in the documented order.
::testing::AssertionResult grid_matches(const GridBatch& grid, const OracleBatch& expected, sparsegrid::Device device);
/// Transforms equal up to a relative tolerance.
::testing::AssertionResult transforms_near(const std::vector<MemberTransform>& actual,
                                           const std::vector<MemberTransform>& expected, double rel_tol = 1e-12);

/// Dense neighbour map of a KernelMap, checked against its declared shape.
std::vector<int32_t> map_host(const KernelMap& map);
/// Exact equality of two kernel maps (shape, K, S, direction and every entry).
::testing::AssertionResult maps_equal(const KernelMap& actual, const KernelMap& expected);
/// Entry-by-entry comparison of a map against the oracle for (source, target); the map must live on the
/// device of both grids.
::testing::AssertionResult map_matches_oracle(const KernelMap& map, const GridBatch& source, const GridBatch& target,
                                              const Vec3i& kernel_size, const Vec3i& stride, MapDirection direction);
/// pairs_by_tap(): Kvol + 1 offsets, per tap increasing targets, exactly the non -1 map entries, on the
/// map's device.
::testing::AssertionResult pairs_match_map(const KernelMap& map);

/// Runs fn and checks that it throws sparsegrid::Error whose message names `operation` and, after it,
/// contains at least one of `any_of` (the argument the error is about).
::testing::AssertionResult throws_error(const std::function<void()>& fn, const std::string& operation,
                                        std::initializer_list<const char*> any_of);

/// The seeds every randomized test runs.
std::vector<uint64_t> test_seeds();

}  // namespace sparsegrid_test
