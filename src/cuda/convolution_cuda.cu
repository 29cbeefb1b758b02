// CUDA convolution over a neighbour map.
//
// Forward and input gradient: one output-stationary gathered GEMM. A block owns BM output rows x BN
// output channels; for each tap it loads the rows' source indices, skips the tap when no row of the
// block has an edge there, and multiplies the gathered input rows by the tap's packed weights through
// shared-memory tiles. Every output element is summed by one thread in the order (tap, channel).
// Rows are taken in an order sorted by their set of taps (row_order, computed once per map), so the
// rows of a block share their taps and few taps are multiplied by zeros: e.g. every fine row of a
// generative k2s2 map has exactly one tap, and without the order each block would touch all eight.
// A block finds its taps in one pass over its rows' map entries. Scatter mode, for outputs whose rows
// have at most one edge (the fine side of a K = S plan): the block owns input rows instead, and writes
// each tap's product to its one output row. Float16 / bfloat16, and float when TF32 is allowed, run on
// tensor cores (wmma), the others in register tiles of 4 x 4 or 8 x 8 outputs per thread.
//
// Weight gradient: per tap, a GEMM over the rows that have an edge at that tap, over whichever map has
// fewer rows (see map_weight_gradient). Rows are split into a
// shape-determined number of chunks; each block compacts its chunk's edges (block scan, order kept),
// accumulates a 32 x 32 or 64 x 64 tile of [in_channels, out_channels] into its own slot; a second
// kernel adds the slots in chunk order. No atomics anywhere, so every result is bitwise reproducible.
#include "cuda/convolution_cuda.h"

#include "cuda/cuda_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

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

/// acc[i][j] += sum over kk of a_tile[kk][row_i] * b_tile[kk][column_j]: one thread's register tile of
/// a shared-memory tile product, summed in kk order. The thread's rows are row + i for TM <= 4, and for
/// TM = 8 two runs of four, row + i and row + kRowStride + i (columns alike), so that the 16-byte shared
/// loads of a quarter warp fall on distinct banks.
template <int TM, int kStride>
__device__ __forceinline__ int tile_offset(int i) {
    return TM <= 4 ? i : (i / 4) * kStride + i % 4;
}

template <typename A, int BK, int LDA, int LDB, int TM, int TN, int kRowStride = 0, int kColumnStride = 0>
__device__ __forceinline__ void multiply_tiles(const A (&a_tile)[BK][LDA], const A (&b_tile)[BK][LDB], int row,
                                               int column, A (&acc)[TM][TN]) {
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
        A a[TM];
        A b[TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) a[i] = a_tile[kk][row + tile_offset<TM, kRowStride>(i)];
#pragma unroll
        for (int j = 0; j < TN; ++j) b[j] = b_tile[kk][column + tile_offset<TN, kColumnStride>(j)];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
}

/// The taps at which some row of a block has an edge (bit t for tap t), for volume <= 64, into *mask;
/// `row_of[i]` is the block's row i (-1 past the end). One pass over the rows' map entries, all loads in
/// flight at once, instead of a dependent load and a barrier per tap. Ends with a barrier.
template <int kThreadCount>
__device__ __forceinline__ void block_tap_mask(const int32_t* __restrict__ map, int32_t volume, const int64_t* row_of,
                                               int rows_in_block, unsigned long long* mask) {
    const int tid = static_cast<int>(threadIdx.x);
    if (tid == 0) *mask = 0;
    __syncthreads();
    unsigned long long mine = 0;
    for (int idx = tid; idx < rows_in_block * volume; idx += kThreadCount) {
        const int64_t r = row_of[idx / volume];
        const int t = idx % volume;
        if (r >= 0 && map[r * volume + t] >= 0) mine |= 1ull << t;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) mine |= __shfl_xor_sync(0xffffffffu, mine, offset);
    if (tid % 32 == 0 && mine != 0) atomicOr(mask, mine);
    __syncthreads();
}

// Tensor-core helpers, for the kernels below that run on compute capability 8.0 and later: float16 and
// bfloat16 fragments of 16 x 16 x 16, and for float (TF32) 16 x 16 x 8 whose inputs are rounded to TF32
// (10-bit mantissa) as they are loaded; float32 accumulators throughout.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
template <typename T>
struct WarpShape {
    static constexpr int K = 16;
    using Element = T;
};
template <>
struct WarpShape<float> {
    static constexpr int K = 8;
    using Element = nvcuda::wmma::precision::tf32;
};
template <typename T>
using WarpAccumulator = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, WarpShape<T>::K, float>;

template <typename Fragment>
__device__ __forceinline__ void round_to_tf32(Fragment& fragment) {
#pragma unroll
    for (int e = 0; e < fragment.num_elements; ++e) fragment.x[e] = nvcuda::wmma::__float_to_tf32(fragment.x[e]);
}

/// One warp's 32 x 32 quarter of a tensor-core tile product over WarpShape<T>::K values of k:
/// acc[i][j] += A_i B_j with A_i the 16 x K block at a + i * a_step (layout LayoutA, leading dimension
/// lda) and B_j the K x 16 block at b + 16 j (row-major, leading dimension ldb).
template <typename T, typename LayoutA>
__device__ __forceinline__ void warp_multiply(WarpAccumulator<T> (&acc)[2][2], const T* a, int a_step, int lda,
                                              const T* b, int ldb) {
    using namespace nvcuda;
    constexpr int K = WarpShape<T>::K;
    using Element = typename WarpShape<T>::Element;
    wmma::fragment<wmma::matrix_a, 16, 16, K, Element, LayoutA> a_block[2];
    wmma::fragment<wmma::matrix_b, 16, 16, K, Element, wmma::row_major> b_block[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        wmma::load_matrix_sync(a_block[i], a + i * a_step, lda);
        if constexpr (std::is_same_v<T, float>) round_to_tf32(a_block[i]);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        wmma::load_matrix_sync(b_block[j], b + 16 * j, ldb);
        if constexpr (std::is_same_v<T, float>) round_to_tf32(b_block[j]);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a_block[i], b_block[j], acc[i][j]);
}

