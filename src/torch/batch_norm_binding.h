// torch.ops.sparsegrid.batch_norm (differentiable, its autograd in C++), batch_norm_forward and
// batch_norm_backward: batch normalization of features [N, C] with a fused activation
// (sparsegrid/batch_norm.h), on the features' device and PyTorch's current stream, outputs from
// PyTorch's allocator, no host synchronisation. The per-channel tensors are float64 with float64
// features and float32 otherwise. Python's sparsegrid.nn.BatchNorm calls batch_norm.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <tuple>

namespace sparsegrid_torch {

/// (output, save_mean, save_invstd). `activation`: 0 identity, 1 relu, 2 leaky_relu, 3 elu, 4 silu.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> batch_norm_forward(
    torch::Tensor input, c10::optional<torch::Tensor> weight, c10::optional<torch::Tensor> bias,
    c10::optional<torch::Tensor> running_mean, c10::optional<torch::Tensor> running_var,
    c10::optional<torch::Tensor> num_batches_tracked, bool training, double momentum, bool cumulative_average,
    double eps, int64_t activation, double activation_parameter);

/// (grad_input, grad_weight, grad_bias), each undefined (None) unless asked for.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> batch_norm_backward(
    torch::Tensor grad_output, torch::Tensor input, c10::optional<torch::Tensor> weight,
    c10::optional<torch::Tensor> bias, torch::Tensor save_mean, torch::Tensor save_invstd, bool training,
    int64_t activation, double activation_parameter, bool input_grad, bool weight_grad, bool bias_grad);

/// The output of batch_norm_forward, with autograd for input, weight and bias where one of them requires
/// a gradient (the backward pass is batch_norm_backward; not differentiable twice).
torch::Tensor batch_norm(torch::Tensor input, c10::optional<torch::Tensor> weight, c10::optional<torch::Tensor> bias,
                         c10::optional<torch::Tensor> running_mean, c10::optional<torch::Tensor> running_var,
                         c10::optional<torch::Tensor> num_batches_tracked, bool training, double momentum,
                         bool cumulative_average, double eps, int64_t activation, double activation_parameter);

}  // namespace sparsegrid_torch
