// The CUDA backend's batch normalization: per-chunk partial results (a block per chunk and 32 channels,
// eight row lanes combined in lane order), a per-channel combination of the chunks in chunk order (a
// block per channel, its threads' strided shares combined in a fixed tree), and an elementwise pass.
// Every sum's order is fixed by the row count (core/batch_norm_math.h): bitwise reproducible, no atomics.
#include "backend/backend.h"
#include "core/batch_norm_math.h"
#include "cuda/conv_tiles.cuh"
#include "cuda/cuda_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace sparsegrid::detail::cuda {

namespace {

/// Channels per block of the chunk passes (a warp's lanes) and row lanes per block.
constexpr int kNormChannels = 32;
constexpr int kNormRowLanes = 8;
/// Threads of a combining block (one channel).
constexpr int kCombineThreads = 256;

/// The per-channel values every entry needs, read once per thread.
template <typename A>
struct ChannelParameters {
    A mean;
    A invstd;
    A weight;
    A bias;
};

template <typename A>
__device__ __forceinline__ ChannelParameters<A> channel_parameters(const A* mean, const A* invstd, const A* weight,
                                                                   const A* bias, int64_t c) {
    return {mean[c], invstd[c], weight != nullptr ? weight[c] : A(1), bias != nullptr ? bias[c] : A(0)};
}

/// partial[chunk * channels + c] = the moments of channel c over the chunk's rows: row lane l takes rows
/// start + l, start + l + 8, ... in order, and lanes 0..7 are combined in order.
template <typename T, typename A>
__global__ void moments_kernel(const T* __restrict__ x, int64_t rows, int64_t channels, int64_t chunk_rows,
                               Moments<A>* __restrict__ partial) {
    __shared__ Moments<A> lanes[kNormRowLanes][kNormChannels];
    const int64_t c = int64_t{blockIdx.y} * kNormChannels + threadIdx.x;
    const int64_t start = int64_t{blockIdx.x} * chunk_rows;
    const int64_t end = rows < start + chunk_rows ? rows : start + chunk_rows;
    Moments<A> moments{};
    if (c < channels)
        for (int64_t r = start + threadIdx.y; r < end; r += kNormRowLanes) moments.add(to_acc<A>(x[r * channels + c]));
    lanes[threadIdx.y][threadIdx.x] = moments;
    __syncthreads();
    if (threadIdx.y == 0 && c < channels) {
        for (int l = 1; l < kNormRowLanes; ++l) moments.combine(lanes[l][threadIdx.x]);
        partial[int64_t{blockIdx.x} * channels + c] = moments;
    }
}

/// Sums of g and g * xhat per chunk and channel, the lanes as in moments_kernel.
template <typename A>
struct GradSums {
    A g;
    A gx;
};

template <typename T, typename A>
__global__ void grad_sums_kernel(const T* __restrict__ dy, const T* __restrict__ x, int64_t rows, int64_t channels,
                                 int64_t chunk_rows, const A* __restrict__ mean, const A* __restrict__ invstd,
                                 const A* __restrict__ weight, const A* __restrict__ bias, Activation activation,
                                 A parameter, GradSums<A>* __restrict__ partial) {
    __shared__ GradSums<A> lanes[kNormRowLanes][kNormChannels];
    const int64_t c = int64_t{blockIdx.y} * kNormChannels + threadIdx.x;
    const int64_t start = int64_t{blockIdx.x} * chunk_rows;
    const int64_t end = rows < start + chunk_rows ? rows : start + chunk_rows;
    GradSums<A> sums{A(0), A(0)};
    if (c < channels) {
        const ChannelParameters<A> p = channel_parameters(mean, invstd, weight, bias, c);
        for (int64_t r = start + threadIdx.y; r < end; r += kNormRowLanes) {
            const A centred = to_acc<A>(x[r * channels + c]) - p.mean;
            const A xhat = centred * p.invstd;
            const A z = centred * (p.invstd * p.weight) + p.bias;
            const A g = to_acc<A>(dy[r * channels + c]) * activation_derivative(activation, z, parameter);
            sums.g += g;
            sums.gx += g * xhat;
        }
    }
    lanes[threadIdx.y][threadIdx.x] = sums;
    __syncthreads();
    if (threadIdx.y == 0 && c < channels) {
        for (int l = 1; l < kNormRowLanes; ++l) {
            sums.g += lanes[l][threadIdx.x].g;
            sums.gx += lanes[l][threadIdx.x].gx;
        }
        partial[int64_t{blockIdx.x} * channels + c] = sums;
    }
}

/// One block per channel: thread t combines chunks t, t + 256, ... in order, then the threads' results
/// are combined pairwise (t with t + s for s = 128, 64, ..., 1), the lower thread's values first.
template <typename Item, typename Combine>
__device__ Item combine_chunks(const Item* partial, int64_t chunks, int64_t channels, int64_t c, Item item,
                               Combine&& combine) {
    __shared__ Item shared[kCombineThreads];
    for (int64_t chunk = threadIdx.x; chunk < chunks; chunk += kCombineThreads)
        combine(item, partial[chunk * channels + c]);
    shared[threadIdx.x] = item;
    __syncthreads();
    for (int stride = kCombineThreads / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            Item merged = shared[threadIdx.x];
            combine(merged, shared[threadIdx.x + stride]);
            shared[threadIdx.x] = merged;
        }
        __syncthreads();
    }
    return shared[0];
}