/// Zeroes a warp's 32 x 32 accumulators.
template <typename T>
__device__ __forceinline__ void warp_fill(WarpAccumulator<T> (&acc)[2][2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
}

/// Writes a warp's 32 x 32 accumulators row-major into c (leading dimension ldc).
template <typename T>
__device__ __forceinline__ void warp_store(WarpAccumulator<T> (&acc)[2][2], float* c, int ldc) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            nvcuda::wmma::store_matrix_sync(c + 16 * i * ldc + 16 * j, acc[i][j], ldc, nvcuda::wmma::mem_row_major);
}
#endif

/// out[r, n] = sum_t sum_k x[map[r][t], k] * packed[t][k][n]: a BM x BN output tile per block, TM x TN
/// outputs per thread. With `scatter` the map's rows are the input's and every output row has at most
/// one edge: out[map[r][t], n] = sum_k x[r, k] * packed[t][k][n], each written once (rows without an
/// edge are left alone). `vector_x` / `vector_w`: rows of x and of the packed weights start 16-byte
/// aligned with a multiple of four channels (float only), so tiles load in float4.
template <typename T, typename A, int BM, int BN, int BK, int TM, int TN>
__global__ __launch_bounds__((BM / TM) * (BN / TN)) void map_conv_kernel(
    const int32_t* __restrict__ map, const int32_t* __restrict__ order, int64_t rows, int32_t volume,
    const T* __restrict__ x, const A* __restrict__ packed, T* __restrict__ out, int32_t x_channels, int32_t y_channels,
    bool vector_x, bool vector_w, bool scatter) {
    constexpr int kColumns = BN / TN;
    constexpr int kThreadCount = (BM / TM) * kColumns;
    constexpr int kRowStride = BM / (TM > 4 ? TM / 4 : 1);  // between a thread's runs of 4 rows (TM = 8)
    constexpr int kColumnStride = BN / (TN > 4 ? TN / 4 : 1);
    constexpr bool kVector = std::is_same_v<T, float> && std::is_same_v<A, float>;
    static_assert(BK % 4 == 0 && BN % 4 == 0, "float4 tile loads");
    __shared__ __align__(16) A a_tile[BK][BM + 4];
    __shared__ __align__(16) A b_tile[BK][BN];
    __shared__ int32_t source[BM];
    __shared__ int64_t row_of[BM];  // the block's rows: positions row0.. of `order`, -1 past the end
    __shared__ unsigned long long tap_mask;

    const int tid = static_cast<int>(threadIdx.x);
    const int ty = tid / kColumns;
    const int tx = tid % kColumns;
    const int row = ty * (TM > 4 ? 4 : TM);
    const int column = tx * (TN > 4 ? 4 : TN);
    const int64_t row0 = int64_t{blockIdx.x} * BM;
    const int n0 = static_cast<int>(blockIdx.y) * BN;
    for (int i = tid; i < BM; i += kThreadCount) {
        const int64_t p = row0 + i;
        row_of[i] = p < rows ? (order ? int64_t{order[p]} : p) : -1;
    }
    __syncthreads();
    const bool masked = map != nullptr && volume <= 64;
    if (masked) block_tap_mask<kThreadCount>(map, volume, row_of, BM, &tap_mask);

    A acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = A(0);

    for (int32_t t = 0; t < volume; ++t) {
        if (masked && !((tap_mask >> t) & 1ull)) continue;  // the same for every thread of the block
        int any = 0;
        for (int i = tid; i < BM; i += kThreadCount) {
            const int64_t r = row_of[i];
            int32_t s = -1;
            if (r >= 0) s = map ? map[r * volume + t] : static_cast<int32_t>(r);
            source[i] = s;
            any |= s >= 0;
        }
        if (!__syncthreads_or(any)) continue;  // also publishes source[]
        int64_t targets[TM];  // scatter: this thread's output rows at tap t (read before source[] changes)
#pragma unroll
        for (int i = 0; i < TM; ++i) targets[i] = scatter ? source[row + tile_offset<TM, kRowStride>(i)] : -1;
        const A* w = packed + int64_t{t} * x_channels * y_channels;
        for (int k0 = 0; k0 < x_channels; k0 += BK) {
            if (kVector && vector_x) {
                for (int idx = tid; idx < BM * (BK / 4); idx += kThreadCount) {
                    const int m = idx / (BK / 4);
                    const int kk = (idx % (BK / 4)) * 4;
                    const int64_t s = source[m] < 0 ? -1 : scatter ? row_of[m] : source[m];
                    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    if (s >= 0 && k0 + kk < x_channels)
                        v = *reinterpret_cast<const float4*>(x + s * x_channels + k0 + kk);
                    a_tile[kk][m] = v.x;
                    a_tile[kk + 1][m] = v.y;
                    a_tile[kk + 2][m] = v.z;
                    a_tile[kk + 3][m] = v.w;
                }
            } else {
                for (int idx = tid; idx < BM * BK; idx += kThreadCount) {
                    const int m = idx / BK;
                    const int kk = idx % BK;
                    const int k = k0 + kk;
                    const int64_t s = source[m] < 0 ? -1 : scatter ? row_of[m] : source[m];
                    a_tile[kk][m] = (s >= 0 && k < x_channels) ? to_acc<A>(x[s * x_channels + k]) : A(0);
                }
            }
            if (kVector && vector_w) {
                for (int idx = tid; idx < BK * (BN / 4); idx += kThreadCount) {
                    const int kk = idx / (BN / 4);
                    const int n = (idx % (BN / 4)) * 4;
                    const int k = k0 + kk;
                    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    if (k < x_channels && n0 + n < y_channels)
                        v = *reinterpret_cast<const float4*>(w + int64_t{k} * y_channels + n0 + n);
                    *reinterpret_cast<float4*>(&b_tile[kk][n]) = v;
                }
            } else {
                for (int idx = tid; idx < BK * BN; idx += kThreadCount) {
                    const int kk = idx / BN;
                    const int n = idx % BN;
                    const int k = k0 + kk;
                    b_tile[kk][n] = (k < x_channels && n0 + n < y_channels) ? w[int64_t{k} * y_channels + n0 + n]
                                                                            : A(0);
                }
            }
            __syncthreads();
            multiply_tiles<A, BK, BM + 4, BN, TM, TN, kRowStride, kColumnStride>(a_tile, b_tile, row, column, acc);
            __syncthreads();
        }
        if (scatter) {
#pragma unroll
            for (int i = 0; i < TM; ++i) {
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    const int n = n0 + column + tile_offset<TN, kColumnStride>(j);
                    if (targets[i] >= 0 && n < y_channels) out[targets[i] * y_channels + n] = from_acc<T>(acc[i][j]);
                    acc[i][j] = A(0);
                }
            }
        }
    }
    if (scatter) return;

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int64_t r = row_of[row + tile_offset<TM, kRowStride>(i)];
        if (r < 0) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + column + tile_offset<TN, kColumnStride>(j);
            if (n < y_channels) out[r * y_channels + n] = from_acc<T>(acc[i][j]);
        }
    }
}

