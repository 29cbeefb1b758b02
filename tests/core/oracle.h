// Brute-force oracle for the sparsegrid tests: every operation is written as the literal set definition
// from DESIGN.md ("Semantics"), over std::set / std::map with int64 arithmetic and floor division.
// Nothing here is meant to be fast; everything here is meant to be obviously right.
#pragma once

#include <sparsegrid/grid_batch.h>
#include <sparsegrid/kernel_map.h>
#include <sparsegrid/types.h>

#include <array>
#include <cstdint>
#include <set>
#include <vector>

namespace sparsegrid_test {

using sparsegrid::Vec3d;
using sparsegrid::Vec3i;

/// A coordinate in int64, so that oracle results outside the int32 range can be represented (and then
/// reported as "this operation must raise").
using Coord64 = std::array<int64_t, 3>;
/// One member of a batch as a plain set of coordinates (std::set's lexicographic order is irrelevant:
/// the oracle order is applied separately by morton_less).
using OracleMember = std::set<Coord64>;
using OracleBatch = std::vector<OracleMember>;
/// Voxel lists per member, in the order a GridBatch reports them (global index = running position).
using MemberLists = std::vector<std::vector<Vec3i>>;

// ---- voxel order -----------------------------------------------------------------------------------

/// The coordinate read as an unsigned 32-bit number c + 2^31, exactly as the grid_batch.h comment says.
uint32_t biased(int32_t c);
/// The documented voxel order within a member: bit levels from 31 down to 0, at each level the bit of i,
/// then of j, then of k; the first differing bit decides. Written bit by bit on purpose.
bool morton_less(const Vec3i& a, const Vec3i& b);

// ---- helpers ---------------------------------------------------------------------------------------

int64_t floor_div(int64_t a, int64_t b);  ///< b > 0
int64_t floor_mod(int64_t a, int64_t b);  ///< b > 0, result in [0, b)
int64_t kernel_volume(const Vec3i& kernel_size);
/// Tap triple (t0, t1, t2) of linear tap t = t0*K1*K2 + t1*K2 + t2.
std::array<int64_t, 3> tap_of_index(int64_t t, const Vec3i& kernel_size);

OracleBatch oracle_from_lists(const MemberLists& members);
/// True when every coordinate of the batch fits into int32.
bool fits_int32(const OracleBatch& batch);
/// A member's voxels sorted by morton_less (requires fits_int32).
std::vector<Vec3i> morton_sorted(const OracleMember& member);

// ---- topology operations (DESIGN.md "Semantics") ------------------------------------------------------

/// {c : exists tap with S*c + tap - pb in F}
OracleBatch oracle_conv_grid(const OracleBatch& fine, const Vec3i& kernel_size, const Vec3i& stride);
/// {S*c + tap - pb : c in C, tap}
OracleBatch oracle_conv_transpose_grid(const OracleBatch& coarse, const Vec3i& kernel_size, const Vec3i& stride);
/// floor(ijk / f)
OracleBatch oracle_coarsened_grid(const OracleBatch& grid, const Vec3i& factor);
/// Each kept voxel c becomes f*c + [0, f)^3. `mask` indexes the voxels of `members` in global order;
/// an empty mask keeps all.
OracleBatch oracle_refined_grid(const MemberLists& members, const Vec3i& factor, const std::vector<uint8_t>& mask);
/// Every voxel within Chebyshev distance d.
OracleBatch oracle_dilated_grid(const OracleBatch& grid, int64_t distance);
/// The voxels whose mask byte is nonzero.
OracleBatch oracle_pruned_grid(const MemberLists& members, const std::vector<uint8_t>& mask);
/// Per-member union.
OracleBatch oracle_merged_grid(const OracleBatch& a, const OracleBatch& b);

// ---- kernel maps -----------------------------------------------------------------------------------

/// Dense neighbour map [num_target, Kvol] (row-major, -1 = no edge) built by enumerating every
/// (coarse voxel, tap) pair, computing fine = S*coarse + tap - pb and looking the fine voxel up.
/// Forward: source = fine, target = coarse. Transposed: source = coarse, target = fine.
std::vector<int32_t> oracle_neighbour_map(const MemberLists& source, const MemberLists& target,
                                          const Vec3i& kernel_size, const Vec3i& stride,
                                          sparsegrid::MapDirection direction);

// ---- transforms ------------------------------------------------------------------------------------

sparsegrid::MemberTransform transform_conv(const sparsegrid::MemberTransform& t, const Vec3i& stride);
sparsegrid::MemberTransform transform_conv_transpose(const sparsegrid::MemberTransform& t, const Vec3i& stride);
sparsegrid::MemberTransform transform_coarsened(const sparsegrid::MemberTransform& t, const Vec3i& factor);
sparsegrid::MemberTransform transform_refined(const sparsegrid::MemberTransform& t, const Vec3i& factor);

}  // namespace sparsegrid_test