/// save_mean / save_invstd of each channel (a block per channel) from the batch, and the running
/// statistics' update. The counter is read here and incremented by the elementwise pass, after every
/// block of this one has read it.
template <typename A>
__global__ void batch_statistics_kernel(const Moments<A>* __restrict__ partial, int64_t chunks, int64_t channels, A eps,
                                        A momentum, bool cumulative_average,
                                        const int64_t* __restrict__ num_batches_tracked, A* __restrict__ running_mean,
                                        A* __restrict__ running_var, A* __restrict__ save_mean,
                                        A* __restrict__ save_invstd) {
    const int64_t c = blockIdx.x;
    const Moments<A> total = combine_chunks(partial, chunks, channels, c, Moments<A>{},
                                            [](Moments<A>& into, const Moments<A>& next) { into.combine(next); });
    if (threadIdx.x != 0) return;
    save_mean[c] = total.mean;
    save_invstd[c] = A(1) / sqrt((total.count > A(0) ? total.m2 / total.count : A(0)) + eps);
    if (running_mean != nullptr && total.count > A(0)) {
        A factor = momentum;
        if (cumulative_average) factor = A(1) / static_cast<A>(*num_batches_tracked + 1);
        running_mean[c] = (A(1) - factor) * running_mean[c] + factor * total.mean;
        running_var[c] = (A(1) - factor) * running_var[c] + factor * (total.m2 / (total.count - A(1)));
    }
}

/// Evaluation: save_mean / save_invstd from the running statistics, a thread per channel.
template <typename A>
__global__ void running_statistics_kernel(int64_t channels, A eps, const A* __restrict__ running_mean,
                                          const A* __restrict__ running_var, A* __restrict__ save_mean,
                                          A* __restrict__ save_invstd) {
    SG_GRID_STRIDE_LOOP(c, channels) {
        save_mean[c] = running_mean[c];
        save_invstd[c] = A(1) / sqrt(running_var[c] + eps);
    }
}