/// Tensor-core variant of map_conv_kernel for float16 / bfloat16, and for float in TF32 (float32
/// accumulation throughout): 4 warps, a 64 x 64 output tile, each warp a 32 x 32 quarter of 16 x 16 x K
/// fragments. Same row order, tap skipping and summation order per element (tap, then channel blocks
/// of BK) on every run, and the same `scatter` mode.
template <typename T, int BK>
__global__ __launch_bounds__(128) void map_conv_tensor_kernel(const int32_t* __restrict__ map,
                                                              const int32_t* __restrict__ order, int64_t rows,
                                                              int32_t volume, const T* __restrict__ x,
                                                              const T* __restrict__ packed, T* __restrict__ out,
                                                              int32_t x_channels, int32_t y_channels, bool vector_x,
                                                              bool vector_w, bool scatter) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // never launched there: tensor_cores_available() is false below compute capability 8.0
#else
    using namespace nvcuda;
    constexpr int BM = 64, BN = 64;
    static_assert(BK % 32 == 0, "whole k fragments of every type");
    constexpr int kVector = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte load
    constexpr int kLda = BK + 8, kLdb = BN + 8, kLdc = BN + 4;
    // The operand tiles, and over them the accumulators' tile once the operands are consumed (after the
    // barrier that ends each k step), so that k steps of 64 fit in every type.
    constexpr int kOperandBytes = (BM * kLda + BK * kLdb) * static_cast<int>(sizeof(T));
    constexpr int kResultBytes = BM * kLdc * static_cast<int>(sizeof(float));
    static_assert((BM * kLda * sizeof(T)) % 32 == 0, "b_tile must start 32-byte aligned");
    __shared__ __align__(32) unsigned char tiles[kOperandBytes > kResultBytes ? kOperandBytes : kResultBytes];
    T* a_tile = reinterpret_cast<T*>(tiles);
    T* b_tile = a_tile + BM * kLda;
    float* c_tile = reinterpret_cast<float*>(tiles);
    __shared__ int32_t source[BM];
    __shared__ int64_t row_of[BM];
    __shared__ unsigned long long tap_mask;

    const int tid = static_cast<int>(threadIdx.x);
    const int warp = tid / 32;
    const int warp_m = (warp / 2) * 32;
    const int warp_n = (warp % 2) * 32;
    const int64_t row0 = int64_t{blockIdx.x} * BM;
    const int n0 = static_cast<int>(blockIdx.y) * BN;
    for (int i = tid; i < BM; i += 128) {
        const int64_t p = row0 + i;
        row_of[i] = p < rows ? (order ? int64_t{order[p]} : p) : -1;
    }
    __syncthreads();
    const bool masked = map != nullptr && volume <= 64;
    if (masked) block_tap_mask<128>(map, volume, row_of, BM, &tap_mask);

    WarpAccumulator<T> acc[2][2];
    warp_fill<T>(acc);
    const T zero = from_acc<T>(0.0f);

    for (int32_t t = 0; t < volume; ++t) {
        if (masked && !((tap_mask >> t) & 1ull)) continue;  // the same for every thread of the block
        int any = 0;
        for (int i = tid; i < BM; i += 128) {
            const int64_t r = row_of[i];
            int32_t s = -1;
            if (r >= 0) s = map ? map[r * volume + t] : static_cast<int32_t>(r);
            source[i] = s;
            any |= s >= 0;
        }
        if (!__syncthreads_or(any)) continue;
        const T* w = packed + int64_t{t} * x_channels * y_channels;
        for (int k0 = 0; k0 < x_channels; k0 += BK) {
            if (vector_x) {
                for (int idx = tid; idx < BM * (BK / kVector); idx += 128) {
                    const int m = idx / (BK / kVector);
                    const int kk = (idx % (BK / kVector)) * kVector;
                    const int64_t s = source[m] < 0 ? -1 : scatter ? row_of[m] : source[m];
                    uint4 v = make_uint4(0, 0, 0, 0);
                    if (s >= 0 && k0 + kk < x_channels)
                        v = *reinterpret_cast<const uint4*>(x + s * x_channels + k0 + kk);
                    *reinterpret_cast<uint4*>(a_tile + m * kLda + kk) = v;
                }
            } else {
                for (int idx = tid; idx < BM * BK; idx += 128) {
                    const int m = idx / BK;
                    const int kk = idx % BK;
                    const int64_t s = source[m] < 0 ? -1 : scatter ? row_of[m] : source[m];
                    a_tile[m * kLda + kk] = (s >= 0 && k0 + kk < x_channels) ? x[s * x_channels + k0 + kk] : zero;
                }
            }
            if (vector_w) {
                for (int idx = tid; idx < BK * (BN / kVector); idx += 128) {
                    const int kk = idx / (BN / kVector);
                    const int n = (idx % (BN / kVector)) * kVector;
                    uint4 v = make_uint4(0, 0, 0, 0);
                    if (k0 + kk < x_channels && n0 + n < y_channels)
                        v = *reinterpret_cast<const uint4*>(w + int64_t{k0 + kk} * y_channels + n0 + n);
                    *reinterpret_cast<uint4*>(b_tile + kk * kLdb + n) = v;
                }
            } else {
                for (int idx = tid; idx < BK * BN; idx += 128) {
                    const int kk = idx / BN;
                    const int n = idx % BN;
                    b_tile[kk * kLdb + n] = (k0 + kk < x_channels && n0 + n < y_channels)
                        ? w[int64_t{k0 + kk} * y_channels + n0 + n]
                        : zero;
                }
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < BK; kk += WarpShape<T>::K)
                warp_multiply<T, wmma::row_major>(acc, a_tile + warp_m * kLda + kk, 16 * kLda, kLda,
                                                  b_tile + kk * kLdb + warp_n, kLdb);
            __syncthreads();
        }
        if (scatter) {  // this tap's products go to their (single-edge) output rows
            warp_store<T>(acc, c_tile + warp_m * kLdc + warp_n, kLdc);
            warp_fill<T>(acc);
            __syncthreads();
            for (int idx = tid; idx < BM * BN; idx += 128) {
                const int m = idx / BN;
                const int n = idx % BN;
                const int64_t target = source[m];
                if (target >= 0 && n0 + n < y_channels)
                    out[target * y_channels + n0 + n] = from_acc<T>(c_tile[m * kLdc + n]);
            }
            __syncthreads();  // c_tile and source[] are rewritten for the next tap
        }
    }
    if (scatter) return;
    warp_store<T>(acc, c_tile + warp_m * kLdc + warp_n, kLdc);
    __syncthreads();
    for (int idx = tid; idx < BM * BN; idx += 128) {
        const int m = idx / BN;
        const int n = idx % BN;
        const int64_t r = row_of[m];
        if (r >= 0 && n0 + n < y_channels) out[r * y_channels + n0 + n] = from_acc<T>(c_tile[m * kLdc + n]);
    }
