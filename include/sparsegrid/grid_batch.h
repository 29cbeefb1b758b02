// GridBatch: an immutable batch of sparse voxel grids.
//
// Voxel order (part of the API, every operation produces it):
//   voxels of all members are concatenated member-major (member 0 first); within a member they are in
//   Morton (Z) order of the coordinates: compare the bits of the three coordinates from the most
//   significant down, interleaved i before j before k at each bit level, where each int32 coordinate is
//   read as the unsigned number c + 2^31 (so negative coordinates precede non-negative ones on every
//   axis). The order is a function of the coordinate set alone, never of how a grid was built, so two
//   grids with the same voxels have identical voxel indices on every backend.
//   Consequences used throughout: refining by 2 emits children in order; coarsening by 2 keeps order;
//   pruning keeps order.
//
// World transform per member: xyz = origin + voxel_size * ijk (component-wise); the origin is the world
// position of the centre of voxel (0, 0, 0).
//
// Cost notation in the comments: "launches" are CUDA kernel launches, "syncs" host synchronisations on
// the CUDA backend. The CPU backend runs the same algorithm with OpenMP and has no syncs.
#pragma once

#include <sparsegrid/buffer.h>
#include <sparsegrid/types.h>

#include <memory>
#include <vector>

namespace sparsegrid {

namespace detail {
struct GridStorage;
}

struct SelectedGrid;
using ClippedGrid = SelectedGrid;
struct GridPyramid;

class GridBatch {
public:
    /// An empty batch of zero members on the CPU.
    GridBatch();

    // ---------------------------------------------------------------------------------------------
    // Constructors
    // ---------------------------------------------------------------------------------------------

    /// From voxel coordinates in ctx.device memory: `ijk` holds member_offsets.back() triples (i, j, k),
    /// member m owning triples [member_offsets[m], member_offsets[m+1]). Any order, duplicates allowed
    /// (removed), every int32 value allowed. `member_offsets` (host, B+1 entries, non-decreasing, from 0)
    /// defines the batch size B >= 1; `transforms` has B entries or is empty (unit voxels at the origin).
    /// Cost: one sort of the keys; 1 sync (offsets and box), 2 when a coordinate lies outside
    /// [-2^(L-1), 2^(L-1)), L = min(21, (63 - ceil(log2 B)) / 3), e.g. |c| >= 2^18 for 16 members.
    static GridBatch from_ijk(Span<const int32_t> ijk, const std::vector<int64_t>& member_offsets,
                              const std::vector<MemberTransform>& transforms = {}, const Context& ctx = {});
    /// Host convenience: one coordinate list per member.
    static GridBatch from_ijk(const std::vector<std::vector<Vec3i>>& members,
                              const std::vector<MemberTransform>& transforms = {}, const Context& ctx = {});

    /// From world points (x, y, z) in ctx.device memory, laid out like from_ijk's ijk: the grid of every
    /// voxel that contains at least one point, i.e. ijk = floor((xyz - origin) / voxel_size + 1/2).
    /// `transforms` must have one entry per member. Points must be finite and map into int32 range.
    /// Cost: from_ijk's, plus 1 sync (the point check).
    static GridBatch from_points(Span<const double> xyz, const std::vector<int64_t>& member_offsets,
                                 const std::vector<MemberTransform>& transforms, const Context& ctx = {});
    static GridBatch from_points(const std::vector<std::vector<Vec3d>>& members,
                                 const std::vector<MemberTransform>& transforms, const Context& ctx = {});

    /// From triangle meshes: every voxel whose closed cube meets a triangle (exact separating-axis test,
    /// so thin features are never missed; degenerate triangles voxelise as segments or points).
    /// `vertices` (ctx.device memory) holds world points (x, y, z), member m's in
    /// [vertex_offsets[m], vertex_offsets[m+1]); `faces` (ctx.device memory) holds vertex index triples
    /// local to their member, member m's in [face_offsets[m], face_offsets[m+1]). One transform per
    /// member. Raises Error for a face index outside its member's vertices, a vertex that is not finite
    /// (after the transform), voxel indices outside int32 and 2^63 - 1 or more candidate voxels (the
    /// voxels of every triangle's bounding box); with several bad faces, the smallest face with a bad
    /// index, else the smallest with a bad vertex, on every backend. CPU and CUDA give the same voxels.
    /// Cost: work proportional to the candidate voxels; CUDA: 2 syncs (the hit count with the checks,
    /// then the member offsets), none for a batch without faces.
    static GridBatch from_mesh(Span<const double> vertices, const std::vector<int64_t>& vertex_offsets,
                               Span<const int32_t> faces, const std::vector<int64_t>& face_offsets,
                               const std::vector<MemberTransform>& transforms, const Context& ctx = {});