template <typename T, typename A>
__global__ void normalize_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t channels,
                                 const A* __restrict__ mean, const A* __restrict__ invstd, const A* __restrict__ weight,
                                 const A* __restrict__ bias, Activation activation, A parameter,
                                 int64_t* __restrict__ num_batches_tracked) {
    if (num_batches_tracked != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *num_batches_tracked += 1;
    const int64_t entries = rows * channels;
    SG_GRID_STRIDE_LOOP(i, entries) {
        const int64_t r = divide(i, channels), c = i - r * channels;
        const ChannelParameters<A> p = channel_parameters(mean, invstd, weight, bias, c);
        const A z = (to_acc<A>(x[i]) - p.mean) * (p.invstd * p.weight) + p.bias;
        y[i] = from_acc<T, A>(activation_value(activation, z, parameter));
    }
}

/// Per channel: grad_weight, grad_bias, and the two means the input gradient subtracts.
template <typename A>
__global__ void grad_statistics_kernel(const GradSums<A>* __restrict__ partial, int64_t chunks, int64_t channels,
                                       A inverse_rows, A* __restrict__ grad_weight, A* __restrict__ grad_bias,
                                       A* __restrict__ means) {
    const int64_t c = blockIdx.x;
    const GradSums<A> total = combine_chunks(partial, chunks, channels, c, GradSums<A>{A(0), A(0)},
                                             [](GradSums<A>& into, const GradSums<A>& next) {
                                                 into.g += next.g;
                                                 into.gx += next.gx;
                                             });
    if (threadIdx.x != 0) return;
    if (grad_weight != nullptr) grad_weight[c] = total.gx;
    if (grad_bias != nullptr) grad_bias[c] = total.g;
    means[c] = total.g * inverse_rows;
    means[channels + c] = total.gx * inverse_rows;
}

/// grad_input: in training (means non-null) scale * (g - mean(g) - xhat * mean(g * xhat)), else scale * g.
template <typename T, typename A>
__global__ void grad_input_kernel(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx, int64_t rows,
                                  int64_t channels, const A* __restrict__ mean, const A* __restrict__ invstd,
                                  const A* __restrict__ weight, const A* __restrict__ bias, Activation activation,
                                  A parameter, const A* __restrict__ means) {
    const int64_t entries = rows * channels;
    SG_GRID_STRIDE_LOOP(i, entries) {
        const int64_t r = divide(i, channels), c = i - r * channels;
        const ChannelParameters<A> p = channel_parameters(mean, invstd, weight, bias, c);
        const A centred = to_acc<A>(x[i]) - p.mean;
        const A scale = p.invstd * p.weight;
        const A g = to_acc<A>(dy[i]) * activation_derivative(activation, centred * scale + p.bias, parameter);
        const A result = means != nullptr ? scale * (g - means[c] - centred * p.invstd * means[channels + c])
                                          : scale * g;
        dx[i] = from_acc<T, A>(result);
    }
}

dim3 chunk_grid(int64_t chunks, int64_t channels) {
    return dim3(static_cast<unsigned>(chunks), static_cast<unsigned>((channels + kNormChannels - 1) / kNormChannels));
}

/// The grids' limits: a block per channel, and 32 channels per block row of the chunk passes.
void check_channels(int64_t channels) {
    if (channels > int64_t{65535} * kNormChannels)
        throw_error("channels must be at most ", int64_t{65535} * kNormChannels, " on CUDA, got ", channels);
}

template <typename T>
void forward_typed(const BatchNormForward& a, const Context& ctx) {
    using A = typename AccumulatorOf<T>::type;
    check_channels(a.channels);
    const cudaStream_t stream = stream_of(ctx);
    const int64_t chunks = a.training ? norm_chunks(a.rows) : 0;
    Buffer<Moments<A>> partial = Buffer<Moments<A>>::allocate(chunks * a.channels, ctx);
    if (chunks > 0) {
        moments_kernel<T, A><<<chunk_grid(chunks, a.channels), dim3(kNormChannels, kNormRowLanes), 0, stream>>>(
            static_cast<const T*>(a.input), a.rows, a.channels, norm_chunk_rows(a.rows), partial.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    A* save_mean = static_cast<A*>(a.save_mean);
    A* save_invstd = static_cast<A*>(a.save_invstd);
    if (a.training)
        batch_statistics_kernel<A><<<static_cast<unsigned>(a.channels), kCombineThreads, 0, stream>>>(
            partial.data(), chunks, a.channels, static_cast<A>(a.eps), static_cast<A>(a.momentum), a.cumulative_average,
            a.num_batches_tracked, static_cast<A*>(a.running_mean), static_cast<A*>(a.running_var), save_mean,
            save_invstd);
    else
        running_statistics_kernel<A><<<blocks_for(a.channels), kThreads, 0, stream>>>(
            a.channels, static_cast<A>(a.eps), static_cast<const A*>(a.running_mean),
            static_cast<const A*>(a.running_var), save_mean, save_invstd);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    normalize_kernel<T, A><<<blocks_for(a.rows * a.channels), kThreads, 0, stream>>>(
        static_cast<const T*>(a.input), static_cast<T*>(a.output), a.rows, a.channels, save_mean, save_invstd,
        static_cast<const A*>(a.weight), static_cast<const A*>(a.bias), a.activation,
        static_cast<A>(a.activation_parameter), a.training ? a.num_batches_tracked : nullptr);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

template <typename T>
void backward_typed(const BatchNormBackward& a, const Context& ctx) {
    using A = typename AccumulatorOf<T>::type;
    check_channels(a.channels);
    const cudaStream_t stream = stream_of(ctx);
    const A* mean = static_cast<const A*>(a.save_mean);
    const A* invstd = static_cast<const A*>(a.save_invstd);
    const A* weight = static_cast<const A*>(a.weight);
    const A* bias = static_cast<const A*>(a.bias);
    const A parameter = static_cast<A>(a.activation_parameter);
    const bool sums_needed = a.grad_weight != nullptr || a.grad_bias != nullptr ||
        (a.training && a.grad_input != nullptr);
    Buffer<A> means;
    if (sums_needed) {
        const int64_t chunks = norm_chunks(a.rows);
        Buffer<GradSums<A>> partial = Buffer<GradSums<A>>::allocate(chunks * a.channels, ctx);
        if (chunks > 0) {
            grad_sums_kernel<T, A><<<chunk_grid(chunks, a.channels), dim3(kNormChannels, kNormRowLanes), 0, stream>>>(
                static_cast<const T*>(a.grad_output), static_cast<const T*>(a.input), a.rows, a.channels,
                norm_chunk_rows(a.rows), mean, invstd, weight, bias, a.activation, parameter, partial.data());
            SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
        }
        means = Buffer<A>::allocate(2 * a.channels, ctx);
        grad_statistics_kernel<A><<<static_cast<unsigned>(a.channels), kCombineThreads, 0, stream>>>(
            partial.data(), chunks, a.channels, a.rows > 0 ? A(1) / static_cast<A>(a.rows) : A(0),
            static_cast<A*>(a.grad_weight), static_cast<A*>(a.grad_bias), means.data());
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    if (a.grad_input == nullptr || a.rows == 0) return;
    grad_input_kernel<T, A><<<blocks_for(a.rows * a.channels), kThreads, 0, stream>>>(
        static_cast<const T*>(a.grad_output), static_cast<const T*>(a.input), static_cast<T*>(a.grad_input), a.rows,
        a.channels, mean, invstd, weight, bias, a.activation, parameter, a.training ? means.data() : nullptr);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

template <template <typename> class Fn, typename Args>
void by_dtype(const Args& args, const Context& ctx) {
    switch (args.dtype) {
    case DType::Float32:
        return Fn<float>::run(args, ctx);
    case DType::Float64:
        return Fn<double>::run(args, ctx);
    case DType::Float16:
        return Fn<__half>::run(args, ctx);
    case DType::BFloat16:
        return Fn<__nv_bfloat16>::run(args, ctx);
    }
}

template <typename T>
struct Forward {
    static void run(const BatchNormForward& args, const Context& ctx) { forward_typed<T>(args, ctx); }
};
template <typename T>
struct Backward {
    static void run(const BatchNormBackward& args, const Context& ctx) { backward_typed<T>(args, ctx); }
};

}  // namespace

}  // namespace sparsegrid::detail::cuda

namespace sparsegrid::detail {

using namespace cuda;

// Training: three launches (chunk moments, per-channel statistics, the elementwise pass); evaluation:
// two. No sync.
void CudaBackend::batch_norm_forward(const BatchNormForward& args, const Context& ctx) {
    DeviceGuard guard(ctx);
    by_dtype<Forward>(args, ctx);
}

// Up to three launches (chunk sums, per-channel sums, the input gradient). No sync.
void CudaBackend::batch_norm_backward(const BatchNormBackward& args, const Context& ctx) {
    DeviceGuard guard(ctx);
    by_dtype<Backward>(args, ctx);
}

}  // namespace sparsegrid::detail