#endif
}

/// Whether the context's device has float16 / bfloat16 / TF32 tensor cores usable by wmma (compute
/// capability 8.0+).
bool tensor_cores_available(const Context& ctx) {
    int major = 0;
    SPARSEGRID_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx.device.index));
    return major >= 8;
}

/// Whether an execution in T runs on tensor cores: float16 / bfloat16 wherever they are available,
/// float only when the context allows TF32.
template <typename T>
bool use_tensor_cores(const Context& ctx) {
    if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) return tensor_cores_available(ctx);
    if constexpr (std::is_same_v<T, float>) return ctx.allow_tf32 && tensor_cores_available(ctx);
    return false;
}

/// Types with a tensor-core kernel.
template <typename T>
constexpr bool kHasTensorKernel = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16> ||
    std::is_same_v<T, float>;

constexpr int kGradScan = 256;

/// partial[chunk][t][ci][co] = sum over the chunk's rows r with an edge at t of x[s, ci] * grad[r, co].
template <typename T, typename A, int Tile, int BK>
__global__ __launch_bounds__(kConvThreads) void weight_grad_kernel(const int32_t* __restrict__ map, int64_t rows,
                                                                   int32_t volume, const T* __restrict__ x,
                                                                   const T* __restrict__ grad, A* __restrict__ partial,
                                                                   int32_t in_channels, int32_t out_channels,
                                                                   int64_t rows_per_chunk, int32_t tiles_n) {
    constexpr int TM = Tile / 16;  // a 16 x 16 thread grid, TM x TN outputs each
    constexpr int TN = Tile / 16;
    constexpr int kColumns = Tile / TN;
    using BlockScan = cub::BlockScan<int, kConvThreads>;
    __shared__ typename BlockScan::TempStorage scan_storage;
    __shared__ int32_t edge_source[kGradScan];
    __shared__ int64_t edge_row[kGradScan];
    __shared__ __align__(16) A a_tile[BK][Tile + 4];
    __shared__ __align__(16) A b_tile[BK][Tile + 4];

    const int tid = static_cast<int>(threadIdx.x);
    const int ty = tid / kColumns;
    const int tx = tid % kColumns;
    const int m0 = static_cast<int>(blockIdx.x / tiles_n) * Tile;
    const int n0 = static_cast<int>(blockIdx.x % tiles_n) * Tile;
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
            for (int idx = tid; idx < BK * Tile; idx += kConvThreads) {
                const int kk = idx / Tile;
                const int c = idx % Tile;
                const bool valid = k0 + kk < edges;
                const int ci = m0 + c;
                const int co = n0 + c;
                a_tile[kk][c] = (valid && ci < in_channels)
                    ? to_acc<A>(x[int64_t{edge_source[k0 + kk]} * in_channels + ci])
                    : A(0);
                b_tile[kk][c] = (valid && co < out_channels) ? to_acc<A>(grad[edge_row[k0 + kk] * out_channels + co])
                                                             : A(0);
            }
            __syncthreads();
            multiply_tiles(a_tile, b_tile, ty * TM, tx * TN, acc);
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

/// Tensor-core variant of weight_grad_kernel for float16 / bfloat16 and TF32: 4 warps, a 64 x 64 tile of
/// [in_channels, out_channels], float32 accumulators; edges compacted and consumed in the same order.
template <typename T>
__global__ __launch_bounds__(128) void weight_grad_tensor_kernel(const int32_t* __restrict__ map, int64_t rows,
                                                                 int32_t volume, const T* __restrict__ x,
                                                                 const T* __restrict__ grad,
                                                                 float* __restrict__ partial, int32_t in_channels,
                                                                 int32_t out_channels, int64_t rows_per_chunk,
                                                                 int32_t tiles_n, bool vector_x, bool vector_g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // never launched there: tensor_cores_available() is false below compute capability 8.0
#else
    using namespace nvcuda;
    constexpr int kTile = 64, BK = 32, kScan = 128;
    constexpr int kVector = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte load
    constexpr int kLd = kTile + 8, kLdc = kTile + 4;
    using BlockScan = cub::BlockScan<int, 128>;
    __shared__ typename BlockScan::TempStorage scan_storage;
    __shared__ int32_t edge_source[kScan];
    __shared__ int64_t edge_row[kScan];
    __shared__ __align__(32) T a_tile[BK * kLd];  // [k][ci]: the A operand (ci x k) in column-major order
    __shared__ __align__(32) T b_tile[BK * kLd];  // [k][co]
    __shared__ __align__(32) float c_tile[kTile * kLdc];

    const int tid = static_cast<int>(threadIdx.x);
    const int warp = tid / 32;
    const int warp_m = (warp / 2) * 32;
    const int warp_n = (warp % 2) * 32;
    const int m0 = static_cast<int>(blockIdx.x / tiles_n) * kTile;
    const int n0 = static_cast<int>(blockIdx.x % tiles_n) * kTile;
    const int64_t chunk = blockIdx.y;
    const int32_t t = static_cast<int32_t>(blockIdx.z);
    const int64_t begin = chunk * rows_per_chunk;
    const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
    const T zero = from_acc<T>(0.0f);

    WarpAccumulator<T> acc[2][2];
    warp_fill<T>(acc);

    for (int64_t base = begin; base < end; base += kScan) {
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
            // Rows k of both tiles: channels [m0, m0 + 64) of x at the edge's source, [n0, n0 + 64) of grad
            // at its target; zeros past the edges and the channel counts.
            for (int idx = tid; idx < BK * (kTile / kVector); idx += 128) {
                const int kk = idx / (kTile / kVector);
                const int c = (idx % (kTile / kVector)) * kVector;
                const bool valid = k0 + kk < edges;
                const T* x_row = valid ? x + int64_t{edge_source[k0 + kk]} * in_channels : nullptr;
                const T* g_row = valid ? grad + edge_row[k0 + kk] * out_channels : nullptr;
                if (vector_x) {
                    uint4 v = make_uint4(0, 0, 0, 0);
                    if (valid && m0 + c < in_channels) v = *reinterpret_cast<const uint4*>(x_row + m0 + c);
                    *reinterpret_cast<uint4*>(a_tile + kk * kLd + c) = v;
                } else {
                    for (int e = 0; e < kVector; ++e)
                        a_tile[kk * kLd + c + e] = valid && m0 + c + e < in_channels ? x_row[m0 + c + e] : zero;
                }
                if (vector_g) {
                    uint4 v = make_uint4(0, 0, 0, 0);
                    if (valid && n0 + c < out_channels) v = *reinterpret_cast<const uint4*>(g_row + n0 + c);
                    *reinterpret_cast<uint4*>(b_tile + kk * kLd + c) = v;
                } else {
                    for (int e = 0; e < kVector; ++e)
                        b_tile[kk * kLd + c + e] = valid && n0 + c + e < out_channels ? g_row[n0 + c + e] : zero;
                }
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < BK; kk += WarpShape<T>::K)
                warp_multiply<T, wmma::col_major>(acc, a_tile + kk * kLd + warp_m, 16, kLd, b_tile + kk * kLd + warp_n,
                                                  kLd);
            __syncthreads();
        }
        __syncthreads();  // edge lists and scan storage are reused by the next batch of rows
    }
    warp_store<T>(acc, c_tile + warp_m * kLdc + warp_n, kLdc);
    __syncthreads();
    float* slot = partial + (chunk * volume + t) * int64_t{in_channels} * out_channels;
    for (int idx = tid; idx < kTile * kTile; idx += 128) {
        const int m = idx / kTile;
        const int n = idx % kTile;
        if (m0 + m < in_channels && n0 + n < out_channels)
            slot[int64_t{m0 + m} * out_channels + n0 + n] = c_tile[m * kLdc + n];
    }
#endif
}

