// torch.classes.sparsegrid.GridBatch (grid_binding.h).
#include "grid_binding.h"

#include "torch_runtime.h"

#include <utility>

namespace sparsegrid_torch {

namespace {

std::vector<int64_t> offsets_vector(const torch::Tensor& offsets, const torch::Tensor& data, const char* op,
                                    const char* name = "offsets") {
    check_tensor(offsets, op, name, torch::kInt64, 1);
    const torch::Tensor host = host_metadata(offsets, data, op, name);
    return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

std::vector<sparsegrid::MemberTransform> transforms_of(const torch::Tensor& voxel_sizes, const torch::Tensor& origins,
                                                       const torch::Tensor& data, int64_t batch_size, const char* op) {
    check_tensor(voxel_sizes, op, "voxel_sizes", torch::kFloat64, 2);
    check_tensor(origins, op, "origins", torch::kFloat64, 2);
    for (const auto& [t, name] : {std::pair{voxel_sizes, "voxel_sizes"}, std::pair{origins, "origins"}})
        if (t.size(0) != batch_size || t.size(1) != 3)
            fail(op, ": ", name, " must have shape [", batch_size, ", 3], got [", t.size(0), ", ", t.size(1), "]");
    const torch::Tensor h = host_metadata(voxel_sizes, data, op, "voxel_sizes");
    const torch::Tensor o = host_metadata(origins, data, op, "origins");
    std::vector<sparsegrid::MemberTransform> out(static_cast<size_t>(batch_size));
    for (int64_t m = 0; m < batch_size; ++m)
        for (int a = 0; a < 3; ++a) {
            out[m].voxel_size[a] = h.data_ptr<double>()[3 * m + a];
            out[m].origin[a] = o.data_ptr<double>()[3 * m + a];
        }
    return out;
}

/// One byte per voxel, nonzero = selected, on the grid's device: bool or uint8 only (a float mask would be
/// thresholded silently).
torch::Tensor mask_bytes(const torch::Tensor& mask, const sparsegrid::GridBatch& grid, const char* op) {
    if (mask.scalar_type() != torch::kBool && mask.scalar_type() != torch::kUInt8)
        fail(op, ": mask must be bool or uint8, got ", c10::toString(mask.scalar_type()));
    if (mask.dim() != 1) fail(op, ": mask must have 1 dimension, got ", mask.dim());
    check_device(mask, grid.device(), op, "mask");
    // A bool tensor's bytes are 0 or 1: viewed as uint8 they need no conversion kernel.
    const torch::Tensor contiguous = mask.contiguous();
    return contiguous.scalar_type() == torch::kBool ? contiguous.view(torch::kUInt8) : contiguous;
}

/// [B, 3] float64 voxel sizes (sizes = true) or origins on the grid's device.
torch::Tensor transform_tensor(const sparsegrid::GridBatch& grid, bool sizes) {
    torch::Tensor out = torch::empty({grid.batch_size(), 3}, torch::dtype(torch::kFloat64));
    for (int64_t m = 0; m < grid.batch_size(); ++m)
        for (int a = 0; a < 3; ++a)
            out.data_ptr<double>()[3 * m + a] = sizes ? grid.voxel_size(m)[a] : grid.origin(m)[a];
    return out.to(torch_device(grid.device()));
}

}  // namespace

// ---- constructors ----------------------------------------------------------------------------------

GridBatchHolder::Ptr GridBatchHolder::from_ijk(torch::Tensor ijk, torch::Tensor offsets, torch::Tensor voxel_sizes,
                                               torch::Tensor origins) {
    constexpr const char* op = "GridBatch.from_ijk";
    check_tensor(ijk, op, "ijk", torch::kInt32, 2);
    if (ijk.size(1) != 3) fail(op, ": ijk must have shape [N, 3], got [", ijk.size(0), ", ", ijk.size(1), "]");
    const std::vector<int64_t> offsets_host = offsets_vector(offsets, ijk, op);
    const std::vector<sparsegrid::MemberTransform> transforms = transforms_of(
        voxel_sizes, origins, ijk, static_cast<int64_t>(offsets_host.size()) - 1, op);
    const torch::Tensor contiguous = ijk.contiguous();
    const sparsegrid::Context ctx = context_of(ijk, op, "ijk");
    const CoreScope scope(ctx);
    return wrap(sparsegrid::GridBatch::from_ijk(
        sparsegrid::Span<const int32_t>(contiguous.data_ptr<int32_t>(), contiguous.numel()), offsets_host, transforms,
        ctx));
}

GridBatchHolder::Ptr GridBatchHolder::from_points(torch::Tensor xyz, torch::Tensor offsets, torch::Tensor voxel_sizes,
                                                  torch::Tensor origins) {
    constexpr const char* op = "GridBatch.from_points";
    check_tensor(xyz, op, "xyz", torch::kFloat64, 2);
    if (xyz.size(1) != 3) fail(op, ": xyz must have shape [N, 3], got [", xyz.size(0), ", ", xyz.size(1), "]");
    const std::vector<int64_t> offsets_host = offsets_vector(offsets, xyz, op);
    const std::vector<sparsegrid::MemberTransform> transforms = transforms_of(
        voxel_sizes, origins, xyz, static_cast<int64_t>(offsets_host.size()) - 1, op);
    const torch::Tensor contiguous = xyz.contiguous();
    const sparsegrid::Context ctx = context_of(xyz, op, "xyz");
    const CoreScope scope(ctx);
    return wrap(sparsegrid::GridBatch::from_points(
        sparsegrid::Span<const double>(contiguous.data_ptr<double>(), contiguous.numel()), offsets_host, transforms,
        ctx));
}

GridBatchHolder::Ptr GridBatchHolder::from_mesh(torch::Tensor vertices, torch::Tensor vertex_offsets,
                                                torch::Tensor faces, torch::Tensor face_offsets,
                                                torch::Tensor voxel_sizes, torch::Tensor origins) {
    constexpr const char* op = "GridBatch.from_mesh";
    check_tensor(vertices, op, "vertices", torch::kFloat64, 2);
    check_tensor(faces, op, "faces", torch::kInt32, 2);
    if (vertices.size(1) != 3 || faces.size(1) != 3) fail(op, ": vertices and faces must have shape [N, 3]");
    if (faces.device() != vertices.device())
        fail(op, ": faces is on ", faces.device().str(), " but vertices is on ", vertices.device().str(),
             "; give both on the same device");
    const std::vector<int64_t> vertex_offsets_host = offsets_vector(vertex_offsets, vertices, op, "vertex_offsets");
    const std::vector<int64_t> face_offsets_host = offsets_vector(face_offsets, vertices, op, "face_offsets");
    const std::vector<sparsegrid::MemberTransform> transforms = transforms_of(
        voxel_sizes, origins, vertices, static_cast<int64_t>(face_offsets_host.size()) - 1, op);
    const torch::Tensor v = vertices.contiguous(), f = faces.contiguous();
    const sparsegrid::Context ctx = context_of(vertices, op, "vertices");
    const CoreScope scope(ctx);
    return wrap(sparsegrid::GridBatch::from_mesh(
        sparsegrid::Span<const double>(v.data_ptr<double>(), v.numel()), vertex_offsets_host,
        sparsegrid::Span<const int32_t>(f.data_ptr<int32_t>(), f.numel()), face_offsets_host, transforms, ctx));
}

// ---- accessors -------------------------------------------------------------------------------------

c10::Device GridBatchHolder::device() const { return torch_device(grid.device()); }

torch::Tensor GridBatchHolder::ijk() const { return tensor_of(grid.ijk(), {grid.num_voxels(), 3}, torch::kInt32); }

torch::Tensor GridBatchHolder::offsets() const {
    return tensor_of(grid.voxel_offsets_buffer(), {grid.batch_size() + 1}, torch::kInt64);
}

torch::Tensor GridBatchHolder::voxel_sizes() const { return transform_tensor(grid, true); }

torch::Tensor GridBatchHolder::origins() const { return transform_tensor(grid, false); }

GridBatchHolder::Ptr GridBatchHolder::to(c10::Device target) const {
    constexpr const char* op = "GridBatch.to";
    target = concrete_device(target);
    if (target == device()) return wrap(grid);
    const torch::Tensor moved = ijk().to(target).contiguous();
    const sparsegrid::Context ctx = context_of(moved, op, "device");
    const CoreScope scope(ctx);
    return wrap(
        sparsegrid::GridBatch::from_ijk(sparsegrid::Span<const int32_t>(moved.data_ptr<int32_t>(), moved.numel()),
                                        grid.voxel_offsets(), grid.transforms(), ctx));
}

// ---- topology operations ---------------------------------------------------------------------------

GridBatchHolder::Ptr GridBatchHolder::conv_grid(std::vector<int64_t> kernel_size, std::vector<int64_t> stride) const {
    constexpr const char* op = "conv_grid";
    const Vec3i kernel = triple(kernel_size, op, "kernel_size"), step = triple(stride, op, "stride");
    const CoreScope scope(grid.context());
    return wrap(grid.conv_grid(kernel, step));
}

GridBatchHolder::Ptr GridBatchHolder::conv_transpose_grid(std::vector<int64_t> kernel_size,
                                                          std::vector<int64_t> stride) const {
    constexpr const char* op = "conv_transpose_grid";
    const Vec3i kernel = triple(kernel_size, op, "kernel_size"), step = triple(stride, op, "stride");
    const CoreScope scope(grid.context());
    return wrap(grid.conv_transpose_grid(kernel, step));
}

GridBatchHolder::Ptr GridBatchHolder::coarsened_grid(std::vector<int64_t> factor) const {
    const Vec3i f = triple(factor, "coarsened_grid", "factor");
    const CoreScope scope(grid.context());
    return wrap(grid.coarsened_grid(f));
}

std::vector<GridBatchHolder::Ptr> GridBatchHolder::pyramid(std::vector<int64_t> kernel_size,
                                                           std::vector<int64_t> stride, int64_t levels,
                                                           std::vector<int64_t> coarsening_factors) const {
    constexpr const char* op = "pyramid";
    const Vec3i kernel = triple(kernel_size, op, "kernel_size"), step = triple(stride, op, "stride");
    if (levels < 0 || levels > INT32_MAX) fail(op, ": levels must be in [0, 2^31), got ", levels);
    if (coarsening_factors.size() % 3 != 0)
        fail(op, ": coarsening_factors must hold 3 entries per factor, got ", coarsening_factors.size());
    std::vector<Vec3i> factors;
    for (size_t i = 0; i < coarsening_factors.size(); i += 3)
        factors.push_back(triple(std::vector<int64_t>(coarsening_factors.begin() + static_cast<std::ptrdiff_t>(i),
                                                      coarsening_factors.begin() + static_cast<std::ptrdiff_t>(i + 3)),
                                 op, "coarsening factor"));
    const CoreScope scope(grid.context());
    const sparsegrid::GridPyramid built = grid.pyramid(kernel, step, static_cast<int32_t>(levels), factors);
    std::vector<Ptr> out;
    for (const auto* grids : {&built.levels, &built.coarsened})
        for (const sparsegrid::GridBatch& g : *grids) out.push_back(wrap(g));
    return out;
}

GridBatchHolder::Ptr GridBatchHolder::refined_grid(std::vector<int64_t> factor,
                                                   c10::optional<torch::Tensor> mask) const {
    constexpr const char* op = "refined_grid";
    const Vec3i f = triple(factor, op, "factor");
    if (!mask) {
        const CoreScope scope(grid.context());
        return wrap(grid.refined_grid(f));
    }
    const torch::Tensor m = mask_bytes(*mask, grid, op);
    const CoreScope scope(grid.context());
    return wrap(grid.refined_grid(f, sparsegrid::Span<const uint8_t>(m.data_ptr<uint8_t>(), m.numel())));
}

GridBatchHolder::Ptr GridBatchHolder::dilated_grid(int64_t distance) const {
    if (distance < INT32_MIN || distance > INT32_MAX) fail("dilated_grid: distance must fit int32, got ", distance);
    const CoreScope scope(grid.context());
    return wrap(grid.dilated_grid(static_cast<int32_t>(distance)));
}

GridBatchHolder::Ptr GridBatchHolder::pruned_grid(torch::Tensor mask) const {
    const torch::Tensor m = mask_bytes(mask, grid, "pruned_grid");
    const CoreScope scope(grid.context());
    return wrap(grid.pruned_grid(sparsegrid::Span<const uint8_t>(m.data_ptr<uint8_t>(), m.numel())));
}

std::tuple<GridBatchHolder::Ptr, torch::Tensor> GridBatchHolder::pruned_grid_with_index(torch::Tensor mask) const {
    const torch::Tensor m = mask_bytes(mask, grid, "pruned_grid");
    const CoreScope scope(grid.context());
    sparsegrid::SelectedGrid pruned = grid.pruned_grid_with_index(
        sparsegrid::Span<const uint8_t>(m.data_ptr<uint8_t>(), m.numel()));
    torch::Tensor kept_index = tensor_of(pruned.kept_index, {pruned.kept_index.size()}, torch::kInt64);
    return {wrap(std::move(pruned.grid)), std::move(kept_index)};
}

GridBatchHolder::Ptr GridBatchHolder::merged_grid(Ptr other) const {
    if (other->grid.device() != grid.device())
        fail("merged_grid: other is on ", other->grid.device().str(), " but the grid is on ", grid.device().str(),
             "; move it there first (.to(\"", grid.device().str(), "\"))");
    const CoreScope scope(grid.context()), other_scope(other->grid.context());
    return wrap(grid.merged_grid(other->grid));
}

std::tuple<GridBatchHolder::Ptr, torch::Tensor> GridBatchHolder::clipped_grid(torch::Tensor ijk_min,
                                                                              torch::Tensor ijk_max) const {
    constexpr const char* op = "clipped_grid";
    const std::vector<Vec3i> lo = host_coordinates(ijk_min, op, "ijk_min");
    const std::vector<Vec3i> hi = host_coordinates(ijk_max, op, "ijk_max");
    const CoreScope scope(grid.context());
    sparsegrid::SelectedGrid clipped = grid.clipped_grid(lo, hi);
    torch::Tensor kept_index = tensor_of(clipped.kept_index, {clipped.kept_index.size()}, torch::kInt64);
    return {wrap(std::move(clipped.grid)), std::move(kept_index)};
}

// ---- queries ---------------------------------------------------------------------------------------

torch::Tensor GridBatchHolder::ijk_to_index(torch::Tensor query, torch::Tensor query_offsets) const {
    constexpr const char* op = "GridBatch.ijk_to_index";
    check_tensor(query, op, "query", torch::kInt32, 2);
    if (query.size(1) != 3) fail(op, ": query must have shape [Q, 3], got [", query.size(0), ", ", query.size(1), "]");
    check_device(query, grid.device(), op, "query");
    const std::vector<int64_t> offsets_host = offsets_vector(query_offsets, query, op, "query_offsets");
    const torch::Tensor q = query.contiguous();
    const CoreScope scope(grid.context());
    const sparsegrid::Buffer<int64_t> result = grid.ijk_to_index(
        sparsegrid::Span<const int32_t>(q.data_ptr<int32_t>(), q.numel()), offsets_host);
    return tensor_of(result, {q.size(0)}, torch::kInt64);
}

torch::Tensor GridBatchHolder::bbox() const {
    const CoreScope scope(grid.context());
    return tensor_of(grid.bbox(), {grid.batch_size(), 2, 3}, torch::kInt32);
}

}  // namespace sparsegrid_torch