    // ---------------------------------------------------------------------------------------------
    // Accessors (host-side metadata never syncs)
    // ---------------------------------------------------------------------------------------------

    int64_t batch_size() const;
    int64_t num_voxels() const;
    int64_t num_voxels(int64_t member) const;
    /// Host copy of the member offsets, B+1 entries: member m owns voxels [offsets[m], offsets[m+1]).
    const std::vector<int64_t>& voxel_offsets() const;
    /// The same offsets on device().
    const Buffer<int64_t>& voxel_offsets_buffer() const;
    /// Coordinates, num_voxels() x 3 int32, row-major, in voxel order, on device().
    const Buffer<int32_t>& ijk() const;
    /// ijk() copied to the host as triples (syncs on CUDA).
    std::vector<Vec3i> ijk_host() const;
    /// The smallest box containing every voxel of the batch (the empty box for no voxels); equal on
    /// every backend.
    const CoordBox& coordinate_box() const;

    Device device() const;
    const Context& context() const;

    const std::vector<MemberTransform>& transforms() const;
    const Vec3d& voxel_size(int64_t member) const;
    const Vec3d& origin(int64_t member) const;
    /// World position of (possibly fractional) index coordinates of member `member`.
    Vec3d index_to_world(int64_t member, const Vec3d& ijk) const;
    /// Continuous index coordinates of a world position; the containing voxel is floor(result + 1/2).
    Vec3d world_to_index(int64_t member, const Vec3d& xyz) const;

    /// For each query coordinate (ijk triples on device(), member m's queries in
    /// [query_offsets[m], query_offsets[m+1])): the global voxel index of that coordinate in member m,
    /// or -1. Cost: builds a lookup table over this grid, 1 launch per query batch, no sync.
    Buffer<int64_t> ijk_to_index(Span<const int32_t> query_ijk, const std::vector<int64_t>& query_offsets) const;
    std::vector<int64_t> ijk_to_index(const std::vector<std::vector<Vec3i>>& queries) const;

    // ---------------------------------------------------------------------------------------------
    // Topology operations. Each runs over the whole batch at once, returns a new grid in voxel order
    // and never changes this one. Members never interact; empty members stay empty.
    // Per axis a: pb = (kernel_size[a] - 1) / 2, and the edge relation is fine = S*coarse + tap - pb,
    // 0 <= tap < kernel_size[a].
    // ---------------------------------------------------------------------------------------------

    /// Output of a strided convolution: every c with S*c + tap - pb in this grid for some tap.
    /// Transform: voxel size S*h, origin unchanged.
    GridBatch conv_grid(const Vec3i& kernel_size, const Vec3i& stride) const;
    GridBatch conv_grid(int32_t kernel_size, int32_t stride) const;

    /// Output of a generative transposed convolution: {S*c + tap - pb : c in grid, every tap}.
    /// Transform: voxel size h/S, origin unchanged.
    GridBatch conv_transpose_grid(const Vec3i& kernel_size, const Vec3i& stride) const;
    GridBatch conv_transpose_grid(int32_t kernel_size, int32_t stride) const;

    /// Grids derived from this one, built together: levels[l] is conv_grid(kernel_size, stride) applied
    /// l + 1 times (l < levels), coarsened[i] is coarsened_grid(coarsening_factors[i]), each equal to what
    /// those calls return (voxels, order, transforms). Every level comes straight from this grid (with
    /// K >= S on every axis, l + 1 strided convolutions are one, of kernel S^l (K - 1) + ... + K and stride
    /// S^(l+1)), so the whole pyramid of an encoder and the coarse targets of a decoder cost one pass.
    /// Cost: CUDA: 1 sync for all (each call replaced takes 1); with K < S on some axis the levels are
    /// built one from the other, 1 sync each.
    GridPyramid pyramid(const Vec3i& kernel_size, const Vec3i& stride, int32_t levels,
                        const std::vector<Vec3i>& coarsening_factors = {}) const;

