// The PyTorch layer: TorchScript classes wrapping GridBatch and ConvolutionPlan, registered with
// TORCH_LIBRARY so that they are usable from C++ (LibTorch) and Python (torch.classes.sparsegrid).
// Thin by design: check tensors, route memory through PyTorch's allocator, call the core.
#include <sparsegrid/convolution.h>
#include <sparsegrid/grid_batch.h>
#include <sparsegrid/kernel_map.h>
#include <sparsegrid/mesh_io.h>
#include <sparsegrid/shapes.h>

#include <c10/core/CPUAllocator.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <sstream>
#include <string>
#include <vector>

namespace sparsegrid_torch {

using sparsegrid::Vec3i;

namespace {

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
    std::ostringstream message;
    (message << ... << parts);
    throw sparsegrid::Error(message.str());
}

/// Host memory of the core through PyTorch's CPU allocator.
class TorchCpuAllocator final : public sparsegrid::Allocator {
public:
    void* allocate(std::size_t bytes, sparsegrid::Device, void*) override {
        return bytes == 0 ? nullptr : c10::GetCPUAllocator()->raw_allocate(bytes);
    }
    void deallocate(void* ptr, std::size_t, sparsegrid::Device, void*) noexcept override {
        if (ptr) c10::GetCPUAllocator()->raw_deallocate(ptr);
    }
};

sparsegrid::Context context_of(const torch::Tensor& tensor, const char* op, const char* name) {
    if (!tensor.device().is_cpu())
        fail(op, ": ", name, " is on ", tensor.device().str(),
             "; this version of the PyTorch layer runs on CPU tensors only");
    static TorchCpuAllocator allocator;
    sparsegrid::Context ctx;
    ctx.allocator = &allocator;
    return ctx;
}

void check_tensor(const torch::Tensor& t, const char* op, const char* name, torch::ScalarType dtype, int64_t dim) {
    if (t.scalar_type() != dtype)
        fail(op, ": ", name, " must have dtype ", c10::toString(dtype), ", got ", c10::toString(t.scalar_type()));
    if (t.dim() != dim) fail(op, ": ", name, " must have ", dim, " dimensions, got ", t.dim());
}

Vec3i triple(const std::vector<int64_t>& values, const char* op, const char* name) {
    if (values.size() == 1) return {static_cast<int32_t>(values[0]), static_cast<int32_t>(values[0]),
                                    static_cast<int32_t>(values[0])};
    if (values.size() != 3) fail(op, ": ", name, " must have 1 or 3 entries, got ", values.size());
    for (int64_t v : values)
        if (v < INT32_MIN || v > INT32_MAX) fail(op, ": ", name, " entries must fit int32, got ", v);
    return {static_cast<int32_t>(values[0]), static_cast<int32_t>(values[1]), static_cast<int32_t>(values[2])};
}

/// A tensor view of a core buffer; the tensor keeps the buffer alive.
template <typename T>
torch::Tensor tensor_of(const sparsegrid::Buffer<T>& buffer, std::vector<int64_t> shape, torch::ScalarType dtype) {
    auto keep = std::make_shared<sparsegrid::Buffer<T>>(buffer);
    if (buffer.size() == 0) return torch::empty(shape, torch::dtype(dtype));
    return torch::from_blob(buffer.data(), shape, [keep](void*) mutable { keep.reset(); }, torch::dtype(dtype));
}

torch::ScalarType scalar_type_of(const torch::Tensor& t, const char* op, const char* name) {
    if (t.scalar_type() != torch::kFloat32 && t.scalar_type() != torch::kFloat64)
        fail(op, ": ", name, " must be float32 or float64, got ", c10::toString(t.scalar_type()));
    return t.scalar_type();
}

/// Nanoseconds spent executing convolutions (forward and both backward passes), process-wide: lets a
/// training loop split its step time without a profiler.
std::atomic<int64_t> g_convolution_nanoseconds{0};

class ConvolutionTimer {
public:
    ConvolutionTimer() : m_start(std::chrono::steady_clock::now()) {}
    ~ConvolutionTimer() {
        g_convolution_nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - m_start)
                                         .count();
    }

private:
    std::chrono::steady_clock::time_point m_start;
};

sparsegrid::DType dtype_of(torch::ScalarType type) {
    return type == torch::kFloat32 ? sparsegrid::DType::Float32 : sparsegrid::DType::Float64;
}

}  // namespace