/// grad_weight[(co * in_channels + ci) * volume + t] = sum over chunks, in order, of partial[chunk][t][ci][co],
/// or of partial[chunk][t][co][ci] when `swapped`.
template <typename T, typename A>
__global__ void reduce_weight_grad_kernel(const A* __restrict__ partial, int64_t chunks, int32_t volume,
                                          int64_t in_channels, int64_t out_channels, bool swapped,
                                          T* __restrict__ grad_weight) {
    const int64_t total = int64_t{volume} * in_channels * out_channels;
    SG_GRID_STRIDE_LOOP(n, total) {
        const int64_t t = n % volume;
        const int64_t rest = n / volume;
        const int64_t ci = rest % in_channels;
        const int64_t co = rest / in_channels;
        const int64_t entry = swapped ? co * in_channels + ci : ci * out_channels + co;
        const int64_t slot = int64_t{volume} * in_channels * out_channels;
        A sum = A(0);
        for (int64_t c = 0; c < chunks; ++c) sum += partial[c * slot + t * in_channels * out_channels + entry];
        grad_weight[n] = from_acc<T>(sum);
    }
}

template <typename T, typename A, int BM, int BN, int BK, int TM, int TN>
void launch_map_conv(const int32_t* map, const int32_t* order, int64_t rows, int32_t volume, const T* x,
                     const A* packed, T* out, int32_t x_channels, int32_t y_channels, bool scatter,
                     cudaStream_t stream) {
    constexpr int kThreadCount = (BM / TM) * (BN / TN);
    const bool vector_x = x_channels % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const bool vector_w = y_channels % 4 == 0 && reinterpret_cast<uintptr_t>(packed) % 16 == 0;
    const dim3 grid(static_cast<unsigned>((rows + BM - 1) / BM), static_cast<unsigned>((y_channels + BN - 1) / BN));
    map_conv_kernel<T, A, BM, BN, BK, TM, TN><<<grid, kThreadCount, 0, stream>>>(
        map, order, rows, volume, x, packed, out, x_channels, y_channels, vector_x, vector_w, scatter);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

/// Whether convolutions take the wide tile shapes: float over more than 64 output channels in 64 x 128
/// tiles of 8 x 8 outputs per thread (k steps of 16), float k steps of 32 channels or edges elsewhere
/// where there are 32 or more (16 otherwise), float16 / bfloat16 tensor-core k steps of 64 channels
/// where there are 64 or more (32 otherwise, and in TF32). Yes, unless SPARSEGRID_CONV_TILES is "4x4", which keeps 64 x 64 tiles of 4 x 4 per thread
/// and the short k steps (for measurements; results are bitwise equal, the sums keep their order). On an
/// H200 the 8 x 8 tiles took k3s1 at C = 128 from 2.73 to 2.47 ms, and were slower at C = 64 (0.85
/// against 0.76 ms with 128 x 64 tiles), so 33 to 64 output channels keep 64 x 64.
bool wide_register_tiles() {
    static const bool wide = [] {
        const char* value = std::getenv("SPARSEGRID_CONV_TILES");
        return !(value && std::string(value) == "4x4");
    }();
    return wide;
}

void check_sizes(const char* op, int64_t rows, int32_t volume, int64_t x_channels, int64_t y_channels) {
    if (rows > int64_t{INT32_MAX} * 64)
        throw_error(op, ": ", rows, " rows exceed the CUDA grid limit of ", int64_t{INT32_MAX} * 64);
    if (x_channels > INT32_MAX / 2 || y_channels > 65535LL * 16)
        throw_error(op, ": channel counts (", x_channels, ", ", y_channels, ") exceed the CUDA limits (", INT32_MAX / 2,
                    ", ", 65535LL * 16, ")");
    if (volume > 65535) throw_error(op, ": kernel volume ", volume, " exceeds the CUDA limit of 65535 taps");
}

template <typename T>
void map_convolution_typed(const int32_t* map, const int32_t* order, int64_t rows, int32_t volume, const T* x,
                           const T* weight, bool transpose_weight, T* out, int64_t x_channels, int64_t y_channels,
                           bool scatter, int64_t out_rows, const Context& ctx) {
    using A = typename AccumulatorOf<T>::type;
    check_sizes("ConvolutionPlan (CUDA)", rows, volume, x_channels, y_channels);
    if (y_channels == 0) return;
    const cudaStream_t stream = stream_of(ctx);
    if (scatter && out_rows > 0) {
        // Output rows without an edge are zero; the others are written once by the kernel.
        SPARSEGRID_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(out_rows * y_channels) * sizeof(T), stream));
    }
    if (rows == 0) return;
    const int64_t in_channels = transpose_weight ? y_channels : x_channels;
    const int64_t out_channels = transpose_weight ? x_channels : y_channels;
    if constexpr (kHasTensorKernel<T>) {
        if (use_tensor_cores<T>(ctx)) {
            // Tensor cores: weights packed in T, float32 accumulators.
            Buffer<T> packed = Buffer<T>::allocate(int64_t{volume} * x_channels * y_channels, ctx);
            pack_weight_kernel<T, T><<<blocks_for(packed.size()), kThreads, 0, stream>>>(
                weight, packed.data(), volume, in_channels, out_channels, transpose_weight);
            SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
            // 16-byte loads where rows of x and of the packed weights start 16-byte aligned.
            constexpr int kVector = 16 / static_cast<int>(sizeof(T));
            const bool vector_x = x_channels % kVector == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
            const bool vector_w = y_channels % kVector == 0 && reinterpret_cast<uintptr_t>(packed.data()) % 16 == 0;
            const dim3 grid(static_cast<unsigned>((rows + 63) / 64), static_cast<unsigned>((y_channels + 63) / 64));
            const auto xc = static_cast<int32_t>(x_channels), yc = static_cast<int32_t>(y_channels);
            // k steps of 64 in 16 bits where there are 64 channels or more. TF32 keeps 32: with 64 it was
            // slower on an H200 (k3s1 at C = 128 forward 2.13 against 1.98 ms through the PyTorch layer).
            if (sizeof(T) == 2 && x_channels >= 64 && wide_register_tiles())
                map_conv_tensor_kernel<T, 64><<<grid, 128, 0, stream>>>(map, order, rows, volume, x, packed.data(), out,
                                                                        xc, yc, vector_x, vector_w, scatter);
            else
                map_conv_tensor_kernel<T, 32><<<grid, 128, 0, stream>>>(map, order, rows, volume, x, packed.data(), out,
                                                                        xc, yc, vector_x, vector_w, scatter);
            SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
            return;
        }
    }
    Buffer<A> packed = Buffer<A>::allocate(int64_t{volume} * x_channels * y_channels, ctx);
    pack_weight_kernel<T, A><<<blocks_for(packed.size()), kThreads, 0, stream>>>(
        weight, packed.data(), volume, in_channels, out_channels, transpose_weight);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    const auto xc = static_cast<int32_t>(x_channels);
    const auto yc = static_cast<int32_t>(y_channels);
    const A* w = packed.data();
    const bool wide = wide_register_tiles();
    auto launch = [&](auto depth) {
        constexpr int BK = decltype(depth)::value;
        if (yc <= 16)
            return launch_map_conv<T, A, 256, 16, BK, 4, 4>(map, order, rows, volume, x, w, out, xc, yc, scatter,
                                                            stream);
        if (yc <= 32)
            return launch_map_conv<T, A, 128, 32, BK, 4, 4>(map, order, rows, volume, x, w, out, xc, yc, scatter,
                                                            stream);
        if constexpr (std::is_same_v<A, float>) {
            // k steps of 16 here: with 32 these tiles were slower on an H200 (k2s2 at C = 128 forward 1.79
            // against 1.46 ms).
            if (wide && yc > 64)
                return launch_map_conv<T, A, 64, 128, 16, 8, 8>(map, order, rows, volume, x, w, out, xc, yc, scatter,
                                                                stream);
        }
        launch_map_conv<T, A, 64, 64, BK, 4, 4>(map, order, rows, volume, x, w, out, xc, yc, scatter, stream);
    };
    if constexpr (std::is_same_v<T, float>) {
        if (wide && xc >= 32) return launch(std::integral_constant<int, 32>{});
    }
    launch(std::integral_constant < int, sizeof(A) == 8 ? 8 : 16 > {});
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
void map_weight_gradient_typed(const int32_t* map, int64_t rows, int32_t volume, bool rows_are_source, const T* x,
                               const T* grad, T* grad_weight, int64_t in_channels, int64_t out_channels,
                               const Context& ctx) {
    using A = typename AccumulatorOf<T>::type;
    check_sizes("ConvolutionPlan::backward_weight (CUDA)", rows, volume, in_channels, out_channels);
    const cudaStream_t stream = stream_of(ctx);
    const bool tensor_cores = use_tensor_cores<T>(ctx);
    // The kernels sum gathered[map[r][t], a] * row[r, b] into partial[chunk][t][a][b]: (a, b) = (ci, co)
    // over a map with rows = target voxels, (co, ci) over one with rows = source voxels.
    const T* gathered = rows_are_source ? grad : x;
    const T* per_row = rows_are_source ? x : grad;
    const int64_t gathered_channels = rows_are_source ? out_channels : in_channels;
    const int64_t row_channels = rows_are_source ? in_channels : out_channels;
    // 64 x 64 tiles on tensor cores, or (4 x 4 outputs per thread) once both channel counts exceed 32;
    // else 32 x 32.
    const int tile = tensor_cores || (in_channels > 32 && out_channels > 32) ? 64 : 32;
    const int64_t tiles_m = (gathered_channels + tile - 1) / tile;
    const int64_t tiles_n = (row_channels + tile - 1) / tile;
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
        const dim3 grid(static_cast<unsigned>(tiles_m * tiles_n), static_cast<unsigned>(chunks),
                        static_cast<unsigned>(volume));
        const auto ca = static_cast<int32_t>(gathered_channels), cb = static_cast<int32_t>(row_channels);
        const auto columns = static_cast<int32_t>(tiles_n);
        bool launched = false;
        if constexpr (kHasTensorKernel<T>) {
            if (tensor_cores) {
                // 16-byte loads where rows of both operands start 16-byte aligned.
                constexpr int kVector = 16 / static_cast<int>(sizeof(T));
                const bool vector_a = ca % kVector == 0 && reinterpret_cast<uintptr_t>(gathered) % 16 == 0;
                const bool vector_b = cb % kVector == 0 && reinterpret_cast<uintptr_t>(per_row) % 16 == 0;
                weight_grad_tensor_kernel<T><<<grid, 128, 0, stream>>>(map, rows, volume, gathered, per_row,
                                                                       partial.data(), ca, cb, rows_per_chunk, columns,
                                                                       vector_a, vector_b);
                launched = true;
            }
        }
        constexpr int BK = sizeof(A) == 8 ? 8 : 16;
        // Float: edges in steps of 32 (wide tile shapes), else 16 (8 in double).
        constexpr int kDeep = std::is_same_v<T, float> ? 32 : BK;
        const bool deep = std::is_same_v<T, float> && wide_register_tiles();
        if (!launched && tile == 64 && deep)
            weight_grad_kernel<T, A, 64, kDeep><<<grid, kConvThreads, 0, stream>>>(
                map, rows, volume, gathered, per_row, partial.data(), ca, cb, rows_per_chunk, columns);
        else if (!launched && tile == 64)
            weight_grad_kernel<T, A, 64, BK><<<grid, kConvThreads, 0, stream>>>(
                map, rows, volume, gathered, per_row, partial.data(), ca, cb, rows_per_chunk, columns);
        else if (!launched && deep)
            weight_grad_kernel<T, A, 32, kDeep><<<grid, kConvThreads, 0, stream>>>(
                map, rows, volume, gathered, per_row, partial.data(), ca, cb, rows_per_chunk, columns);
        else if (!launched)
            weight_grad_kernel<T, A, 32, BK><<<grid, kConvThreads, 0, stream>>>(
                map, rows, volume, gathered, per_row, partial.data(), ca, cb, rows_per_chunk, columns);
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    const int64_t total = int64_t{volume} * in_channels * out_channels;
    reduce_weight_grad_kernel<T, A><<<blocks_for(total), kThreads, 0, stream>>>(
        partial.data(), chunks, volume, in_channels, out_channels, rows_are_source, grad_weight);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

/// keys[r] = the set of taps at which row r has an edge (bit t for tap t); index[r] = r.
template <typename Key>
__global__ void row_mask_kernel(const int32_t* __restrict__ map, int64_t rows, int32_t volume, Key* __restrict__ keys,
                                int32_t* __restrict__ index) {
    SG_GRID_STRIDE_LOOP(r, rows) {
        Key mask = 0;
        for (int32_t t = 0; t < volume; ++t)
            if (map[r * volume + t] >= 0) mask |= Key{1} << t;
        keys[r] = mask;
        index[r] = static_cast<int32_t>(r);
    }
}

template <typename Key>
Buffer<int32_t> row_order_typed(const int32_t* map, int64_t rows, int32_t volume, const Context& ctx) {
    const cudaStream_t stream = stream_of(ctx);
    Buffer<Key> keys = Buffer<Key>::allocate(rows, ctx), sorted_keys = Buffer<Key>::allocate(rows, ctx);
    Buffer<int32_t> index = Buffer<int32_t>::allocate(rows, ctx), order = Buffer<int32_t>::allocate(rows, ctx);
    row_mask_kernel<Key><<<blocks_for(rows), kThreads, 0, stream>>>(map, rows, volume, keys.data(), index.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    const int n = static_cast<int>(rows);
    TempStorage temp;
    SPARSEGRID_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp.bytes, keys.data(), sorted_keys.data(),
                                                          index.data(), order.data(), n, 0, volume, stream));
    temp.ensure(ctx);
    SPARSEGRID_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), temp.bytes, keys.data(), sorted_keys.data(),
                                                          index.data(), order.data(), n, 0, volume, stream));
    return order;
}

