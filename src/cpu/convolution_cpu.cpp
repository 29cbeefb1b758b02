// CPU execution of convolutions over a neighbour map, output stationary: each output row is computed by
// one thread, in a fixed order, so results do not depend on the thread count.
#include "backend/backend.h"
#include "core/errors.h"
#include "cpu/parallel.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace sparsegrid::detail::cpu {

namespace {

/// Weights repacked as [volume][x_channels][out_channels], so the innermost loop runs over contiguous
/// output channels.
template <typename T>
std::vector<T> pack_weight(const T* weight, int32_t volume, int64_t in_channels, int64_t out_channels,
                           bool transpose_weight, bool reverse_taps) {
    const int64_t x_channels = transpose_weight ? out_channels : in_channels;
    const int64_t y_channels = transpose_weight ? in_channels : out_channels;
    std::vector<T> packed(static_cast<size_t>(volume * x_channels * y_channels));
    for (int64_t co = 0; co < out_channels; ++co)
        for (int64_t ci = 0; ci < in_channels; ++ci)
            for (int32_t t = 0; t < volume; ++t) {
                const T w = weight[(co * in_channels + ci) * volume + t];
                const int64_t xi = transpose_weight ? co : ci;
                const int64_t yi = transpose_weight ? ci : co;
                const int64_t tap = reverse_taps ? volume - 1 - t : t;
                packed[(tap * x_channels + xi) * y_channels + yi] = w;
            }
    return packed;
}

/// out[r, o0 .. o0 + W) for one row r, summed in registers: over taps, then input channels, in order
/// (the order of every backend), so that blocking the output channels changes no result.
template <typename T, int W>
void row_block(const int32_t* map, int64_t r, int32_t volume, const T* x, const T* packed, int64_t x_channels,
               int64_t out_channels, int64_t o0, T* y) {
    T acc[W] = {};
    for (int32_t t = 0; t < volume; ++t) {
        const int64_t s = map ? map[r * volume + t] : r;
        if (s < 0) continue;
        const T* xs = x + s * x_channels;
        const T* w = packed + t * x_channels * out_channels + o0;
        for (int64_t c = 0; c < x_channels; ++c) {
            const T xv = xs[c];
            const T* wrow = w + c * out_channels;
            for (int j = 0; j < W; ++j) acc[j] += xv * wrow[j];
        }
    }
    for (int j = 0; j < W; ++j) y[o0 + j] = acc[j];
}

/// The same for the last out_channels - o0 (< 8) channels, accumulated in the output row.
template <typename T>
void row_tail(const int32_t* map, int64_t r, int32_t volume, const T* x, const T* packed, int64_t x_channels,
              int64_t out_channels, int64_t o0, T* y) {
    std::fill(y + o0, y + out_channels, T(0));
    for (int32_t t = 0; t < volume; ++t) {
        const int64_t s = map ? map[r * volume + t] : r;
        if (s < 0) continue;
        const T* xs = x + s * x_channels;
        const T* w = packed + t * x_channels * out_channels;
        for (int64_t c = 0; c < x_channels; ++c) {
            const T xv = xs[c];
            const T* wrow = w + c * out_channels;
            for (int64_t o = o0; o < out_channels; ++o) y[o] += xv * wrow[o];
        }
    }
}

template <typename T>
void map_convolution_typed(const int32_t* map, int64_t rows, int32_t volume, const T* x, const T* weight,
                           bool transpose_weight, bool reverse_taps, T* out, int64_t x_channels, int64_t out_channels) {
    const int64_t in_channels = transpose_weight ? out_channels : x_channels;
    const int64_t weight_out = transpose_weight ? x_channels : out_channels;
    const std::vector<T> packed = pack_weight(weight, volume, in_channels, weight_out, transpose_weight, reverse_taps);
    // Output channels in register blocks of 32, 16 and 8 (the sums stay out of memory), then the rest.
    parallel_chunks(rows, [&](int64_t begin, int64_t end, int, int) {
        for (int64_t r = begin; r < end; ++r) {
            T* y = out + r * out_channels;
            int64_t o0 = 0;
            for (; o0 + 32 <= out_channels; o0 += 32)
                row_block<T, 32>(map, r, volume, x, packed.data(), x_channels, out_channels, o0, y);
            if (o0 + 16 <= out_channels) {
                row_block<T, 16>(map, r, volume, x, packed.data(), x_channels, out_channels, o0, y);
                o0 += 16;
            }
            if (o0 + 8 <= out_channels) {
                row_block<T, 8>(map, r, volume, x, packed.data(), x_channels, out_channels, o0, y);
                o0 += 8;
            }
            if (o0 < out_channels) row_tail(map, r, volume, x, packed.data(), x_channels, out_channels, o0, y);
        }
    });
}

/// sum[i][j] += sum over the chunk's edges e, in order, of g[e][i] * x[e][j] for i in [0, cols_g), j in
/// [0, cols_x): the chunk's gathered rows (g: leading dimension ldg, x: ldx) against the accumulators
/// (leading dimension ldsum). Register tiles of 4 x (32 bytes of T) with the sums loaded once per
/// chunk; every element still adds the edges one by one in chunk order.
template <typename T>
void accumulate_chunk(const T* g, int64_t ldg, int64_t cols_g, const T* x, int64_t ldx, int64_t cols_x, int64_t edges,
                      T* sum, int64_t ldsum) {
    constexpr int R = 4;
    constexpr int W = 32 / static_cast<int>(sizeof(T));
    // Elements [i_begin, i_end) x [j_begin, j_end) one at a time: the edges of tiles that do not fill.
    const auto scalar = [&](int64_t i_begin, int64_t i_end, int64_t j_begin, int64_t j_end) {
        for (int64_t i = i_begin; i < i_end; ++i)
            for (int64_t j = j_begin; j < j_end; ++j) {
                T acc = sum[i * ldsum + j];
                for (int64_t e = 0; e < edges; ++e) acc += g[e * ldg + i] * x[e * ldx + j];
                sum[i * ldsum + j] = acc;
            }
    };
    int64_t i0 = 0;
    for (; i0 + R <= cols_g; i0 += R) {
        int64_t j0 = 0;
        for (; j0 + W <= cols_x; j0 += W) {
            T acc[R][W];
            for (int i = 0; i < R; ++i)
                for (int j = 0; j < W; ++j) acc[i][j] = sum[(i0 + i) * ldsum + j0 + j];
            for (int64_t e = 0; e < edges; ++e) {
                const T* xe = x + e * ldx + j0;
                const T* ge = g + e * ldg + i0;
                for (int i = 0; i < R; ++i) {
                    const T gi = ge[i];
                    for (int j = 0; j < W; ++j) acc[i][j] += gi * xe[j];
                }
            }
            for (int i = 0; i < R; ++i)
                for (int j = 0; j < W; ++j) sum[(i0 + i) * ldsum + j0 + j] = acc[i][j];
        }
        scalar(i0, i0 + R, j0, cols_x);
    }
    scalar(i0, cols_g, 0, cols_x);
}

template <typename T>
void map_weight_gradient_typed(const int32_t* map, int64_t rows, int32_t volume, const T* x, const T* grad,
                               T* grad_weight, int64_t in_channels, int64_t out_channels) {
    // One task per (tap, block of output channels): a single pass over the rows in increasing order
    // accumulates the block's [channels, in_channels] outer products, so every sum has a fixed order.
    // The rows with an edge at the tap are taken in chunks, gathered into contiguous scratch rows and
    // multiplied in register tiles (accumulate_chunk); the order of every sum is unchanged.
    constexpr int64_t kChunk = 64;
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
        const int64_t width = co_end - co_begin;
        std::vector<T> sum(static_cast<size_t>(width * in_channels), T(0));
        std::vector<T> xs(static_cast<size_t>(kChunk * in_channels)), gs(static_cast<size_t>(kChunk * width));
        int64_t edges = 0;
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t s = map ? map[r * volume + t] : r;
            if (s >= 0) {
                std::copy(x + s * in_channels, x + (s + 1) * in_channels, xs.data() + edges * in_channels);
                std::copy(grad + r * out_channels + co_begin, grad + r * out_channels + co_end,
                          gs.data() + edges * width);
                ++edges;
            }
            if (edges == kChunk || (r + 1 == rows && edges > 0)) {
                accumulate_chunk(gs.data(), width, width, xs.data(), in_channels, in_channels, edges, sum.data(),
                                 in_channels);
                edges = 0;
            }
        }
        for (int64_t co = co_begin; co < co_end; ++co)
            for (int64_t ci = 0; ci < in_channels; ++ci)
                grad_weight[(co * in_channels + ci) * volume + t] = sum[(co - co_begin) * in_channels + ci];
    }
}

}  // namespace

}  // namespace sparsegrid::detail::cpu