    /// floor(ijk / factor). Transform: voxel size f*h, origin o + (f-1)*h/2.
    GridBatch coarsened_grid(const Vec3i& factor) const;
    GridBatch coarsened_grid(int32_t factor) const;

    /// Each kept voxel c becomes the block f*c + [0, f)^3. `mask` (on device(), one byte per voxel,
    /// nonzero = keep) may be empty to keep all. Transform: voxel size h/f, origin o - (f-1)*h'/2.
    GridBatch refined_grid(const Vec3i& factor, Span<const uint8_t> mask = {}) const;
    GridBatch refined_grid(int32_t factor, Span<const uint8_t> mask = {}) const;

    /// The largest dilation distance: the ball's kernel (2d + 1)^3 must have fewer than 2^31 taps.
    static constexpr int32_t max_dilation_distance = 645;

    /// Every voxel within Chebyshev distance `distance` (0..max_dilation_distance) of a voxel of this grid.
    GridBatch dilated_grid(int32_t distance) const;

    /// The voxels whose mask byte (on device(), one per voxel) is nonzero, order preserved.
    /// Cost: CUDA: 5 launches, 1 sync (the member offsets), 1 launch (the kept voxels).
    GridBatch pruned_grid(Span<const uint8_t> mask) const;
    /// pruned_grid(mask) and, for every kept voxel, its index in this grid (increasing): kept features
    /// follow as old[kept_index], with no further sync. Cost: CUDA: as pruned_grid, 1 sync.
    SelectedGrid pruned_grid_with_index(Span<const uint8_t> mask) const;

    /// Per-member union with `other` (same batch size, device and transforms, exactly equal).
    GridBatch merged_grid(const GridBatch& other) const;

    /// The voxels of each member m inside the inclusive box [ijk_min[m], ijk_max[m]], in their order, with
    /// the transforms unchanged. `ijk_min` and `ijk_max` hold one coordinate per member, or one for all;
    /// a box with ijk_min[a] > ijk_max[a] on some axis keeps nothing. The result also holds, for every
    /// kept voxel, its index in this grid (increasing), so that features follow: kept = old[kept_index].
    /// Cost: CUDA: 5 launches, 1 sync (the member offsets), 1 launch (the kept voxels).
    ClippedGrid clipped_grid(const std::vector<Vec3i>& ijk_min, const std::vector<Vec3i>& ijk_max) const;

    // ---------------------------------------------------------------------------------------------
    // Queries
    // ---------------------------------------------------------------------------------------------

    /// Per-member inclusive bounds of the voxels: batch_size() x 6 int32 on device(), row m holding
    /// (lo_i, lo_j, lo_k, hi_i, hi_j, hi_k) of member m; an empty member holds the empty box
    /// (0, 0, 0, -1, -1, -1), so hi < lo marks it. Equal on every backend. Cost: CUDA: 2 launches, no sync.
    Buffer<int32_t> bbox() const;
    /// bbox() on the host, one CoordBox per member (CoordBox::empty() for empty members; syncs on CUDA).
    std::vector<CoordBox> bbox_host() const;

    /// Internal storage, for backends.
    const detail::GridStorage& storage() const { return *m_storage; }
    explicit GridBatch(std::shared_ptr<const detail::GridStorage> storage);

private:
    std::shared_ptr<const detail::GridStorage> m_storage;
};

/// The grids of GridBatch::pyramid.
struct GridPyramid {
    std::vector<GridBatch> levels;
    std::vector<GridBatch> coarsened;
};

/// A grid selected from another (pruned or clipped) and, for each of its voxels, the index of the same
/// voxel in the grid it was selected from (int64 on the grid's device).
struct SelectedGrid {
    GridBatch grid;
    Buffer<int64_t> kept_index;
};

}  // namespace sparsegrid