/// Below this many rows a map is taken in voxel order: its convolution is a few blocks whose time is
/// launch latency, and the order would add two launches and five allocations to every such plan (the
/// coarse levels of a network, small batches).
constexpr int64_t kRowOrderMinRows = 4096;

/// The smallest map that gets a row order: kRowOrderMinRows, or from SPARSEGRID_CONV_ORDER: "0" takes
/// every map in voxel order, "1" orders every map (both for measurements and tests; results are equal).
int64_t row_order_min_rows() {
    static const int64_t min_rows = [] {
        const char* value = std::getenv("SPARSEGRID_CONV_ORDER");
        if (value && std::string(value) == "0") return INT64_MAX;
        if (value && std::string(value) == "1") return int64_t{1};
        return kRowOrderMinRows;
    }();
    return min_rows;
}

}  // namespace

bool scatter_enabled() {
    static const bool enabled = [] {
        const char* value = std::getenv("SPARSEGRID_CONV_SCATTER");
        return !(value && std::string(value) == "0");
    }();
    return enabled;
}

Buffer<int32_t> row_order(const int32_t* map, int64_t rows, int32_t volume, const Context& ctx) {
    if (map == nullptr || rows < row_order_min_rows() || volume <= 1 || volume > 64 || rows > INT32_MAX) return {};
    DeviceGuard guard(ctx);
    return volume <= 32 ? row_order_typed<uint32_t>(map, rows, volume, ctx)
                        : row_order_typed<uint64_t>(map, rows, volume, ctx);
}

