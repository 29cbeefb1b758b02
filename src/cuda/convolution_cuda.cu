// CUDA convolution over a neighbour map.
//
// Forward and input gradient: one output-stationary gathered GEMM. A block owns BM output rows x BN
// output channels; for each tap it loads the rows' source indices, skips the tap when no row of the
// block has an edge there, and multiplies the gathered input rows by the tap's packed weights through
// shared-memory tiles. Every output element is summed by one thread in the order (tap, channel).
//
// Weight gradient: per tap, a GEMM over the rows that have an edge at that tap. Rows are split into a
// shape-determined number of chunks; each block compacts its chunk's edges (block scan, order kept),
// accumulates a 32 x 32 tile of [in_channels, out_channels] and writes it to its own slot; a second
// kernel adds the slots in chunk order. No atomics anywhere, so every result is bitwise reproducible.
#include "cuda/convolution_cuda.h"

#include "cuda/cuda_common.cuh"

#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace sparsegrid::detail::cuda {

namespace {

constexpr int kConvThreads = 256;

template <typename T>
struct AccumulatorOf {
    using type = float;
};
template <>
struct AccumulatorOf<double> {
    using type = double;
};

template <typename A, typename T>
__device__ __forceinline__ A to_acc(T v) {
    return static_cast<A>(v);
}
template <>
__device__ __forceinline__ float to_acc<float, __half>(__half v) {
    return __half2float(v);
}
template <>
__device__ __forceinline__ float to_acc<float, __nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

template <typename T, typename A>
__device__ __forceinline__ T from_acc(A v) {
    return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __half from_acc<__half, float>(float v) {
    return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16, float>(float v) {
    return __float2bfloat16_rn(v);
}

/// packed[(t * x_channels + xi) * y_channels + yi] from weight[(co * in_channels + ci) * volume + t],
/// with (xi, yi) = (ci, co), or (co, ci) when `transpose`.
template <typename T, typename A>
__global__ void pack_weight_kernel(const T* __restrict__ weight, A* __restrict__ packed, int32_t volume,
                                   int64_t in_channels, int64_t out_channels, bool transpose) {
    const int64_t total = int64_t{volume} * in_channels * out_channels;
    SG_GRID_STRIDE_LOOP(n, total) {
        const int64_t t = n % volume;
        const int64_t rest = n / volume;
        const int64_t ci = rest % in_channels;
        const int64_t co = rest / in_channels;
        const int64_t xi = transpose ? co : ci;
        const int64_t yi = transpose ? ci : co;
        const int64_t x_channels = transpose ? out_channels : in_channels;
        const int64_t y_channels = transpose ? in_channels : out_channels;
        packed[(t * x_channels + xi) * y_channels + yi] = to_acc<A>(weight[n]);
    }
}

/// out[r, n] = sum_t sum_k x[map[r][t], k] * packed[t][k][n]; 256 threads, 4 x 4 outputs each.
template <typename T, typename A, int BM, int BN, int BK>
__global__ __launch_bounds__(kConvThreads) void map_conv_kernel(const int32_t* __restrict__ map, int64_t rows,
                                                               int32_t volume, const T* __restrict__ x,
                                                               const A* __restrict__ packed, T* __restrict__ out,
                                                               int32_t x_channels, int32_t y_channels) {
    constexpr int TM = 4;
    constexpr int TN = 4;
    constexpr int kColumns = BN / TN;
    static_assert((BM / TM) * kColumns == kConvThreads, "tile shape must use every thread");
    __shared__ A a_tile[BK][BM + 4];
    __shared__ A b_tile[BK][BN];
    __shared__ int32_t source[BM];

    const int tid = static_cast<int>(threadIdx.x);
    const int ty = tid / kColumns;
    const int tx = tid % kColumns;
    const int64_t row0 = int64_t{blockIdx.x} * BM;
    const int n0 = static_cast<int>(blockIdx.y) * BN;

    A acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = A(0);

    for (int32_t t = 0; t < volume; ++t) {
        int any = 0;
        for (int i = tid; i < BM; i += kConvThreads) {
            const int64_t r = row0 + i;
            int32_t s = -1;
            if (r < rows) s = map ? map[r * volume + t] : static_cast<int32_t>(r);
            source[i] = s;
            any |= s >= 0;
        }
        if (!__syncthreads_or(any)) continue;  // also publishes source[]
        const A* w = packed + int64_t{t} * x_channels * y_channels;
        for (int k0 = 0; k0 < x_channels; k0 += BK) {
            for (int idx = tid; idx < BM * BK; idx += kConvThreads) {
                const int m = idx / BK;
                const int kk = idx % BK;
                const int k = k0 + kk;
                const int32_t s = source[m];
                a_tile[kk][m] = (s >= 0 && k < x_channels) ? to_acc<A>(x[int64_t{s} * x_channels + k]) : A(0);
            }
            for (int idx = tid; idx < BK * BN; idx += kConvThreads) {
                const int kk = idx / BN;
                const int n = idx % BN;
                const int k = k0 + kk;
                b_tile[kk][n] = (k < x_channels && n0 + n < y_channels) ? w[int64_t{k} * y_channels + n0 + n] : A(0);
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < BK; ++kk) {
                A a[TM];
                A b[TN];
#pragma unroll
                for (int i = 0; i < TM; ++i) a[i] = a_tile[kk][ty * TM + i];
#pragma unroll
                for (int j = 0; j < TN; ++j) b[j] = b_tile[kk][tx * TN + j];
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
            }
            __syncthreads();
        }
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int64_t r = row0 + ty * TM + i;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + tx * TN + j;
            if (n < y_channels) out[r * y_channels + n] = from_acc<T>(acc[i][j]);
        }
    }
}

constexpr int kGradTile = 32;
constexpr int kGradScan = 256;

/// partial[chunk][t][ci][co] = sum over the chunk's rows r with an edge at t of x[s, ci] * grad[r, co].
template <typename T, typename A, int BK>
__global__ __launch_bounds__(kConvThreads) void weight_grad_kernel(const int32_t* __restrict__ map, int64_t rows,
                                                                  int32_t volume, const T* __restrict__ x,
                                                                  const T* __restrict__ grad,
                                                                  A* __restrict__ partial, int32_t in_channels,
                                                                  int32_t out_channels, int64_t rows_per_chunk,
                                                                  int32_t tiles_n) {
    constexpr int TM = 2;
    constexpr int TN = 2;
    constexpr int kColumns = kGradTile / TN;
    using BlockScan = cub::BlockScan<int, kConvThreads>;
    __shared__ typename BlockScan::TempStorage scan_storage;
    __shared__ int32_t edge_source[kGradScan];
    __shared__ int64_t edge_row[kGradScan];
    __shared__ A a_tile[BK][kGradTile + 1];
    __shared__ A b_tile[BK][kGradTile + 1];

    const int tid = static_cast<int>(threadIdx.x);
    const int ty = tid / kColumns;
    const int tx = tid % kColumns;
    const int m0 = static_cast<int>(blockIdx.x / tiles_n) * kGradTile;
    const int n0 = static_cast<int>(blockIdx.x % tiles_n) * kGradTile;
    const int64_t chunk = blockIdx.y;
    const int32_t t = static_cast<int32_t>(blockIdx.z);
    const int64_t begin = chunk * rows_per_chunk;
    const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;

    A acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = A(0);

    for (int64_t base = begin; base < end; base += kGradScan) {
        const int64_t r = base + tid;
        int32_t s = -1;
        if (r < end) s = map ? map[r * volume + t] : static_cast<int32_t>(r);
        const int has_edge = s >= 0 ? 1 : 0;
        int position = 0;
        int edges = 0;
        BlockScan(scan_storage).ExclusiveSum(has_edge, position, edges);
        if (has_edge) {
            edge_source[position] = s;
            edge_row[position] = r;
        }
        __syncthreads();
        for (int k0 = 0; k0 < edges; k0 += BK) {
            for (int idx = tid; idx < BK * kGradTile; idx += kConvThreads) {
                const int kk = idx / kGradTile;
                const int c = idx % kGradTile;
                const bool valid = k0 + kk < edges;
                const int ci = m0 + c;
                const int co = n0 + c;
                a_tile[kk][c] = (valid && ci < in_channels)
                                    ? to_acc<A>(x[int64_t{edge_source[k0 + kk]} * in_channels + ci]) : A(0);
                b_tile[kk][c] = (valid && co < out_channels)
                                    ? to_acc<A>(grad[edge_row[k0 + kk] * out_channels + co]) : A(0);
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < BK; ++kk) {
                A a[TM];
                A b[TN];
#pragma unroll
                for (int i = 0; i < TM; ++i) a[i] = a_tile[kk][ty * TM + i];
#pragma unroll
                for (int j = 0; j < TN; ++j) b[j] = b_tile[kk][tx * TN + j];
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
            }
            __syncthreads();
        }
        __syncthreads();  // edge lists and scan storage are reused by the next batch of rows
    }

    A* slot = partial + (chunk * volume + t) * int64_t{in_channels} * out_channels;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int ci = m0 + ty * TM + i;
        if (ci >= in_channels) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int co = n0 + tx * TN + j;
            if (co < out_channels) slot[int64_t{ci} * out_channels + co] = acc[i][j];
        }
    }
}