/// torch.classes.sparsegrid.GridBatch
struct GridBatchHolder : torch::CustomClassHolder {
    sparsegrid::GridBatch grid;
    explicit GridBatchHolder(sparsegrid::GridBatch g) : grid(std::move(g)) {}

    using Ptr = c10::intrusive_ptr<GridBatchHolder>;
    static Ptr wrap(sparsegrid::GridBatch g) { return c10::make_intrusive<GridBatchHolder>(std::move(g)); }

    /// From ijk [N, 3] int32, member offsets [B+1] int64 (CPU), voxel sizes and origins [B, 3] float64.
    static Ptr from_ijk(torch::Tensor ijk, torch::Tensor offsets, torch::Tensor voxel_sizes, torch::Tensor origins) {
        constexpr const char* op = "GridBatch.from_ijk";
        check_tensor(ijk, op, "ijk", torch::kInt32, 2);
        if (ijk.size(1) != 3) fail(op, ": ijk must have shape [N, 3], got [", ijk.size(0), ", ", ijk.size(1), "]");
        const sparsegrid::Context ctx = context_of(ijk, op, "ijk");
        const std::vector<int64_t> offsets_host = offsets_vector(offsets, op);
        const std::vector<sparsegrid::MemberTransform> transforms =
            transforms_of(voxel_sizes, origins, static_cast<int64_t>(offsets_host.size()) - 1, op);
        const torch::Tensor contiguous = ijk.contiguous();
        return wrap(sparsegrid::GridBatch::from_ijk(
            sparsegrid::Span<const int32_t>(contiguous.data_ptr<int32_t>(), contiguous.numel()), offsets_host,
            transforms, ctx));
    }

    /// From world points [N, 3] float64: the voxels containing at least one point (see GridBatch::from_points).
    static Ptr from_points(torch::Tensor xyz, torch::Tensor offsets, torch::Tensor voxel_sizes, torch::Tensor origins) {
        constexpr const char* op = "GridBatch.from_points";
        check_tensor(xyz, op, "xyz", torch::kFloat64, 2);
        if (xyz.size(1) != 3) fail(op, ": xyz must have shape [N, 3], got [", xyz.size(0), ", ", xyz.size(1), "]");
        const sparsegrid::Context ctx = context_of(xyz, op, "xyz");
        const std::vector<int64_t> offsets_host = offsets_vector(offsets, op);
        const std::vector<sparsegrid::MemberTransform> transforms =
            transforms_of(voxel_sizes, origins, static_cast<int64_t>(offsets_host.size()) - 1, op);
        const torch::Tensor contiguous = xyz.contiguous();
        return wrap(sparsegrid::GridBatch::from_points(
            sparsegrid::Span<const double>(contiguous.data_ptr<double>(), contiguous.numel()), offsets_host,
            transforms, ctx));
    }

    /// From triangle meshes: vertices [V, 3] float64 and faces [F, 3] int32 (member-local indices) with
    /// their member offsets (see GridBatch::from_mesh).
    static Ptr from_mesh(torch::Tensor vertices, torch::Tensor vertex_offsets, torch::Tensor faces,
                         torch::Tensor face_offsets, torch::Tensor voxel_sizes, torch::Tensor origins) {
        constexpr const char* op = "GridBatch.from_mesh";
        check_tensor(vertices, op, "vertices", torch::kFloat64, 2);
        check_tensor(faces, op, "faces", torch::kInt32, 2);
        if (vertices.size(1) != 3 || faces.size(1) != 3) fail(op, ": vertices and faces must have shape [N, 3]");
        const sparsegrid::Context ctx = context_of(vertices, op, "vertices");
        context_of(faces, op, "faces");
        const std::vector<int64_t> vertex_offsets_host = offsets_vector(vertex_offsets, op);
        const std::vector<int64_t> face_offsets_host = offsets_vector(face_offsets, op);
        const std::vector<sparsegrid::MemberTransform> transforms =
            transforms_of(voxel_sizes, origins, static_cast<int64_t>(face_offsets_host.size()) - 1, op);
        const torch::Tensor v = vertices.contiguous(), f = faces.contiguous();
        return wrap(sparsegrid::GridBatch::from_mesh(
            sparsegrid::Span<const double>(v.data_ptr<double>(), v.numel()), vertex_offsets_host,
            sparsegrid::Span<const int32_t>(f.data_ptr<int32_t>(), f.numel()), face_offsets_host, transforms, ctx));
    }