// ---- backend entry points -------------------------------------------------------------------------

namespace sparsegrid::detail {

using namespace cpu;

Buffer<int32_t> CpuBackend::tap_major_map(const int32_t* map, int64_t rows, int32_t volume, const Context& ctx) {
    Buffer<int32_t> out = Buffer<int32_t>::allocate(rows * volume, ctx);
    int32_t* data = out.data();
    parallel_chunks(rows, [&](int64_t begin, int64_t end, int, int) {
        for (int64_t r = begin; r < end; ++r)
            for (int32_t t = 0; t < volume; ++t) data[int64_t{t} * rows + r] = map[r * volume + t];
    });
    return out;
}

Buffer<int32_t> CpuBackend::row_order(const int32_t* map, int64_t rows, int32_t volume, const Context& ctx) {
    // Rows stably sorted by their tap sets (bit t for tap t), the permutation the CUDA backend builds.
    std::vector<uint64_t> taps(static_cast<size_t>(rows), 0);
    parallel_chunks(rows, [&](int64_t begin, int64_t end, int, int) {
        for (int64_t r = begin; r < end; ++r)
            for (int32_t t = 0; t < volume; ++t)
                if (map[r * volume + t] >= 0) taps[r] |= uint64_t{1} << t;
    });
    std::vector<int32_t> order(static_cast<size_t>(rows));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return taps[a] < taps[b]; });
    return Buffer<int32_t>::from_host(order, ctx);
}