/// grad_weight[(co * in_channels + ci) * volume + t] = sum over chunks, in order, of partial[chunk][t][ci][co].
template <typename T, typename A>
__global__ void reduce_weight_grad_kernel(const A* __restrict__ partial, int64_t chunks, int32_t volume,
                                          int64_t in_channels, int64_t out_channels, T* __restrict__ grad_weight) {
    const int64_t total = int64_t{volume} * in_channels * out_channels;
    SG_GRID_STRIDE_LOOP(n, total) {
        const int64_t t = n % volume;
        const int64_t rest = n / volume;
        const int64_t ci = rest % in_channels;
        const int64_t co = rest / in_channels;
        A sum = A(0);
        for (int64_t c = 0; c < chunks; ++c) sum += partial[((c * volume + t) * in_channels + ci) * out_channels + co];
        grad_weight[n] = from_acc<T>(sum);
    }
}

template <typename T, typename A, int BM, int BN>
void launch_map_conv(const int32_t* map, int64_t rows, int32_t volume, const T* x, const A* packed, T* out,
                     int32_t x_channels, int32_t y_channels, cudaStream_t stream) {
    constexpr int BK = sizeof(A) == 8 ? 8 : 16;
    const dim3 grid(static_cast<unsigned>((rows + BM - 1) / BM), static_cast<unsigned>((y_channels + BN - 1) / BN));
    map_conv_kernel<T, A, BM, BN, BK><<<grid, kConvThreads, 0, stream>>>(map, rows, volume, x, packed, out,
                                                                         x_channels, y_channels);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

void check_sizes(const char* op, int64_t rows, int32_t volume, int64_t x_channels, int64_t y_channels) {
    if (rows > int64_t{INT32_MAX} * 64)
        throw_error(op, ": ", rows, " rows exceed the CUDA grid limit of ", int64_t{INT32_MAX} * 64);
    if (x_channels > INT32_MAX / 2 || y_channels > 65535LL * 16)
        throw_error(op, ": channel counts (", x_channels, ", ", y_channels, ") exceed the CUDA limits (",
                    INT32_MAX / 2, ", ", 65535LL * 16, ")");
    if (volume > 65535) throw_error(op, ": kernel volume ", volume, " exceeds the CUDA limit of 65535 taps");
}

template <typename T>
void map_convolution_typed(const int32_t* map, int64_t rows, int32_t volume, const T* x, const T* weight,
                           bool transpose_weight, T* out, int64_t x_channels, int64_t y_channels,
                           const Context& ctx) {
    using A = typename AccumulatorOf<T>::type;
    check_sizes("ConvolutionPlan (CUDA)", rows, volume, x_channels, y_channels);
    if (rows == 0 || y_channels == 0) return;
    const cudaStream_t stream = stream_of(ctx);
    const int64_t in_channels = transpose_weight ? y_channels : x_channels;
    const int64_t out_channels = transpose_weight ? x_channels : y_channels;
    Buffer<A> packed = Buffer<A>::allocate(int64_t{volume} * x_channels * y_channels, ctx);
    pack_weight_kernel<T, A><<<blocks_for(packed.size()), kThreads, 0, stream>>>(
        weight, packed.data(), volume, in_channels, out_channels, transpose_weight);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    const auto xc = static_cast<int32_t>(x_channels);
    const auto yc = static_cast<int32_t>(y_channels);
    if (yc <= 16) launch_map_conv<T, A, 256, 16>(map, rows, volume, x, packed.data(), out, xc, yc, stream);
    else if (yc <= 32) launch_map_conv<T, A, 128, 32>(map, rows, volume, x, packed.data(), out, xc, yc, stream);
    else launch_map_conv<T, A, 64, 64>(map, rows, volume, x, packed.data(), out, xc, yc, stream);
}

/// Chunks of rows for the weight gradient: enough blocks to fill a large GPU, at least 1024 rows per
/// chunk, and at most 256 MiB of partial sums. Depends only on the problem's shape.
int64_t weight_grad_chunks(int64_t rows, int32_t volume, int64_t tiles, int64_t slot_bytes) {
    constexpr int64_t kTargetBlocks = 2048;
    constexpr int64_t kMinRows = 1024;
    constexpr int64_t kMaxBytes = int64_t{256} << 20;
    int64_t chunks = (kTargetBlocks + volume * tiles - 1) / (volume * tiles);
    chunks = std::min(chunks, (rows + kMinRows - 1) / kMinRows);
    chunks = std::min(chunks, kMaxBytes / std::max<int64_t>(1, slot_bytes));
    chunks = std::min<int64_t>(chunks, 65535);
    return std::max<int64_t>(chunks, 1);
}

template <typename T>
void map_weight_gradient_typed(const int32_t* map, int64_t rows, int32_t volume, const T* x, const T* grad,
                               T* grad_weight, int64_t in_channels, int64_t out_channels, const Context& ctx) {
    using A = typename AccumulatorOf<T>::type;
    check_sizes("ConvolutionPlan::backward_weight (CUDA)", rows, volume, in_channels, out_channels);
    const cudaStream_t stream = stream_of(ctx);
    const int64_t tiles_m = (in_channels + kGradTile - 1) / kGradTile;
    const int64_t tiles_n = (out_channels + kGradTile - 1) / kGradTile;
    if (tiles_m * tiles_n > INT32_MAX)
        throw_error("ConvolutionPlan::backward_weight (CUDA): ", in_channels, " x ", out_channels,
                    " channels exceed the CUDA grid limit");
    const int64_t slot_bytes = int64_t{volume} * in_channels * out_channels * static_cast<int64_t>(sizeof(A));
    int64_t chunks = 0;
    Buffer<A> partial;
    if (rows > 0) {
        chunks = weight_grad_chunks(rows, volume, tiles_m * tiles_n, slot_bytes);
        const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
        chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
        partial = Buffer<A>::allocate(chunks * volume * in_channels * out_channels, ctx);
        constexpr int BK = sizeof(A) == 8 ? 8 : 16;
        const dim3 grid(static_cast<unsigned>(tiles_m * tiles_n), static_cast<unsigned>(chunks),
                        static_cast<unsigned>(volume));
        weight_grad_kernel<T, A, BK><<<grid, kConvThreads, 0, stream>>>(
            map, rows, volume, x, grad, partial.data(), static_cast<int32_t>(in_channels),
            static_cast<int32_t>(out_channels), rows_per_chunk, static_cast<int32_t>(tiles_n));
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    const int64_t total = int64_t{volume} * in_channels * out_channels;
    reduce_weight_grad_kernel<T, A><<<blocks_for(total), kThreads, 0, stream>>>(
        partial.data(), chunks, volume, in_channels, out_channels, grad_weight);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

}  // namespace

void map_convolution(const int32_t* map, int64_t rows, int32_t volume, const void* x, const void* weight,
                     bool transpose_weight, void* out, int64_t x_channels, int64_t out_channels, DType dtype,
                     const Context& ctx) {
    DeviceGuard guard(ctx);
    switch (dtype) {
    case DType::Float32:
        return map_convolution_typed(map, rows, volume, static_cast<const float*>(x), static_cast<const float*>(weight),
                                     transpose_weight, static_cast<float*>(out), x_channels, out_channels, ctx);
    case DType::Float64:
        return map_convolution_typed(map, rows, volume, static_cast<const double*>(x),
                                     static_cast<const double*>(weight), transpose_weight, static_cast<double*>(out),
                                     x_channels, out_channels, ctx);
    case DType::Float16:
        return map_convolution_typed(map, rows, volume, static_cast<const __half*>(x),
                                     static_cast<const __half*>(weight), transpose_weight, static_cast<__half*>(out),
                                     x_channels, out_channels, ctx);
    case DType::BFloat16:
        return map_convolution_typed(map, rows, volume, static_cast<const __nv_bfloat16*>(x),
                                     static_cast<const __nv_bfloat16*>(weight), transpose_weight,
                                     static_cast<__nv_bfloat16*>(out), x_channels, out_channels, ctx);
    }
}

void map_weight_gradient(const int32_t* map, int64_t rows, int32_t volume, const void* x, const void* grad,
                         void* grad_weight, int64_t in_channels, int64_t out_channels, DType dtype,
                         const Context& ctx) {
    DeviceGuard guard(ctx);
    switch (dtype) {
    case DType::Float32:
        return map_weight_gradient_typed(map, rows, volume, static_cast<const float*>(x),
                                         static_cast<const float*>(grad), static_cast<float*>(grad_weight),
                                         in_channels, out_channels, ctx);
    case DType::Float64:
        return map_weight_gradient_typed(map, rows, volume, static_cast<const double*>(x),
                                         static_cast<const double*>(grad), static_cast<double*>(grad_weight),
                                         in_channels, out_channels, ctx);
    case DType::Float16:
        return map_weight_gradient_typed(map, rows, volume, static_cast<const __half*>(x),
                                         static_cast<const __half*>(grad), static_cast<__half*>(grad_weight),
                                         in_channels, out_channels, ctx);
    case DType::BFloat16:
        return map_weight_gradient_typed(map, rows, volume, static_cast<const __nv_bfloat16*>(x),
                                         static_cast<const __nv_bfloat16*>(grad),
                                         static_cast<__nv_bfloat16*>(grad_weight), in_channels, out_channels, ctx);
    }
}

}  // namespace sparsegrid::detail::cuda