    static std::vector<int64_t> offsets_vector(const torch::Tensor& offsets, const char* op) {
        check_tensor(offsets, op, "offsets", torch::kInt64, 1);
        const torch::Tensor host = offsets.to(torch::kCPU).contiguous();
        return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
    }

    static std::vector<sparsegrid::MemberTransform> transforms_of(const torch::Tensor& voxel_sizes,
                                                                 const torch::Tensor& origins, int64_t batch_size,
                                                                 const char* op) {
        check_tensor(voxel_sizes, op, "voxel_sizes", torch::kFloat64, 2);
        check_tensor(origins, op, "origins", torch::kFloat64, 2);
        for (const auto& [t, name] : {std::pair{voxel_sizes, "voxel_sizes"}, std::pair{origins, "origins"}})
            if (t.size(0) != batch_size || t.size(1) != 3)
                fail(op, ": ", name, " must have shape [", batch_size, ", 3], got [", t.size(0), ", ", t.size(1), "]");
        const torch::Tensor h = voxel_sizes.to(torch::kCPU).contiguous(), o = origins.to(torch::kCPU).contiguous();
        std::vector<sparsegrid::MemberTransform> out(static_cast<size_t>(batch_size));
        for (int64_t m = 0; m < batch_size; ++m)
            for (int a = 0; a < 3; ++a) {
                out[m].voxel_size[a] = h.data_ptr<double>()[3 * m + a];
                out[m].origin[a] = o.data_ptr<double>()[3 * m + a];
            }
        return out;
    }

    int64_t batch_size() const { return grid.batch_size(); }
    int64_t num_voxels() const { return grid.num_voxels(); }
    torch::Tensor ijk() const { return tensor_of(grid.ijk(), {grid.num_voxels(), 3}, torch::kInt32); }
    torch::Tensor offsets() const {
        return torch::tensor(grid.voxel_offsets(), torch::dtype(torch::kInt64));
    }
    torch::Tensor voxel_sizes() const { return transform_tensor(true); }
    torch::Tensor origins() const { return transform_tensor(false); }
    torch::Tensor transform_tensor(bool sizes) const {
        torch::Tensor out = torch::empty({grid.batch_size(), 3}, torch::dtype(torch::kFloat64));
        for (int64_t m = 0; m < grid.batch_size(); ++m)
            for (int a = 0; a < 3; ++a)
                out.data_ptr<double>()[3 * m + a] = sizes ? grid.voxel_size(m)[a] : grid.origin(m)[a];
        return out;
    }

    Ptr conv_grid(std::vector<int64_t> k, std::vector<int64_t> s) const {
        return wrap(grid.conv_grid(triple(k, "conv_grid", "kernel_size"), triple(s, "conv_grid", "stride")));
    }
    Ptr conv_transpose_grid(std::vector<int64_t> k, std::vector<int64_t> s) const {
        return wrap(grid.conv_transpose_grid(triple(k, "conv_transpose_grid", "kernel_size"),
                                             triple(s, "conv_transpose_grid", "stride")));
    }
    Ptr coarsened_grid(std::vector<int64_t> f) const {
        return wrap(grid.coarsened_grid(triple(f, "coarsened_grid", "factor")));
    }
    Ptr refined_grid(std::vector<int64_t> f, c10::optional<torch::Tensor> mask) const {
        const Vec3i factor = triple(f, "refined_grid", "factor");
        if (!mask) return wrap(grid.refined_grid(factor));
        const torch::Tensor m = mask_bytes(*mask, "refined_grid");
        return wrap(grid.refined_grid(factor, sparsegrid::Span<const uint8_t>(m.data_ptr<uint8_t>(), m.numel())));
    }
    Ptr dilated_grid(int64_t distance) const {
        if (distance < 0 || distance > INT32_MAX) fail("dilated_grid: distance must be in [0, 645], got ", distance);
        return wrap(grid.dilated_grid(static_cast<int32_t>(distance)));
    }
    Ptr pruned_grid(torch::Tensor mask) const {
        const torch::Tensor m = mask_bytes(mask, "pruned_grid");
        return wrap(grid.pruned_grid(sparsegrid::Span<const uint8_t>(m.data_ptr<uint8_t>(), m.numel())));
    }
    Ptr merged_grid(Ptr other) const { return wrap(grid.merged_grid(other->grid)); }

