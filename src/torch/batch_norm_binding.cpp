// torch.ops.sparsegrid.batch_norm, batch_norm_forward and batch_norm_backward (batch_norm_binding.h):
// tensor checks, then the core's batch_norm_forward / batch_norm_backward on PyTorch's current stream.
#include "batch_norm_binding.h"

#include "torch_runtime.h"

#include <sparsegrid/batch_norm.h>

#include <string>
#include <type_traits>

namespace sparsegrid_torch {

namespace {

sparsegrid::Activation activation_of(int64_t code, const char* op) {
    if (code < 0 || code > static_cast<int64_t>(sparsegrid::Activation::SiLU))
        fail(op, ": activation must be 0 (identity), 1 (relu), 2 (leaky_relu), 3 (elu) or 4 (silu), got ", code);
    return static_cast<sparsegrid::Activation>(code);
}

/// torch's Python name of a dtype ("float32"), as the user writes it.
std::string dtype_name(torch::ScalarType dtype) {
    switch (dtype) {
    case torch::kFloat32:
        return "float32";
    case torch::kFloat64:
        return "float64";
    case torch::kFloat16:
        return "float16";
    case torch::kBFloat16:
        return "bfloat16";
    default:
        return c10::toString(dtype);
    }
}

/// The dtype of the per-channel tensors: float64 with float64 features, float32 otherwise.
torch::ScalarType parameter_dtype(const torch::Tensor& features) {
    return features.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

/// An optional per-channel tensor: [channels], the parameters' dtype, the features' device; contiguous.
const void* channel_data(const c10::optional<torch::Tensor>& t, const torch::Tensor& features, const char* op,
                         const char* name) {
    if (!t || !t->defined()) return nullptr;
    const torch::ScalarType dtype = parameter_dtype(features);
    if (t->dim() != 1 || t->size(0) != features.size(1))
        fail(op, ": ", name, " must have shape [", features.size(1), "] (one entry per channel), got ", t->sizes());
    if (t->scalar_type() != dtype)
        fail(op, ": ", name, " must be ", dtype_name(dtype), " for ", dtype_name(features.scalar_type()),
             " features, got ", dtype_name(t->scalar_type()), " (convert the module or the features)");
    if (t->device() != features.device())
        fail(op, ": ", name, " is on ", t->device().str(), " but the features are on ", features.device().str());
    if (!t->is_contiguous()) fail(op, ": ", name, " must be contiguous");
    return t->data_ptr();
}

void check_features(const torch::Tensor& t, const char* op, const char* name) {
    if (t.dim() != 2) fail(op, ": ", name, " must have shape [N, C], got ", t.dim(), " dimensions");
}

}  // namespace

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> batch_norm_forward(
    torch::Tensor input, c10::optional<torch::Tensor> weight, c10::optional<torch::Tensor> bias,
    c10::optional<torch::Tensor> running_mean, c10::optional<torch::Tensor> running_var,
    c10::optional<torch::Tensor> num_batches_tracked, bool training, double momentum, bool cumulative_average,
    double eps, int64_t activation, double activation_parameter) {
    constexpr const char* op = "batch_norm_forward";
    check_features(input, op, "input");
    sparsegrid::BatchNormForward args;
    args.dtype = dtype_of(input, op, "input");
    const sparsegrid::Context ctx = context_of(input, op, "input");
    const torch::Tensor x = input.contiguous();
    args.weight = channel_data(weight, x, op, "weight");
    args.bias = channel_data(bias, x, op, "bias");
    args.running_mean = const_cast<void*>(channel_data(running_mean, x, op, "running_mean"));
    args.running_var = const_cast<void*>(channel_data(running_var, x, op, "running_var"));
    if (num_batches_tracked && num_batches_tracked->defined()) {
        const torch::Tensor& counter = *num_batches_tracked;
        if (counter.scalar_type() != torch::kInt64 || counter.numel() != 1 || counter.device() != x.device())
            fail(op, ": num_batches_tracked must be one int64 on ", x.device().str(), ", got ",
                 dtype_name(counter.scalar_type()), " of ", counter.numel(), " entries on ", counter.device().str());
        args.num_batches_tracked = counter.data_ptr<int64_t>();
    }
    torch::Tensor output = torch::empty_like(x);
    const torch::TensorOptions stats = x.options().dtype(parameter_dtype(x));
    torch::Tensor save_mean = torch::empty({x.size(1)}, stats), save_invstd = torch::empty({x.size(1)}, stats);
    args.input = x.data_ptr();
    args.output = output.data_ptr();
    args.rows = x.size(0);
    args.channels = x.size(1);
    args.training = training;
    args.momentum = momentum;
    args.cumulative_average = cumulative_average;
    args.eps = eps;
    args.activation = activation_of(activation, op);
    args.activation_parameter = activation_parameter;
    args.save_mean = save_mean.data_ptr();
    args.save_invstd = save_invstd.data_ptr();
    const c10::OptionalDeviceGuard guard(x.device());
    sparsegrid::batch_norm_forward(args, ctx);
    return {output, save_mean, save_invstd};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> batch_norm_backward(
    torch::Tensor grad_output, torch::Tensor input, c10::optional<torch::Tensor> weight,
    c10::optional<torch::Tensor> bias, torch::Tensor save_mean, torch::Tensor save_invstd, bool training,
    int64_t activation, double activation_parameter, bool input_grad, bool weight_grad, bool bias_grad) {
    constexpr const char* op = "batch_norm_backward";
    check_features(input, op, "input");
    check_features(grad_output, op, "grad_output");
    if (grad_output.sizes() != input.sizes())
        fail(op, ": grad_output must have the shape of input ", input.sizes(), ", got ", grad_output.sizes());
    if (grad_output.scalar_type() != input.scalar_type())
        fail(op, ": grad_output must have the dtype of input (", dtype_name(input.scalar_type()), "), got ",
             dtype_name(grad_output.scalar_type()));
    if (grad_output.device() != input.device())
        fail(op, ": grad_output is on ", grad_output.device().str(), " but input is on ", input.device().str());
    sparsegrid::BatchNormBackward args;
    args.dtype = dtype_of(input, op, "input");
    const sparsegrid::Context ctx = context_of(input, op, "input");
    const torch::Tensor x = input.contiguous(), dy = grad_output.contiguous();
    args.weight = channel_data(weight, x, op, "weight");
    args.bias = channel_data(bias, x, op, "bias");
    args.save_mean = channel_data(save_mean, x, op, "save_mean");
    args.save_invstd = channel_data(save_invstd, x, op, "save_invstd");
    const torch::TensorOptions stats = x.options().dtype(parameter_dtype(x));
    torch::Tensor grad_input, grad_weight, grad_bias;
    if (input_grad) grad_input = torch::empty_like(x);
    if (weight_grad) grad_weight = torch::empty({x.size(1)}, stats);
    if (bias_grad) grad_bias = torch::empty({x.size(1)}, stats);
    args.grad_output = dy.data_ptr();
    args.input = x.data_ptr();
    args.rows = x.size(0);
    args.channels = x.size(1);
    args.training = training;
    args.activation = activation_of(activation, op);
    args.activation_parameter = activation_parameter;
    args.grad_input = input_grad ? grad_input.data_ptr() : nullptr;
    args.grad_weight = weight_grad ? grad_weight.data_ptr() : nullptr;
    args.grad_bias = bias_grad ? grad_bias.data_ptr() : nullptr;
    const c10::OptionalDeviceGuard guard(x.device());
    sparsegrid::batch_norm_backward(args, ctx);
    return {grad_input, grad_weight, grad_bias};
}

namespace {

/// batch_norm_forward with its backward pass, for input alone (Affine false) or input, weight and bias
/// (Affine true): autograd's inputs must be defined tensors, so layers without affine parameters take
/// the first form. The running statistics and the counter are state, not inputs.
template <bool Affine>
class BatchNormFunction : public torch::autograd::Function<BatchNormFunction<Affine>> {
public:
    using Parameters = std::conditional_t<Affine, torch::Tensor, c10::optional<torch::Tensor>>;

    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor input, Parameters weight,
                                 Parameters bias, c10::optional<torch::Tensor> running_mean,
                                 c10::optional<torch::Tensor> running_var,
                                 c10::optional<torch::Tensor> num_batches_tracked, bool training, double momentum,
                                 bool cumulative_average, double eps, int64_t activation, double activation_parameter) {
        auto [output, save_mean, save_invstd] = batch_norm_forward(
            input, weight, bias, running_mean, running_var, num_batches_tracked, training, momentum, cumulative_average,
            eps, activation, activation_parameter);
        if constexpr (Affine)
            ctx->save_for_backward({input, save_mean, save_invstd, weight, bias});
        else
            ctx->save_for_backward({input, save_mean, save_invstd});
        ctx->saved_data["training"] = training;
        ctx->saved_data["activation"] = activation;
        ctx->saved_data["activation_parameter"] = activation_parameter;
        return output;
    }

    static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::tensor_list grads) {
        torch::autograd::tensor_list result(12);
        if (!grads[0].defined()) return result;
        const auto saved = ctx->get_saved_variables();
        c10::optional<torch::Tensor> weight, bias;
        if constexpr (Affine) {
            weight = saved[3];
            bias = saved[4];
        }
        auto [grad_input, grad_weight, grad_bias] = batch_norm_backward(
            grads[0], saved[0], weight, bias, saved[1], saved[2], ctx->saved_data["training"].toBool(),
            ctx->saved_data["activation"].toInt(), ctx->saved_data["activation_parameter"].toDouble(),
            ctx->needs_input_grad(0), Affine && ctx->needs_input_grad(1), Affine && ctx->needs_input_grad(2));
        refuse_second_backward({saved[0], weight.value_or(torch::Tensor()), bias.value_or(torch::Tensor()), grads[0]},
                               {&grad_input, &grad_weight, &grad_bias},
                               "sparsegrid: the gradients of batch_norm are not differentiable (no double backward "
                               "through sparsegrid.nn.BatchNorm / batch_norm)");
        result[0] = grad_input;
        result[1] = grad_weight;
        result[2] = grad_bias;
        return result;
    }
};

bool requires_grad(const c10::optional<torch::Tensor>& t) { return t && t->defined() && t->requires_grad(); }

}  // namespace

torch::Tensor batch_norm(torch::Tensor input, c10::optional<torch::Tensor> weight, c10::optional<torch::Tensor> bias,
                         c10::optional<torch::Tensor> running_mean, c10::optional<torch::Tensor> running_var,
                         c10::optional<torch::Tensor> num_batches_tracked, bool training, double momentum,
                         bool cumulative_average, double eps, int64_t activation, double activation_parameter) {
    if (!at::GradMode::is_enabled() || !(input.requires_grad() || requires_grad(weight) || requires_grad(bias)))
        return std::get<0>(batch_norm_forward(input, weight, bias, running_mean, running_var, num_batches_tracked,
                                              training, momentum, cumulative_average, eps, activation,
                                              activation_parameter));
    const bool has_weight = weight && weight->defined(), has_bias = bias && bias->defined();
    if (has_weight != has_bias)
        fail(
            "batch_norm: weight and bias must both be given or both be None (batch_norm_forward takes either "
            "alone)");
    if (has_weight)
        return BatchNormFunction<true>::apply(input, *weight, *bias, running_mean, running_var, num_batches_tracked,
                                              training, momentum, cumulative_average, eps, activation,
                                              activation_parameter);
    return BatchNormFunction<false>::apply(input, c10::nullopt, c10::nullopt, running_mean, running_var,
                                           num_batches_tracked, training, momentum, cumulative_average, eps, activation,
                                           activation_parameter);
}

}  // namespace sparsegrid_torch
