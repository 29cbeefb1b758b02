// The CPU backend's batch normalization: the chunks of core/batch_norm_math.h reduced in parallel (one
// chunk per task: its sums, then its squared deviations from its own mean, channels innermost so the
// loops vectorize), combined in chunk order, then the rows normalized in parallel with the activation
// chosen at compile time. Float32 features sum in float32 like the CUDA backend; results do not depend
// on the threads.
#include "backend/backend.h"
#include "core/batch_norm_math.h"
#include "cpu/parallel.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace sparsegrid::detail {

namespace {

/// fn(begin_row, end_row, out) for every chunk (out: its `channels` partial results), chunks in parallel.
template <typename Item, typename Reduce>
std::vector<Item> reduce_chunks(int64_t rows, int64_t channels, Reduce&& reduce) {
    const int64_t chunk_rows = norm_chunk_rows(rows), chunks = norm_chunks(rows);
    std::vector<Item> partial(static_cast<size_t>(chunks * channels));
#pragma omp parallel for schedule(static) if (rows * channels >= cpu::kSerialThreshold)
    for (int64_t chunk = 0; chunk < chunks; ++chunk)
        reduce(chunk * chunk_rows, std::min(rows, (chunk + 1) * chunk_rows), partial.data() + chunk * channels);
    return partial;
}

/// Calls fn with the activation as a compile-time constant, so that the per-entry loops have no switch.
template <typename Fn>
void with_activation(Activation activation, Fn&& fn) {
    switch (activation) {
    case Activation::Identity:
        return fn(std::integral_constant<Activation, Activation::Identity>{});
    case Activation::ReLU:
        return fn(std::integral_constant<Activation, Activation::ReLU>{});
    case Activation::LeakyReLU:
        return fn(std::integral_constant<Activation, Activation::LeakyReLU>{});
    case Activation::ELU:
        return fn(std::integral_constant<Activation, Activation::ELU>{});
    case Activation::SiLU:
        return fn(std::integral_constant<Activation, Activation::SiLU>{});
    }
}

/// exp(value) in float32 without a library call or a branch, so that the per-entry loops vectorize (this
/// file is compiled with -fno-trapping-math, which lets the compiler evaluate both sides of a select):
/// value = n ln 2 + r with |r| <= ln 2 / 2, exp(r) by a degree-7 polynomial (the coefficients of Cephes'
/// expf, within 1e-7 relative), times 2^n built in the exponent bits. Arguments are clamped to
/// [-87.3, 88.3] (below: 2^-126 instead of a denormal or 0; the activations add it to or divide it into
/// numbers of order 1). float64 keeps exp().
struct VectorExp {
    float operator()(float value) const {
        value = value < -87.3f ? -87.3f : value;
        value = value > 88.3f ? 88.3f : value;
        // Round to nearest by adding and subtracting 1.5 * 2^23.
        const float n = (value * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
        const float r = (value - n * 0.693359375f) + n * 2.12194440e-4f;
        float p = 1.9875691500e-4f;
        p = p * r + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
        p = p * r * r + r + 1.0f;
        const int32_t bits = (static_cast<int32_t>(n) + 127) * (1 << 23);
        float scale;
        std::memcpy(&scale, &bits, sizeof(scale));
        return p * scale;
    }
    double operator()(double value) const { return std::exp(value); }
};

/// Per channel: the scale invstd * weight and the bias of z = (x - mean) * scale + bias.
template <typename T>
struct Affine {
    std::vector<T> scale, shift;
};

template <typename T>
Affine<T> affine_of(int64_t channels, const T* invstd, const T* weight, const T* bias) {
    Affine<T> a{std::vector<T>(static_cast<size_t>(channels)), std::vector<T>(static_cast<size_t>(channels))};
    for (int64_t c = 0; c < channels; ++c) {
        a.scale[c] = weight != nullptr ? invstd[c] * weight[c] : invstd[c];
        a.shift[c] = bias != nullptr ? bias[c] : T(0);
    }
    return a;
}

template <typename T>
void forward_typed(const BatchNormForward& a) {
    const T* x = static_cast<const T*>(a.input);
    T* running_mean = static_cast<T*>(a.running_mean);
    T* running_var = static_cast<T*>(a.running_var);
    T* save_mean = static_cast<T*>(a.save_mean);
    T* save_invstd = static_cast<T*>(a.save_invstd);
    const int64_t rows = a.rows, channels = a.channels;
    const T eps = static_cast<T>(a.eps);
    if (a.training) {
        const std::vector<Moments<T>> partial = reduce_chunks<Moments<T>>(
            rows, channels, [&](int64_t begin, int64_t end, Moments<T>* out) {
                std::vector<T> sum(static_cast<size_t>(channels), T(0)), m2(static_cast<size_t>(channels), T(0));
                for (int64_t r = begin; r < end; ++r)
                    for (int64_t c = 0; c < channels; ++c) sum[c] += x[r * channels + c];
                const T count = static_cast<T>(end - begin);
                for (int64_t c = 0; c < channels; ++c) sum[c] /= count;  // the chunk's mean
                for (int64_t r = begin; r < end; ++r)
                    for (int64_t c = 0; c < channels; ++c) {
                        const T d = x[r * channels + c] - sum[c];
                        m2[c] += d * d;
                    }
                for (int64_t c = 0; c < channels; ++c) out[c] = Moments<T>{count, sum[c], m2[c]};
            });
        const int64_t chunks = norm_chunks(rows);
        // torch's factor for momentum=None: 1 / the batches counted with this one.
        T factor = static_cast<T>(a.momentum);
        if (a.num_batches_tracked != nullptr) {
            *a.num_batches_tracked += 1;
            if (a.cumulative_average) factor = T(1) / static_cast<T>(*a.num_batches_tracked);
        }
        for (int64_t c = 0; c < channels; ++c) {
            Moments<T> total{};
            for (int64_t chunk = 0; chunk < chunks; ++chunk) total.combine(partial[chunk * channels + c]);
            save_mean[c] = total.mean;
            save_invstd[c] = T(1) / std::sqrt((rows > 0 ? total.m2 / total.count : T(0)) + eps);
            if (running_mean != nullptr && rows > 0) {
                running_mean[c] = (T(1) - factor) * running_mean[c] + factor * total.mean;
                running_var[c] = (T(1) - factor) * running_var[c] + factor * (total.m2 / (total.count - T(1)));
            }
        }
    } else {
        for (int64_t c = 0; c < channels; ++c) {
            save_mean[c] = running_mean[c];
            save_invstd[c] = T(1) / std::sqrt(running_var[c] + eps);
        }
    }
    const Affine<T> affine = affine_of(channels, save_invstd, static_cast<const T*>(a.weight),
                                       static_cast<const T*>(a.bias));
    T* y = static_cast<T*>(a.output);
    const T parameter = static_cast<T>(a.activation_parameter);
    with_activation(a.activation, [&](auto activation) {
#pragma omp parallel for schedule(static) if (rows * channels >= cpu::kSerialThreshold)
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < channels; ++c) {
                const T z = (x[r * channels + c] - save_mean[c]) * affine.scale[c] + affine.shift[c];
                y[r * channels + c] = activation_value(activation.value, z, parameter, VectorExp{});
            }
    });
}

/// Per channel: the sum of g and of g * xhat, g = grad_output * activation'(z).
template <typename T>
struct GradSums {
    T g = 0;
    T gx = 0;
};

template <typename T>
void backward_typed(const BatchNormBackward& a) {
    const T* dy = static_cast<const T*>(a.grad_output);
    const T* x = static_cast<const T*>(a.input);
    const T* weight = static_cast<const T*>(a.weight);
    const T* mean = static_cast<const T*>(a.save_mean);
    const T* invstd = static_cast<const T*>(a.save_invstd);
    const int64_t rows = a.rows, channels = a.channels;
    const T parameter = static_cast<T>(a.activation_parameter);
    const Affine<T> affine = affine_of(channels, invstd, weight, static_cast<const T*>(a.bias));
    // g = grad_output * activation'(z) of every entry, kept for the input gradient.
    std::vector<T> g(static_cast<size_t>(rows * channels));
    with_activation(a.activation, [&](auto activation) {
#pragma omp parallel for schedule(static) if (rows * channels >= cpu::kSerialThreshold)
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < channels; ++c) {
                const T z = (x[r * channels + c] - mean[c]) * affine.scale[c] + affine.shift[c];
                g[r * channels + c] = dy[r * channels + c] *
                    activation_derivative(activation.value, z, parameter, VectorExp{});
            }
    });
    const bool sums_needed = a.grad_weight != nullptr || a.grad_bias != nullptr || (a.training && a.grad_input);
    std::vector<GradSums<T>> sums(static_cast<size_t>(channels));
    if (sums_needed && rows > 0) {
        const std::vector<GradSums<T>> partial = reduce_chunks<GradSums<T>>(
            rows, channels, [&](int64_t begin, int64_t end, GradSums<T>* out) {
                for (int64_t r = begin; r < end; ++r)
                    for (int64_t c = 0; c < channels; ++c) {
                        const T entry = g[r * channels + c];
                        out[c].g += entry;
                        out[c].gx += entry * ((x[r * channels + c] - mean[c]) * invstd[c]);
                    }
            });
        const int64_t chunks = norm_chunks(rows);
        for (int64_t c = 0; c < channels; ++c)
            for (int64_t chunk = 0; chunk < chunks; ++chunk) {
                sums[c].g += partial[chunk * channels + c].g;
                sums[c].gx += partial[chunk * channels + c].gx;
            }
    }
    if (a.grad_weight != nullptr)
        for (int64_t c = 0; c < channels; ++c) static_cast<T*>(a.grad_weight)[c] = sums[c].gx;
    if (a.grad_bias != nullptr)
        for (int64_t c = 0; c < channels; ++c) static_cast<T*>(a.grad_bias)[c] = sums[c].g;
    if (a.grad_input == nullptr) return;
    T* dx = static_cast<T*>(a.grad_input);
    const T inverse_rows = rows > 0 ? T(1) / static_cast<T>(rows) : T(0);
    std::vector<T> mean_g(static_cast<size_t>(channels), T(0)), mean_gx(static_cast<size_t>(channels), T(0));
    if (a.training)
        for (int64_t c = 0; c < channels; ++c) {
            mean_g[c] = sums[c].g * inverse_rows;
            mean_gx[c] = sums[c].gx * inverse_rows;
        }
#pragma omp parallel for schedule(static) if (rows * channels >= cpu::kSerialThreshold)
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < channels; ++c) {
            const T xhat = (x[r * channels + c] - mean[c]) * invstd[c];
            dx[r * channels + c] = affine.scale[c] * (g[r * channels + c] - mean_g[c] - xhat * mean_gx[c]);
        }
}

}  // namespace

void CpuBackend::batch_norm_forward(const BatchNormForward& args, const Context&) {
    if (args.dtype == DType::Float64)
        forward_typed<double>(args);
    else
        forward_typed<float>(args);
}

void CpuBackend::batch_norm_backward(const BatchNormBackward& args, const Context&) {
    if (args.dtype == DType::Float64)
        backward_typed<double>(args);
    else
        backward_typed<float>(args);
}

}  // namespace sparsegrid::detail