void map_convolution(const int32_t* map, const int32_t* order, int64_t rows, int32_t volume, const void* x,
                     const void* weight, bool transpose_weight, void* out, int64_t x_channels, int64_t out_channels,
                     DType dtype, bool scatter, int64_t out_rows, const Context& ctx) {
    DeviceGuard guard(ctx);
    // An empty map has no storage: a scatter over no rows only zeroes the output.
    if (scatter && map == nullptr && rows > 0) throw_error("map_convolution (CUDA): scatter needs a map");
    switch (dtype) {
    case DType::Float32:
        return map_convolution_typed(map, order, rows, volume, static_cast<const float*>(x),
                                     static_cast<const float*>(weight), transpose_weight, static_cast<float*>(out),
                                     x_channels, out_channels, scatter, out_rows, ctx);
    case DType::Float64:
        return map_convolution_typed(map, order, rows, volume, static_cast<const double*>(x),
                                     static_cast<const double*>(weight), transpose_weight, static_cast<double*>(out),
                                     x_channels, out_channels, scatter, out_rows, ctx);
    case DType::Float16:
        return map_convolution_typed(map, order, rows, volume, static_cast<const __half*>(x),
                                     static_cast<const __half*>(weight), transpose_weight, static_cast<__half*>(out),
                                     x_channels, out_channels, scatter, out_rows, ctx);
    case DType::BFloat16:
        return map_convolution_typed(
            map, order, rows, volume, static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(weight),
            transpose_weight, static_cast<__nv_bfloat16*>(out), x_channels, out_channels, scatter, out_rows, ctx);
    }
}