    /// Global voxel index of each query [Q, 3] int32 in member q_member[q] (given by offsets [B+1]), or -1.
    torch::Tensor ijk_to_index(torch::Tensor query, torch::Tensor query_offsets) const {
        constexpr const char* op = "GridBatch.ijk_to_index";
        check_tensor(query, op, "query", torch::kInt32, 2);
        if (query.size(1) != 3) fail(op, ": query must have shape [Q, 3], got [", query.size(0), ", ", query.size(1), "]");
        context_of(query, op, "query");
        const torch::Tensor q = query.contiguous();
        const sparsegrid::Buffer<int64_t> result = grid.ijk_to_index(
            sparsegrid::Span<const int32_t>(q.data_ptr<int32_t>(), q.numel()), offsets_vector(query_offsets, op));
        return tensor_of(result, {q.size(0)}, torch::kInt64);
    }

    torch::Tensor mask_bytes(const torch::Tensor& mask, const char* op) const {
        if (mask.dim() != 1) fail(op, ": mask must have 1 dimension, got ", mask.dim());
        context_of(mask, op, "mask");
        return mask.to(torch::kUInt8).contiguous();  // nonzero = keep, whatever the input dtype
    }
};

/// torch.classes.sparsegrid.ConvolutionPlan
struct ConvolutionPlanHolder : torch::CustomClassHolder {
    sparsegrid::ConvolutionPlan plan;
    explicit ConvolutionPlanHolder(sparsegrid::ConvolutionPlan p) : plan(std::move(p)) {}
    using Ptr = c10::intrusive_ptr<ConvolutionPlanHolder>;

    /// transposed = false: forward (strided) convolution; true: transposed convolution. Without a
    /// target the generated grid (conv_grid or conv_transpose_grid) is the target.
    static Ptr make(GridBatchHolder::Ptr source, std::vector<int64_t> k, std::vector<int64_t> s,
                    c10::optional<GridBatchHolder::Ptr> target, bool transposed) {
        const Vec3i kernel = triple(k, "ConvolutionPlan", "kernel_size"), stride = triple(s, "ConvolutionPlan", "stride");
        using sparsegrid::ConvolutionPlan;
        if (transposed)
            return c10::make_intrusive<ConvolutionPlanHolder>(
                target ? ConvolutionPlan::make_transposed(source->grid, (*target)->grid, kernel, stride)
                       : ConvolutionPlan::make_transposed(source->grid, kernel, stride));
        return c10::make_intrusive<ConvolutionPlanHolder>(
            target ? ConvolutionPlan::make(source->grid, (*target)->grid, kernel, stride)
                   : ConvolutionPlan::make(source->grid, kernel, stride));
    }

    Ptr transposed() const { return c10::make_intrusive<ConvolutionPlanHolder>(plan.transposed()); }
    GridBatchHolder::Ptr source_grid() const { return GridBatchHolder::wrap(plan.source_grid()); }
    GridBatchHolder::Ptr target_grid() const { return GridBatchHolder::wrap(plan.target_grid()); }
    bool is_identity() const { return plan.is_identity(); }
    torch::Tensor target_map() const {
        const sparsegrid::KernelMap& map = plan.target_map();
        return tensor_of(map.neighbour_map(), {map.num_target(), map.kernel_volume()}, torch::kInt32);
    }

    /// Weight [Cout, Cin, K0, K1, K2] against the plan's kernel size and the feature channels.
    void check_weight(const torch::Tensor& weight, int64_t in_channels, const char* op) const {
        if (weight.dim() != 5) fail(op, ": weight must have shape [Cout, Cin, K0, K1, K2], got ", weight.dim(), " dimensions");
        const Vec3i& k = plan.kernel_size();
        if (weight.size(1) != in_channels || weight.size(2) != k[0] || weight.size(3) != k[1] || weight.size(4) != k[2])
            fail(op, ": weight must have shape [Cout, ", in_channels, ", ", k[0], ", ", k[1], ", ", k[2], "], got [",
                 weight.size(0), ", ", weight.size(1), ", ", weight.size(2), ", ", weight.size(3), ", ", weight.size(4), "]");
    }

    void check_features(const torch::Tensor& x, int64_t rows, const char* op, const char* name) const {
        if (x.dim() != 2) fail(op, ": ", name, " must have shape [N, C], got ", x.dim(), " dimensions");
        if (x.size(0) != rows) fail(op, ": ", name, " must have ", rows, " rows (one per voxel), got ", x.size(0));
        context_of(x, op, name);
    }

