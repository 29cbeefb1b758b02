// The CPU backend's batch normalization: the chunks of core/batch_norm_math.h reduced in parallel (one
// chunk per task, rows in order inside it), combined in chunk order, then the rows normalized in
// parallel. Float32 features sum in float32 like the CUDA backend; results do not depend on the threads.
#include "backend/backend.h"
#include "core/batch_norm_math.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace sparsegrid::detail {

namespace {

/// Per-channel partial results of every chunk, [chunks x channels], combined into `total` in chunk order.
template <typename Item, typename Reduce>
std::vector<Item> reduce_chunks(int64_t rows, int64_t channels, Reduce&& reduce_row) {
    const int64_t chunk_rows = norm_chunk_rows(rows), chunks = norm_chunks(rows);
    std::vector<Item> partial(static_cast<size_t>(chunks * channels));
#pragma omp parallel for schedule(static) if (rows * channels >= (int64_t{1} << 16))
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        Item* out = partial.data() + chunk * channels;
        const int64_t end = std::min(rows, (chunk + 1) * chunk_rows);
        for (int64_t r = chunk * chunk_rows; r < end; ++r) reduce_row(r, out);
    }
    return partial;
}

template <typename T>
void forward_typed(const BatchNormForward& a) {
    const T* x = static_cast<const T*>(a.input);
    T* y = static_cast<T*>(a.output);
    const T* weight = static_cast<const T*>(a.weight);
    const T* bias = static_cast<const T*>(a.bias);
    T* running_mean = static_cast<T*>(a.running_mean);
    T* running_var = static_cast<T*>(a.running_var);
    T* save_mean = static_cast<T*>(a.save_mean);
    T* save_invstd = static_cast<T*>(a.save_invstd);
    const int64_t rows = a.rows, channels = a.channels;
    const T eps = static_cast<T>(a.eps);
    if (a.training) {
        const std::vector<Moments<T>> partial = reduce_chunks<Moments<T>>(rows, channels,
                                                                          [&](int64_t r, Moments<T>* out) {
                                                                              for (int64_t c = 0; c < channels; ++c)
                                                                                  out[c].add(x[r * channels + c]);
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
    const Activation activation = a.activation;
    const T parameter = static_cast<T>(a.activation_parameter);
#pragma omp parallel for schedule(static) if (rows * channels >= (int64_t{1} << 16))
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < channels; ++c) {
            const T scale = weight != nullptr ? save_invstd[c] * weight[c] : save_invstd[c];
            const T z = (x[r * channels + c] - save_mean[c]) * scale + (bias != nullptr ? bias[c] : T(0));
            y[r * channels + c] = activation_value(activation, z, parameter);
        }
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
    const T* bias = static_cast<const T*>(a.bias);
    const T* mean = static_cast<const T*>(a.save_mean);
    const T* invstd = static_cast<const T*>(a.save_invstd);
    const int64_t rows = a.rows, channels = a.channels;
    const Activation activation = a.activation;
    const T parameter = static_cast<T>(a.activation_parameter);
    const auto w = [&](int64_t c) { return weight != nullptr ? weight[c] : T(1); };
    // xhat and g of one entry: the forward pass's arithmetic again.
    const auto entry = [&](int64_t r, int64_t c, T& xhat) {
        xhat = (x[r * channels + c] - mean[c]) * invstd[c];
        const T z = (x[r * channels + c] - mean[c]) * (invstd[c] * w(c)) + (bias != nullptr ? bias[c] : T(0));
        return dy[r * channels + c] * activation_derivative(activation, z, parameter);
    };
    const bool sums_needed = a.grad_weight != nullptr || a.grad_bias != nullptr || (a.training && a.grad_input);
    std::vector<GradSums<T>> sums(static_cast<size_t>(channels));
    if (sums_needed && rows > 0) {
        const std::vector<GradSums<T>> partial = reduce_chunks<GradSums<T>>(rows, channels,
                                                                            [&](int64_t r, GradSums<T>* out) {
                                                                                for (int64_t c = 0; c < channels; ++c) {
                                                                                    T xhat;
                                                                                    const T g = entry(r, c, xhat);
                                                                                    out[c].g += g;
                                                                                    out[c].gx += g * xhat;
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
#pragma omp parallel for schedule(static) if (rows * channels >= (int64_t{1} << 16))
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < channels; ++c) {
            T xhat;
            const T g = entry(r, c, xhat);
            const T scale = invstd[c] * w(c);
            dx[r * channels + c] = a.training
                ? scale * (g - sums[c].g * inverse_rows - xhat * (sums[c].gx * inverse_rows))
                : scale * g;
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
