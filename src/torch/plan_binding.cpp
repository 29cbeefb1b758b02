// torch.classes.sparsegrid.ConvolutionPlan and sparse_conv (plan_binding.h).
#include "plan_binding.h"

#include "torch_runtime.h"

#include <sparsegrid/kernel_map.h>

#include <utility>

namespace sparsegrid_torch {

ConvolutionPlanHolder::Ptr ConvolutionPlanHolder::make(GridBatchHolder::Ptr source, std::vector<int64_t> kernel_size,
                                                       std::vector<int64_t> stride,
                                                       c10::optional<GridBatchHolder::Ptr> target, bool transposed) {
    constexpr const char* op = "ConvolutionPlan";
    const Vec3i kernel = triple(kernel_size, op, "kernel_size"), step = triple(stride, op, "stride");
    if (target && (*target)->grid.device() != source->grid.device())
        fail(op, ": target is on ", (*target)->grid.device().str(), " but the source grid is on ",
             source->grid.device().str(), "; move it there first (.to(\"", source->grid.device().str(), "\"))");
    using sparsegrid::ConvolutionPlan;
    const CoreScope scope(source->grid.context());
    const CoreScope target_scope(target ? (*target)->grid.context() : source->grid.context());
    if (transposed)
        return c10::make_intrusive<ConvolutionPlanHolder>(
            target ? ConvolutionPlan::make_transposed(source->grid, (*target)->grid, kernel, step)
                   : ConvolutionPlan::make_transposed(source->grid, kernel, step));
    return c10::make_intrusive<ConvolutionPlanHolder>(
        target ? ConvolutionPlan::make(source->grid, (*target)->grid, kernel, step)
               : ConvolutionPlan::make(source->grid, kernel, step));
}

c10::Device ConvolutionPlanHolder::device() const { return torch_device(plan.source_grid().device()); }

torch::Tensor ConvolutionPlanHolder::target_map() const {
    const CoreScope scope(plan.source_grid().context()), target_scope(plan.target_grid().context());
    const sparsegrid::KernelMap& map = plan.target_map();  // a transposed plan derives it on first use
    return tensor_of(map.neighbour_map(), {map.num_target(), map.kernel_volume()}, torch::kInt32);
}

/// Weight [Cout, Cin, K0, K1, K2] against the plan's kernel size and the feature channels.
void ConvolutionPlanHolder::check_weight(const torch::Tensor& weight, int64_t in_channels, const char* op) const {
    if (weight.dim() != 5)
        fail(op, ": weight must have shape [Cout, Cin, K0, K1, K2], got ", weight.dim(), " dimensions");
    const Vec3i& k = plan.kernel_size();
    if (weight.size(1) != in_channels || weight.size(2) != k[0] || weight.size(3) != k[1] || weight.size(4) != k[2])
        fail(op, ": weight must have shape [Cout, ", in_channels, ", ", k[0], ", ", k[1], ", ", k[2], "], got [",
             weight.size(0), ", ", weight.size(1), ", ", weight.size(2), ", ", weight.size(3), ", ", weight.size(4),
             "]");
    check_device(weight, plan.source_grid().device(), op, "weight");
}

sparsegrid::DType ConvolutionPlanHolder::weight_dtype_of(const torch::Tensor& weight, const torch::Tensor& features,
                                                         const char* op, const char* name) const {
    const c10::ScalarType dtype = features.scalar_type();
    if (weight.scalar_type() == dtype) return dtype_of(features, op, name);
    if (weight.scalar_type() == torch::kFloat32 && (dtype == torch::kFloat16 || dtype == torch::kBFloat16))
        return sparsegrid::DType::Float32;
    const bool half = dtype == torch::kFloat16 || dtype == torch::kBFloat16;
    fail(op, ": weight must have the dtype of ", name, " (", c10::toString(dtype), ")", half ? " or be float32" : "",
         ", got ", c10::toString(weight.scalar_type()));
}

void ConvolutionPlanHolder::check_features(const torch::Tensor& x, int64_t rows, const char* op,
                                           const char* name) const {
    if (x.dim() != 2) fail(op, ": ", name, " must have shape [N, C], got ", x.dim(), " dimensions");
    if (x.size(0) != rows) fail(op, ": ", name, " must have ", rows, " rows (one per voxel), got ", x.size(0));
    check_device(x, plan.source_grid().device(), op, name);
}

/// The context executions run on: the target grid's, allowing TF32 for float32 on CUDA exactly when
/// PyTorch allows it for its own float32 matrix products (torch.backends.cuda.matmul.allow_tf32, or
/// torch.set_float32_matmul_precision("high")).
sparsegrid::Context ConvolutionPlanHolder::execution_context(sparsegrid::DType dtype) const {
    sparsegrid::Context ctx = plan.target_grid().context();
    ctx.allow_tf32 = dtype == sparsegrid::DType::Float32 && ctx.device.is_cuda() &&
        at::globalContext().allowTF32CuBLAS();
    return ctx;
}

torch::Tensor ConvolutionPlanHolder::forward(torch::Tensor input, torch::Tensor weight) const {
    constexpr const char* op = "ConvolutionPlan.forward";
    const ConvolutionTimer timer;
    check_features(input, plan.source_grid().num_voxels(), op, "input");
    const sparsegrid::DType dtype = dtype_of(input, op, "input");
    const sparsegrid::DType weight_dtype = weight_dtype_of(weight, input, op, "input");
    check_weight(weight, input.size(1), op);
    const torch::Tensor x = input.contiguous(), w = weight.contiguous();
    torch::Tensor out = torch::empty({plan.target_grid().num_voxels(), w.size(0)}, x.options());
    const CoreScope scope(plan.source_grid().context()), target_scope(plan.target_grid().context());
    plan.forward(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.size(1), w.size(0), dtype, weight_dtype,
                 execution_context(dtype));
    return out;
}

torch::Tensor ConvolutionPlanHolder::backward_input(torch::Tensor grad_output, torch::Tensor weight) const {
    constexpr const char* op = "ConvolutionPlan.backward_input";
    const ConvolutionTimer timer;
    check_features(grad_output, plan.target_grid().num_voxels(), op, "grad_output");
    const sparsegrid::DType dtype = dtype_of(grad_output, op, "grad_output");
    const sparsegrid::DType weight_dtype = weight_dtype_of(weight, grad_output, op, "grad_output");
    check_weight(weight, weight.dim() == 5 ? weight.size(1) : 0, op);
    if (weight.size(0) != grad_output.size(1))
        fail(op, ": grad_output must have ", weight.size(0), " channels, got ", grad_output.size(1));
    const torch::Tensor g = grad_output.contiguous(), w = weight.contiguous();
    torch::Tensor out = torch::empty({plan.source_grid().num_voxels(), w.size(1)}, g.options());
    const CoreScope scope(plan.source_grid().context()), target_scope(plan.target_grid().context());
    plan.backward_input(g.data_ptr(), w.data_ptr(), out.data_ptr(), w.size(1), w.size(0), dtype, weight_dtype,
                        execution_context(dtype));
    return out;
}

torch::Tensor ConvolutionPlanHolder::backward_weight(torch::Tensor input, torch::Tensor grad_output,
                                                     c10::optional<c10::ScalarType> dtype_wanted) const {
    constexpr const char* op = "ConvolutionPlan.backward_weight";
    const ConvolutionTimer timer;
    check_features(input, plan.source_grid().num_voxels(), op, "input");
    check_features(grad_output, plan.target_grid().num_voxels(), op, "grad_output");
    const sparsegrid::DType dtype = dtype_of(input, op, "input");
    if (grad_output.scalar_type() != input.scalar_type())
        fail(op, ": grad_output must have the dtype of input (", c10::toString(input.scalar_type()), "), got ",
             c10::toString(grad_output.scalar_type()));
    const c10::ScalarType out_type = dtype_wanted.value_or(input.scalar_type());
    sparsegrid::DType weight_dtype = dtype;
    if (out_type != input.scalar_type()) {
        const bool half = dtype == sparsegrid::DType::Float16 || dtype == sparsegrid::DType::BFloat16;
        if (out_type != torch::kFloat32 || !half)
            fail(op, ": dtype must be the dtype of input (", c10::toString(input.scalar_type()),
                 "), or float32 with float16 / bfloat16 input, got ", c10::toString(out_type));
        weight_dtype = sparsegrid::DType::Float32;
    }
    const torch::Tensor x = input.contiguous(), g = grad_output.contiguous();
    const Vec3i& k = plan.kernel_size();
    torch::Tensor out = torch::empty({g.size(1), x.size(1), k[0], k[1], k[2]}, x.options().dtype(out_type));
    const CoreScope scope(plan.source_grid().context()), target_scope(plan.target_grid().context());
    plan.backward_weight(x.data_ptr(), g.data_ptr(), out.data_ptr(), x.size(1), g.size(1), dtype, weight_dtype,
                         execution_context(dtype));
    return out;
}

namespace {

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
        if (!grads[0].defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
        const auto saved = ctx->get_saved_variables();
        const auto plan = ctx->saved_data["plan"].toCustomClass<ConvolutionPlanHolder>();
        const torch::Tensor grad_output = grads[0].contiguous();
        torch::Tensor grad_features, grad_weight;
        if (ctx->needs_input_grad(0)) grad_features = plan->backward_input(grad_output, saved[1]);
        if (ctx->needs_input_grad(1))
            grad_weight = plan->backward_weight(saved[0], grad_output, saved[1].scalar_type());
        refuse_second_backward({saved[0], saved[1], grads[0]}, {&grad_features, &grad_weight},
                               "sparsegrid: the gradients of a sparse convolution are not differentiable (no double "
                               "backward through ConvolutionPlan.execute / sparse_conv)");
        return {grad_features, grad_weight, torch::Tensor()};
    }
};

}  // namespace

torch::Tensor sparse_conv(torch::Tensor features, torch::Tensor weight,
                          c10::intrusive_ptr<ConvolutionPlanHolder> plan) {
    if (!at::GradMode::is_enabled() || !(features.requires_grad() || weight.requires_grad()))
        return plan->forward(features, weight);
    return SparseConvFunction::apply(features, weight, plan);
}

}  // namespace sparsegrid_torch