    torch::Tensor forward(torch::Tensor input, torch::Tensor weight) const {
        constexpr const char* op = "ConvolutionPlan.forward";
        const ConvolutionTimer timer;
        check_features(input, plan.source_grid().num_voxels(), op, "input");
        const torch::ScalarType type = scalar_type_of(input, op, "input");
        if (weight.scalar_type() != type) fail(op, ": weight must have the dtype of input (", c10::toString(type), ")");
        check_weight(weight, input.size(1), op);
        const torch::Tensor x = input.contiguous(), w = weight.contiguous();
        torch::Tensor out = torch::empty({plan.target_grid().num_voxels(), w.size(0)}, x.options());
        plan.forward(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.size(1), w.size(0), dtype_of(type));
        return out;
    }

    torch::Tensor backward_input(torch::Tensor grad_output, torch::Tensor weight) const {
        constexpr const char* op = "ConvolutionPlan.backward_input";
        const ConvolutionTimer timer;
        check_features(grad_output, plan.target_grid().num_voxels(), op, "grad_output");
        const torch::ScalarType type = scalar_type_of(grad_output, op, "grad_output");
        if (weight.scalar_type() != type) fail(op, ": weight must have the dtype of grad_output");
        check_weight(weight, weight.size(1), op);
        if (weight.size(0) != grad_output.size(1))
            fail(op, ": grad_output must have ", weight.size(0), " channels, got ", grad_output.size(1));
        const torch::Tensor g = grad_output.contiguous(), w = weight.contiguous();
        torch::Tensor out = torch::empty({plan.source_grid().num_voxels(), w.size(1)}, g.options());
        plan.backward_input(g.data_ptr(), w.data_ptr(), out.data_ptr(), w.size(1), w.size(0), dtype_of(type));
        return out;
    }

    torch::Tensor backward_weight(torch::Tensor input, torch::Tensor grad_output) const {
        constexpr const char* op = "ConvolutionPlan.backward_weight";
        const ConvolutionTimer timer;
        check_features(input, plan.source_grid().num_voxels(), op, "input");
        check_features(grad_output, plan.target_grid().num_voxels(), op, "grad_output");
        const torch::ScalarType type = scalar_type_of(input, op, "input");
        if (grad_output.scalar_type() != type) fail(op, ": grad_output must have the dtype of input");
        const torch::Tensor x = input.contiguous(), g = grad_output.contiguous();
        const Vec3i& k = plan.kernel_size();
        torch::Tensor out = torch::empty({g.size(1), x.size(1), k[0], k[1], k[2]}, x.options());
        plan.backward_weight(x.data_ptr(), g.data_ptr(), out.data_ptr(), x.size(1), g.size(1), dtype_of(type));
        return out;
    }
};

/// Surface voxels of `batch_size` procedural closed shapes at `resolution` (shapes.h): ijk [N, 3] int32
/// and member offsets [B+1] int64, member-major (each member in the generator's order).
std::tuple<torch::Tensor, torch::Tensor> synthetic_surface_batch(int64_t batch_size, int64_t resolution, int64_t seed) {
    if (resolution < 1 || resolution > INT32_MAX) fail("synthetic_surface_batch: resolution must be >= 1, got ", resolution);
    const auto members = sparsegrid::synthetic_surface_batch(batch_size, static_cast<int32_t>(resolution),
                                                             static_cast<uint64_t>(seed));
    std::vector<int64_t> offsets{0};
    for (const auto& member : members) offsets.push_back(offsets.back() + static_cast<int64_t>(member.size()));
    torch::Tensor ijk = torch::empty({offsets.back(), 3}, torch::dtype(torch::kInt32));
    int32_t* out = ijk.data_ptr<int32_t>();
    for (const auto& member : members)
        for (const Vec3i& v : member) {
            out[0] = v[0];
            out[1] = v[1];
            out[2] = v[2];
            out += 3;
        }
    return {ijk, torch::tensor(offsets, torch::dtype(torch::kInt64))};
}

