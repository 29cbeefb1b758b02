// Front end of batch_norm_forward / batch_norm_backward (batch_norm.h): the argument checks, then one
// call into the backend of the context's device.
#include <sparsegrid/batch_norm.h>

#include "api/dispatch.h"
#include "core/errors.h"

#include <cmath>

namespace sparsegrid {

namespace {

void check_shape(const char* op, int64_t rows, int64_t channels, DType dtype, const Context& ctx) {
    if (rows < 0) detail::throw_error(op, ": rows must be >= 0, got ", rows);
    if (channels < 1) detail::throw_error(op, ": channels must be >= 1, got ", channels);
    // Element indices and byte sizes of the features stay within int64.
    detail::checked_mul(op, "features' bytes (rows x channels x element size)",
                        detail::checked_mul(op, "features' elements (rows x channels)", rows, channels),
                        dtype_size(dtype));
    if ((dtype == DType::Float16 || dtype == DType::BFloat16) && ctx.device.is_cpu())
        detail::throw_error(op, ": float16 and bfloat16 features run on CUDA only (the CPU takes float32 or float64)");
}

void check_activation(const char* op, Activation activation, double parameter) {
    const int value = static_cast<int>(activation);
    if (value < 0 || value > static_cast<int>(Activation::SiLU))
        detail::throw_error(op, ": activation must be Identity, ReLU, LeakyReLU, ELU or SiLU, got ", value);
    if (!std::isfinite(parameter)) detail::throw_error(op, ": activation_parameter must be finite, got ", parameter);
}

void require(const char* op, const void* pointer, const char* name, const char* why) {
    if (pointer == nullptr) detail::throw_error(op, ": ", name, " must not be null ", why);
}

}  // namespace

void batch_norm_forward(const BatchNormForward& args, const Context& ctx) {
    constexpr const char* op = "batch_norm_forward";
    check_shape(op, args.rows, args.channels, args.dtype, ctx);
    check_activation(op, args.activation, args.activation_parameter);
    if (!(args.eps > 0.0) || !std::isfinite(args.eps)) detail::throw_error(op, ": eps must be > 0, got ", args.eps);
    if (!std::isfinite(args.momentum)) detail::throw_error(op, ": momentum must be finite, got ", args.momentum);
    if (args.training && args.rows == 1)
        detail::throw_error(op,
                            ": training needs more than 1 row per channel (a batch of one row has no "
                            "variance), got 1 row");
    if ((args.running_mean == nullptr) != (args.running_var == nullptr))
        detail::throw_error(op, ": running_mean and running_var must both be given or both be null");
    if (!args.training) require(op, args.running_mean, "running_mean", "in evaluation (it normalizes with them)");
    if (args.training && args.cumulative_average && args.running_mean != nullptr)
        require(op, args.num_batches_tracked, "num_batches_tracked", "with cumulative_average");
    require(op, args.save_mean, "save_mean", "(the backward pass reads it)");
    require(op, args.save_invstd, "save_invstd", "(the backward pass reads it)");
    if (args.rows > 0) {
        require(op, args.input, "input", "when rows > 0");
        require(op, args.output, "output", "when rows > 0");
    }
    detail::on_backend(op, ctx.device, [&](auto backend) { backend.batch_norm_forward(args, ctx); });
}

void batch_norm_backward(const BatchNormBackward& args, const Context& ctx) {
    constexpr const char* op = "batch_norm_backward";
    check_shape(op, args.rows, args.channels, args.dtype, ctx);
    check_activation(op, args.activation, args.activation_parameter);
    require(op, args.save_mean, "save_mean", "(the forward call's output)");
    require(op, args.save_invstd, "save_invstd", "(the forward call's output)");
    if (args.rows > 0 && (args.grad_input != nullptr || args.grad_weight != nullptr || args.grad_bias != nullptr)) {
        require(op, args.grad_output, "grad_output", "when rows > 0");
        require(op, args.input, "input", "when rows > 0");
    }
    detail::on_backend(op, ctx.device, [&](auto backend) { backend.batch_norm_backward(args, ctx); });
}

}  // namespace sparsegrid
