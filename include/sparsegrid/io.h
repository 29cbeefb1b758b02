// Reading and writing voxel batches as text (the format of data/reference_batch_r64.txt):
//
//   line 1:      B, the member count (>= 0)
//   line 2:      the B + 1 member offsets, separated by blanks: 0 first, non-decreasing, last = N
//   lines 3...:  N lines "i j k" (int32 each), member-major: member m owns the voxel lines
//                [offsets[m], offsets[m + 1]); by convention lexicographic within a member
//
// Blanks are spaces or tabs; a line may end in "\r\n"; blank lines are allowed only after the last
// voxel line.
#pragma once

#include <sparsegrid/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sparsegrid {

/// Reads the file at `path`: one coordinate list per member, in file order (the voxel order inside a
/// member is kept as is and not checked). Strict: throws Error naming the file and the line number for
/// a missing or unreadable file, a bad member count, offsets that are not integers, do not start at 0,
/// decrease, are too few or too many, voxel lines that are not exactly three integers, values outside
/// the int32 range, and fewer or more voxel lines than the last offset announces.
std::vector<std::vector<Vec3i>> read_voxel_batch(const std::string& path);

/// Writes `members` in the format above (voxels in the given order). Throws Error when the file cannot
/// be created or written.
void write_voxel_batch(const std::string& path, const std::vector<std::vector<Vec3i>>& members);

/// The first `count` members, count in [0, members.size()] (Error otherwise). For the reference file:
/// first_members(read_voxel_batch(path), 16) is the batch-16 workload.
std::vector<std::vector<Vec3i>> first_members(const std::vector<std::vector<Vec3i>>& members, int64_t count);

}  // namespace sparsegrid