/// Sparse convolution with autograd, for C++ (LibTorch) and Python alike: gradients for the features
/// and the weight come from the plan's backward passes (deterministic, like the forward).
class SparseConvFunction : public torch::autograd::Function<SparseConvFunction> {
public:
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor features, torch::Tensor weight,
                                 c10::intrusive_ptr<ConvolutionPlanHolder> plan) {
        ctx->save_for_backward({features, weight});
        ctx->saved_data["plan"] = plan;
        return plan->forward(features, weight);
    }

    static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::tensor_list grads) {
        const auto saved = ctx->get_saved_variables();
        const auto plan = ctx->saved_data["plan"].toCustomClass<ConvolutionPlanHolder>();
        const torch::Tensor grad_output = grads[0].contiguous();
        torch::Tensor grad_features, grad_weight;
        if (ctx->needs_input_grad(0)) grad_features = plan->backward_input(grad_output, saved[1]);
        if (ctx->needs_input_grad(1)) grad_weight = plan->backward_weight(saved[0], grad_output);
        return {grad_features, grad_weight, torch::Tensor()};
    }
};

/// torch.ops.sparsegrid.sparse_conv(features [N_source, Cin], weight [Cout, Cin, K0, K1, K2], plan)
/// -> [N_target, Cout], differentiable in features and weight.
torch::Tensor sparse_conv(torch::Tensor features, torch::Tensor weight, c10::intrusive_ptr<ConvolutionPlanHolder> plan) {
    return SparseConvFunction::apply(features, weight, plan);
}

/// A triangle mesh file (load_mesh): vertices [V, 3] float64 and faces [F, 3] int32.
std::tuple<torch::Tensor, torch::Tensor> load_mesh(std::string path) {
    const sparsegrid::TriangleMesh mesh = sparsegrid::load_mesh(path);
    torch::Tensor vertices = torch::empty({static_cast<int64_t>(mesh.vertices.size()), 3}, torch::dtype(torch::kFloat64));
    torch::Tensor faces = torch::empty({static_cast<int64_t>(mesh.faces.size()), 3}, torch::dtype(torch::kInt32));
    for (size_t i = 0; i < mesh.vertices.size(); ++i)
        for (int a = 0; a < 3; ++a) vertices.data_ptr<double>()[3 * i + a] = mesh.vertices[i][a];
    for (size_t i = 0; i < mesh.faces.size(); ++i)
        for (int a = 0; a < 3; ++a) faces.data_ptr<int32_t>()[3 * i + a] = mesh.faces[i][a];
    return {vertices, faces};
}

TORCH_LIBRARY(sparsegrid, m) {
    m.def("synthetic_surface_batch", &synthetic_surface_batch);
    m.def("load_mesh", &load_mesh);

    m.class_<GridBatchHolder>("GridBatch")
        .def_static("from_ijk", &GridBatchHolder::from_ijk)
        .def_static("from_points", &GridBatchHolder::from_points)
        .def_static("from_mesh", &GridBatchHolder::from_mesh)
        .def("batch_size", &GridBatchHolder::batch_size)
        .def("num_voxels", &GridBatchHolder::num_voxels)
        .def("ijk", &GridBatchHolder::ijk)
        .def("offsets", &GridBatchHolder::offsets)
        .def("voxel_sizes", &GridBatchHolder::voxel_sizes)
        .def("origins", &GridBatchHolder::origins)
        .def("conv_grid", &GridBatchHolder::conv_grid)
        .def("conv_transpose_grid", &GridBatchHolder::conv_transpose_grid)
        .def("coarsened_grid", &GridBatchHolder::coarsened_grid)
        .def("refined_grid", &GridBatchHolder::refined_grid)
        .def("dilated_grid", &GridBatchHolder::dilated_grid)
        .def("pruned_grid", &GridBatchHolder::pruned_grid)
        .def("merged_grid", &GridBatchHolder::merged_grid)
        .def("ijk_to_index", &GridBatchHolder::ijk_to_index);
    m.class_<ConvolutionPlanHolder>("ConvolutionPlan")
        .def_static("make", &ConvolutionPlanHolder::make)
        .def("transposed", &ConvolutionPlanHolder::transposed)
        .def("source_grid", &ConvolutionPlanHolder::source_grid)
        .def("target_grid", &ConvolutionPlanHolder::target_grid)
        .def("is_identity", &ConvolutionPlanHolder::is_identity)
        .def("target_map", &ConvolutionPlanHolder::target_map)
        .def("forward", &ConvolutionPlanHolder::forward)
        .def("backward_input", &ConvolutionPlanHolder::backward_input)
        .def("backward_weight", &ConvolutionPlanHolder::backward_weight);
    // After the classes: the schema of sparse_conv names ConvolutionPlan.
    m.def("sparse_conv", &sparse_conv);
    m.def("convolution_seconds", [] { return static_cast<double>(g_convolution_nanoseconds.load()) * 1e-9; });
}

}  // namespace sparsegrid_torch