void map_weight_gradient(const int32_t* map, int64_t rows, int32_t volume, bool rows_are_source, const void* x,
                         const void* grad, void* grad_weight, int64_t in_channels, int64_t out_channels, DType dtype,
                         const Context& ctx) {
    DeviceGuard guard(ctx);
    switch (dtype) {
    case DType::Float32:
        return map_weight_gradient_typed(map, rows, volume, rows_are_source, static_cast<const float*>(x),
                                         static_cast<const float*>(grad), static_cast<float*>(grad_weight), in_channels,
                                         out_channels, ctx);
    case DType::Float64:
        return map_weight_gradient_typed(map, rows, volume, rows_are_source, static_cast<const double*>(x),
                                         static_cast<const double*>(grad), static_cast<double*>(grad_weight),
                                         in_channels, out_channels, ctx);
    case DType::Float16:
        return map_weight_gradient_typed(map, rows, volume, rows_are_source, static_cast<const __half*>(x),
                                         static_cast<const __half*>(grad), static_cast<__half*>(grad_weight),
                                         in_channels, out_channels, ctx);
    case DType::BFloat16:
        return map_weight_gradient_typed(map, rows, volume, rows_are_source, static_cast<const __nv_bfloat16*>(x),
                                         static_cast<const __nv_bfloat16*>(grad),
                                         static_cast<__nv_bfloat16*>(grad_weight), in_channels, out_channels, ctx);
    }
}

}  // namespace sparsegrid::detail::cuda
