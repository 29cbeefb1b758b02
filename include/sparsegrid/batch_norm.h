// Batch normalization of voxel features with a fused activation, on raw buffers: one call for what
// torch.nn.BatchNorm1d followed by an activation module does over features [rows, channels], with the
// backward pass recomputing the activation's input instead of keeping it.
//
//   z = (x - mean) * invstd * weight + bias,  y = activation(z)
//
// Training normalizes with the batch's statistics (the biased variance) and updates the running
// statistics (the unbiased variance) as torch does; evaluation normalizes with the running statistics.
//
// Dtypes: features of Float32, Float64, or Float16 / BFloat16 (CUDA); the per-channel parameters and
// statistics (weight, bias, running_mean, running_var, save_mean, save_invstd, the gradients of
// weight and bias) are Float64 with Float64 features and Float32 otherwise. 16-bit features are
// normalized in float32 and rounded once.
//
// Determinism: every sum runs in an order fixed by the row count (core/batch_norm_math.h), so results
// are bitwise reproducible on a device; the CPU and CUDA agree within the dtype's rounding.
//
// Cost on CUDA: three launches forward (two in evaluation) and at most three backward, no host
// synchronisation, a scratch buffer of (chunks x channels) partial sums from the context's allocator.
#pragma once

#include <sparsegrid/context.h>
#include <sparsegrid/types.h>

#include <cstdint>

namespace sparsegrid {

/// The activation applied after the normalization (torch.nn's ReLU, LeakyReLU, ELU, SiLU).
enum class Activation : int8_t { Identity = 0, ReLU = 1, LeakyReLU = 2, ELU = 3, SiLU = 4 };

struct BatchNormForward {
    const void* input = nullptr;  ///< [rows, channels], row-major, `dtype`
    void* output = nullptr;       ///< [rows, channels], `dtype`, not overlapping `input`
    int64_t rows = 0;
    int64_t channels = 0;
    DType dtype = DType::Float32;
    /// [channels] or null (weight 1, bias 0).
    const void* weight = nullptr;
    const void* bias = nullptr;
    /// [channels] or null (no running statistics: training then only normalizes). Updated in training
    /// when rows > 0; read in evaluation, where both are required.
    void* running_mean = nullptr;
    void* running_var = nullptr;
    /// One int64 on the device, or null: incremented by a training call (also one without rows, as
    /// torch's module does).
    int64_t* num_batches_tracked = nullptr;
    bool training = true;
    /// running = (1 - momentum) * running + momentum * batch; with `cumulative_average` the factor is
    /// 1 / (num_batches_tracked after the increment), which then must not be null.
    double momentum = 0.1;
    bool cumulative_average = false;
    double eps = 1e-5;
    Activation activation = Activation::Identity;
    /// LeakyReLU's negative slope or ELU's alpha.
    double activation_parameter = 0.0;
    /// [channels] outputs for the backward pass: the mean and 1 / sqrt(var + eps) the call normalized
    /// with (the batch's in training, the running ones in evaluation). Required.
    void* save_mean = nullptr;
    void* save_invstd = nullptr;
};

struct BatchNormBackward {
    const void* grad_output = nullptr;  ///< [rows, channels], `dtype`
    const void* input = nullptr;        ///< the forward call's input
    int64_t rows = 0;
    int64_t channels = 0;
    DType dtype = DType::Float32;
    const void* weight = nullptr;  ///< as in the forward call
    const void* bias = nullptr;
    const void* save_mean = nullptr;  ///< the forward call's outputs
    const void* save_invstd = nullptr;
    /// Whether the forward call normalized with the batch's statistics (whose gradient then flows too).
    bool training = true;
    Activation activation = Activation::Identity;
    double activation_parameter = 0.0;
    /// Outputs, each optional: [rows, channels] in `dtype`; [channels] in the parameters' dtype.
    void* grad_input = nullptr;
    void* grad_weight = nullptr;
    void* grad_bias = nullptr;
};

/// Raises Error for a training call with exactly one row (no variance, as torch), a null buffer that
/// the call needs, or a bad size or dtype. Zero rows write nothing (and, training, leave the running
/// statistics as they are; save_mean and save_invstd get 0 and 1 / sqrt(eps)).
void batch_norm_forward(const BatchNormForward& args, const Context& ctx);

/// Zero rows give zero gradients for weight and bias.
void batch_norm_backward(const BatchNormBackward& args, const Context& ctx);

}  // namespace sparsegrid