void CpuBackend::map_convolution(const MapConvolution& args, const Context&) {
    // Each row is summed in place whatever the order, so the CPU takes rows in voxel order.
    if (args.scatter) throw_error("the CPU backend has no scatter mode (the front end gathers on the CPU)");
    if (args.dtype == DType::Float32)
        map_convolution_typed(args.map, args.rows, args.volume, static_cast<const float*>(args.x),
                              static_cast<const float*>(args.weight), args.transpose_weight, args.reverse_taps,
                              static_cast<float*>(args.out), args.x_channels, args.out_channels);
    else
        map_convolution_typed(args.map, args.rows, args.volume, static_cast<const double*>(args.x),
                              static_cast<const double*>(args.weight), args.transpose_weight, args.reverse_taps,
                              static_cast<double*>(args.out), args.x_channels, args.out_channels);
}

void CpuBackend::map_weight_gradient(const MapWeightGradient& args, const Context&) {
    if (args.rows_are_source)
        throw_error("the CPU backend sums the weight gradient over target rows (rows_are_source is CUDA only)");
    if (args.dtype == DType::Float32)
        map_weight_gradient_typed(args.map, args.rows, args.volume, static_cast<const float*>(args.x),
                                  static_cast<const float*>(args.grad), static_cast<float*>(args.grad_weight),
                                  args.in_channels, args.out_channels);
    else
        map_weight_gradient_typed(args.map, args.rows, args.volume, static_cast<const double*>(args.x),
                                  static_cast<const double*>(args.grad), static_cast<double*>(args.grad_weight),
                                  args.in_channels, args.out_channels);
}

std::vector<std::string> CpuBackend::engine_configurations() { return {}; }

void CpuBackend::force_engine_configuration(const std::string& name) {
    if (!name.empty() && name != "auto" && name != "off")
        throw_error("configuration must be auto or off (the CPU has no tensor-core engine), got '", name, "'");
}

void CpuBackend::set_engine_tuning(bool, const std::string&) {}  // the CPU kernels have nothing to tune

}  // namespace sparsegrid::detail
