#include "cpu/convolution_cpu.h"

#include "cpu/parallel.h"

#include <algorithm>
#include <vector>

namespace sparsegrid::detail::cpu {

namespace {

/// Weights repacked as [volume][x_channels][out_channels], so the innermost loop runs over contiguous
/// output channels.
template <typename T>
std::vector<T> pack_weight(const T* weight, int32_t volume, int64_t in_channels, int64_t out_channels,
                           bool transpose_weight) {
    const int64_t x_channels = transpose_weight ? out_channels : in_channels;
    const int64_t y_channels = transpose_weight ? in_channels : out_channels;
    std::vector<T> packed(static_cast<size_t>(volume * x_channels * y_channels));
    for (int64_t co = 0; co < out_channels; ++co)
        for (int64_t ci = 0; ci < in_channels; ++ci)
            for (int32_t t = 0; t < volume; ++t) {
                const T w = weight[(co * in_channels + ci) * volume + t];
                const int64_t xi = transpose_weight ? co : ci;
                const int64_t yi = transpose_weight ? ci : co;
                packed[(t * x_channels + xi) * y_channels + yi] = w;
            }
    return packed;
}

template <typename T>
void map_convolution_typed(const int32_t* map, int64_t rows, int32_t volume, const T* x, const T* weight,
                           bool transpose_weight, T* out, int64_t x_channels, int64_t out_channels) {
    const int64_t in_channels = transpose_weight ? out_channels : x_channels;
    const int64_t weight_out = transpose_weight ? x_channels : out_channels;
    const std::vector<T> packed = pack_weight(weight, volume, in_channels, weight_out, transpose_weight);
    parallel_chunks(rows, [&](int64_t begin, int64_t end, int, int) {
        for (int64_t r = begin; r < end; ++r) {
            T* y = out + r * out_channels;
            std::fill(y, y + out_channels, T(0));
            for (int32_t t = 0; t < volume; ++t) {
                const int64_t s = map ? map[r * volume + t] : r;
                if (s < 0) continue;
                const T* xs = x + s * x_channels;
                const T* w = packed.data() + t * x_channels * out_channels;
                for (int64_t c = 0; c < x_channels; ++c) {
                    const T xv = xs[c];
                    const T* wrow = w + c * out_channels;
                    for (int64_t o = 0; o < out_channels; ++o) y[o] += xv * wrow[o];
                }
            }
        }
    });
}

template <typename T>
void map_weight_gradient_typed(const int32_t* map, int64_t rows, int32_t volume, const T* x, const T* grad,
                               T* grad_weight, int64_t in_channels, int64_t out_channels) {
    // One task per (tap, block of output channels): a single pass over the rows in increasing order
    // accumulates the block's [channels, in_channels] outer products, so every sum has a fixed order.
    const int threads = threads_for(rows * volume);
    const int64_t wanted = std::max<int64_t>(1, std::min<int64_t>(out_channels, (2 * threads + volume - 1) / volume));
    const int64_t block = (out_channels + wanted - 1) / wanted;
    // Every block non-empty: with block rounded up, fewer blocks may cover the channels.
    const int64_t blocks_per_tap = (out_channels + block - 1) / block;
    const int64_t tasks = int64_t{volume} * blocks_per_tap;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t task = 0; task < tasks; ++task) {
        const int32_t t = static_cast<int32_t>(task / blocks_per_tap);
        const int64_t co_begin = (task % blocks_per_tap) * block;
        const int64_t co_end = std::min(out_channels, co_begin + block);
        std::vector<T> sum(static_cast<size_t>((co_end - co_begin) * in_channels), T(0));
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t s = map ? map[r * volume + t] : r;
            if (s < 0) continue;
            const T* xs = x + s * in_channels;
            const T* g = grad + r * out_channels;
            for (int64_t co = co_begin; co < co_end; ++co) {
                const T gv = g[co];
                T* acc = sum.data() + (co - co_begin) * in_channels;
                for (int64_t ci = 0; ci < in_channels; ++ci) acc[ci] += gv * xs[ci];
            }
        }
        for (int64_t co = co_begin; co < co_end; ++co)
            for (int64_t ci = 0; ci < in_channels; ++ci)
                grad_weight[(co * in_channels + ci) * volume + t] = sum[(co - co_begin) * in_channels + ci];
    }
}

}  // namespace

void map_convolution(const int32_t* map, int64_t rows, int32_t volume, const void* x, const void* weight,
                     bool transpose_weight, void* out, int64_t x_channels, int64_t out_channels, DType dtype,
                     const Context&) {
    if (dtype == DType::Float32)
        map_convolution_typed(map, rows, volume, static_cast<const float*>(x), static_cast<const float*>(weight),
                              transpose_weight, static_cast<float*>(out), x_channels, out_channels);
    else
        map_convolution_typed(map, rows, volume, static_cast<const double*>(x), static_cast<const double*>(weight),
                              transpose_weight, static_cast<double*>(out), x_channels, out_channels);
}

void map_weight_gradient(const int32_t* map, int64_t rows, int32_t volume, const void* x, const void* grad,
                         void* grad_weight, int64_t in_channels, int64_t out_channels, DType dtype,
                         const Context&) {
    if (dtype == DType::Float32)
        map_weight_gradient_typed(map, rows, volume, static_cast<const float*>(x), static_cast<const float*>(grad),
                                  static_cast<float*>(grad_weight), in_channels, out_channels);
    else
        map_weight_gradient_typed(map, rows, volume, static_cast<const double*>(x), static_cast<const double*>(grad),
                                  static_cast<double*>(grad_weight), in_channels, out_channels);
}

}  // namespace sparsegrid::detail::cpu
