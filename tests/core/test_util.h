// Shared helpers of the core tests: random batches (fixed seeds), GridBatch <-> oracle conversion,
// assertions that compare a grid with the oracle as a set AND in the documented order, and a checker
// for the library's error messages.
#pragma once

#include "oracle.h"

#include <sparsegrid/sparsegrid.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

namespace sparsegrid_test {

using sparsegrid::GridBatch;
using sparsegrid::KernelMap;
using sparsegrid::MapDirection;
using sparsegrid::MemberTransform;

using Rng = std::mt19937_64;

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

/// Structure checks of any grid: batch size, offsets (from 0, non-decreasing, last = num_voxels,
/// num_voxels(m) consistent, device buffer equal to host copy), ijk size, and strictly increasing
/// documented order within every member.
::testing::AssertionResult grid_is_well_formed(const GridBatch& grid);
/// grid_is_well_formed plus: member m holds exactly expected[m], in the documented order.
::testing::AssertionResult grid_matches(const GridBatch& grid, const OracleBatch& expected);
/// Transforms equal up to a relative tolerance.
::testing::AssertionResult transforms_near(const std::vector<MemberTransform>& actual,
                                           const std::vector<MemberTransform>& expected, double rel_tol = 1e-12);

/// Dense neighbour map of a KernelMap, checked against its declared shape.
std::vector<int32_t> map_host(const KernelMap& map);
/// Exact equality of two kernel maps (shape, K, S, direction and every entry).
::testing::AssertionResult maps_equal(const KernelMap& actual, const KernelMap& expected);
/// Entry-by-entry comparison of a map against the oracle for (source, target).
::testing::AssertionResult map_matches_oracle(const KernelMap& map, const GridBatch& source, const GridBatch& target,
                                              const Vec3i& kernel_size, const Vec3i& stride, MapDirection direction);
/// pairs_by_tap(): Kvol + 1 offsets, per tap increasing targets, exactly the non -1 map entries.
::testing::AssertionResult pairs_match_map(const KernelMap& map);

/// Runs fn and checks that it throws sparsegrid::Error whose message names `operation` and, after it,
/// contains at least one of `any_of` (the argument the error is about).
::testing::AssertionResult throws_error(const std::function<void()>& fn, const std::string& operation,
                                        std::initializer_list<const char*> any_of);

/// The seeds every randomized test runs.
std::vector<uint64_t> test_seeds();

}  // namespace sparsegrid_test
