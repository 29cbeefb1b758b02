// torch.classes.sparsegrid.GridBatch: a GridBatch held by TorchScript. Every method checks its tensors,
// guards the grid's device, orders the call with PyTorch's current stream (CoreScope) and calls the
// core once; the costs (launches, syncs) are the core's (include/sparsegrid/grid_batch.h) unless a
// comment says otherwise. Tensors returned live on the grid's device.
#pragma once

#include <sparsegrid/grid_batch.h>

#include <torch/custom_class.h>
#include <torch/torch.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace sparsegrid_torch {

struct GridBatchHolder : torch::CustomClassHolder {
    sparsegrid::GridBatch grid;
    explicit GridBatchHolder(sparsegrid::GridBatch g) : grid(std::move(g)) {}

    using Ptr = c10::intrusive_ptr<GridBatchHolder>;
    static Ptr wrap(sparsegrid::GridBatch g) { return c10::make_intrusive<GridBatchHolder>(std::move(g)); }

    // ---- constructors ----

    /// From ijk [N, 3] int32 on the grid's device (CPU or CUDA), member offsets [B+1] int64 and voxel
    /// sizes and origins [B, 3] float64 (CPU, or ijk's device at the cost of a sync). The grid lives
    /// on ijk's device and runs on its current stream.
    static Ptr from_ijk(torch::Tensor ijk, torch::Tensor offsets, torch::Tensor voxel_sizes, torch::Tensor origins);
    /// From world points [N, 3] float64: the voxels containing at least one point (see
    /// GridBatch::from_points), on the points' device.
    static Ptr from_points(torch::Tensor xyz, torch::Tensor offsets, torch::Tensor voxel_sizes, torch::Tensor origins);
    /// From triangle meshes: vertices [V, 3] float64 and faces [F, 3] int32 (member-local indices, on
    /// the vertices' device) with their member offsets (see GridBatch::from_mesh for the devices the
    /// core voxelises on).
    static Ptr from_mesh(torch::Tensor vertices, torch::Tensor vertex_offsets, torch::Tensor faces,
                         torch::Tensor face_offsets, torch::Tensor voxel_sizes, torch::Tensor origins);

    // ---- accessors (no sync) ----

    int64_t batch_size() const { return grid.batch_size(); }
    int64_t num_voxels() const { return grid.num_voxels(); }
    c10::Device device() const;
    /// Coordinates [N, 3] int32 on the grid's device (a view of the grid's memory: do not write).
    torch::Tensor ijk() const;
    /// Member offsets [B+1] int64 on the grid's device (a view of the grid's memory).
    torch::Tensor offsets() const;
    /// [B, 3] float64 on the grid's device (built from host metadata: an upload on CUDA, no sync).
    torch::Tensor voxel_sizes() const;
    torch::Tensor origins() const;

    /// The same grid on `target` ("cuda" = the current CUDA device): the voxels are copied and the
    /// grid rebuilt there (same voxels, same order, same transforms). Cost: one copy, plus
    /// from_ijk's sort and syncs on a CUDA target.
    Ptr to(c10::Device target) const;

    // ---- topology operations (per-axis values: 1 or 3 entries) ----

    Ptr conv_grid(std::vector<int64_t> kernel_size, std::vector<int64_t> stride) const;
    Ptr conv_transpose_grid(std::vector<int64_t> kernel_size, std::vector<int64_t> stride) const;
    Ptr coarsened_grid(std::vector<int64_t> factor) const;
    /// GridBatch::pyramid: the levels, then the coarsened grids, in one list. coarsening_factors holds
    /// 3 entries per factor.
    std::vector<Ptr> pyramid(std::vector<int64_t> kernel_size, std::vector<int64_t> stride, int64_t levels,
                             std::vector<int64_t> coarsening_factors) const;
    /// `mask`: one entry per voxel on the grid's device, nonzero = refine (any dtype); none = all.
    Ptr refined_grid(std::vector<int64_t> factor, c10::optional<torch::Tensor> mask) const;
    /// `distance` must fit int32; its range is the core's to check.
    Ptr dilated_grid(int64_t distance) const;
    /// `mask`: one bool or uint8 entry per voxel on the grid's device, nonzero = keep.
    Ptr pruned_grid(torch::Tensor mask) const;
    /// pruned_grid and the index of each kept voxel in this grid: (grid, kept_index [N_kept] int64 on the
    /// grid's device, increasing), so that features follow as features.index_select(0, kept_index)
    /// without the host synchronisation of boolean indexing. Cost: the core's (on CUDA one sync).
    std::tuple<Ptr, torch::Tensor> pruned_grid_with_index(torch::Tensor mask) const;
    Ptr merged_grid(Ptr other) const;
    /// The voxels of each member inside the inclusive box [ijk_min, ijk_max], in their order, and the
    /// index of each in this grid: (grid, kept_index [N_kept] int64 on the grid's device), so that
    /// features follow as features[kept_index]. `ijk_min` and `ijk_max`: integer tensors [3] (one box
    /// for every member) or [B, 3], host metadata on any device (a CUDA one costs a sync each). Cost:
    /// the core's (on CUDA one sync, the member offsets).
    std::tuple<Ptr, torch::Tensor> clipped_grid(torch::Tensor ijk_min, torch::Tensor ijk_max) const;

    // ---- queries ----

    /// Global voxel index [Q] int64 of each query [Q, 3] int32 (on the grid's device) in its member
    /// (query_offsets [B+1] int64, host metadata), or -1.
    torch::Tensor ijk_to_index(torch::Tensor query, torch::Tensor query_offsets) const;
    /// Per-member inclusive bounds [B, 2, 3] int32 on the grid's device: [m, 0] = lo, [m, 1] = hi; an
    /// empty member holds lo = (0, 0, 0), hi = (-1, -1, -1). No host sync.
    torch::Tensor bbox() const;
};

}  // namespace sparsegrid_torch
