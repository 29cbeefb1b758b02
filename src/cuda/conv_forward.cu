// CUDA forward and input-gradient convolution over a neighbour map: one output-stationary gathered GEMM.
// A block owns BM output rows x BN output channels; for each tap it loads the rows' source indices,
// skips the tap when no row of the block has an edge there, and multiplies the gathered input rows by
// the tap's packed weights through shared-memory tiles. Every output element is summed by one thread in
// the order (tap, channel). Rows are taken in an order sorted by their set of taps (row_order, computed
// once per map by conv_dispatch.cu), so the rows of a block share their taps and few taps are multiplied
// by zeros: e.g. every fine row of a generative k2s2 map has exactly one tap, and without the order each
// block would touch all eight. A block finds its taps in one pass over its rows' map entries. Scatter
// mode, for outputs whose rows have at most one edge (the fine side of a K = S plan): the block owns
// input rows instead, and writes each tap's product to its one output row. Float16 / bfloat16, and float
// when TF32 is allowed, run on tensor cores (wmma), the others in register tiles of 4 x 4 or 8 x 8
// outputs per thread.
#include "backend/backend.h"
#include "cuda/conv_tiles.cuh"
#include "cuda/cuda_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

namespace sparsegrid::detail::cuda {

namespace {

/// packed[(t * x_channels + xi) * y_channels + yi] from weight[(co * in_channels + ci) * volume + t],
/// with (xi, yi) = (ci, co), or (co, ci) when `transpose`; each entry rounded to T first when the weight
/// is W = float for a 16-bit T.
template <typename T, typename A, typename W>
__global__ void pack_weight_kernel(const W* __restrict__ weight, A* __restrict__ packed, int32_t volume,
                                   int64_t in_channels, int64_t out_channels, bool transpose, bool reverse_taps) {
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
        const int64_t tap = reverse_taps ? volume - 1 - t : t;
        packed[(tap * x_channels + xi) * y_channels + yi] = to_acc<A>(weight_in<T>(weight[n]));
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

/// The weights as given ([Cout, Cin, taps] in T), read in place by map_conv_kernel instead of packed:
/// entry (k, n) of packed tap t is weight[k * k_stride + n * n_stride + tap], tap = t or, with
/// `reverse_taps`, volume - 1 - t (pack_weight_kernel's mapping). For narrow layers, whose weights are a
/// few KB that every block reads from the cache, this saves the packing's launch and allocation.
template <typename T>
struct WeightInPlace {
    const T* weight = nullptr;  // null: the kernel reads `packed`
    int64_t k_stride = 0;
    int64_t n_stride = 0;
    int32_t volume = 0;
    bool reverse_taps = false;
};

/// out[r, n] = sum_t sum_k x[map[r][t], k] * packed[t][k][n]: a BM x BN output tile per block, TM x TN
/// outputs per thread. With `scatter` the map's rows are the input's and every output row has at most
/// one edge: out[map[r][t], n] = sum_k x[r, k] * packed[t][k][n], each written once (rows without an
/// edge are left alone). `vector_x` / `vector_w`: rows of x and of the packed weights start 16-byte
/// aligned with a multiple of four channels (float only), so tiles load in float4.
template <typename T, typename A, int BM, int BN, int BK, int TM, int TN>
__global__ __launch_bounds__((BM / TM) * (BN / TN)) void map_conv_kernel(
    const int32_t* __restrict__ map, const int32_t* __restrict__ order, int64_t rows, int32_t volume,
    const T* __restrict__ x, const A* __restrict__ packed, WeightInPlace<T> in_place, T* __restrict__ out,
    int32_t x_channels, int32_t y_channels, bool vector_x, bool vector_w, bool scatter) {
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
        const A* w = in_place.weight ? nullptr : packed + int64_t{t} * x_channels * y_channels;
        const T* w_in_place = in_place.weight ? in_place.weight + (in_place.reverse_taps ? in_place.volume - 1 - t : t)
                                              : nullptr;
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
                    if (k >= x_channels || n0 + n >= y_channels)
                        b_tile[kk][n] = A(0);
                    else if (w_in_place)
                        b_tile[kk][n] = to_acc<A>(
                            w_in_place[int64_t{k} * in_place.k_stride + (n0 + n) * in_place.n_stride]);
                    else
                        b_tile[kk][n] = w[int64_t{k} * y_channels + n0 + n];
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

template <typename T, typename A, int BM, int BN, int BK, int TM, int TN>
void launch_map_conv(const int32_t* map, const int32_t* order, int64_t rows, int32_t volume, const T* x,
                     const A* packed, const WeightInPlace<T>& in_place, T* out, int32_t x_channels, int32_t y_channels,
                     bool scatter, cudaStream_t stream) {
    constexpr int kThreadCount = (BM / TM) * (BN / TN);
    const bool vector_x = x_channels % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const bool vector_w = !in_place.weight && y_channels % 4 == 0 && reinterpret_cast<uintptr_t>(packed) % 16 == 0;
    const dim3 grid(static_cast<unsigned>((rows + BM - 1) / BM), static_cast<unsigned>((y_channels + BN - 1) / BN));
    map_conv_kernel<T, A, BM, BN, BK, TM, TN><<<grid, kThreadCount, 0, stream>>>(
        map, order, rows, volume, x, packed, in_place, out, x_channels, y_channels, vector_x, vector_w, scatter);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

/// pack_weight_kernel over args.weight (of args.weight_dtype) into `packed`.
template <typename T, typename A>
void pack_weight(const MapConvolution& args, A* packed, int64_t in_channels, int64_t out_channels,
                 cudaStream_t stream) {
    const int64_t total = int64_t{args.volume} * in_channels * out_channels;
    with_weight_type<T>(args.weight_dtype, [&](auto weight_type) {
        using W = typename decltype(weight_type)::type;
        pack_weight_kernel<T, A, W><<<blocks_for(total), kThreads, 0, stream>>>(
            static_cast<const W*>(args.weight), packed, args.volume, in_channels, out_channels, args.transpose_weight,
            args.reverse_taps);
    });
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

}  // namespace

template <typename T>
void map_convolution_typed(const MapConvolution& args, const Context& ctx) {
    using A = typename AccumulatorOf<T>::type;
    const int32_t* map = args.map;
    const int32_t* order = args.order;
    const int64_t rows = args.rows;
    const int32_t volume = args.volume;
    const T* x = static_cast<const T*>(args.x);
    const bool transpose_weight = args.transpose_weight;
    T* out = static_cast<T*>(args.out);
    const int64_t x_channels = args.x_channels;
    const int64_t y_channels = args.out_channels;
    const bool scatter = args.scatter;
    const int64_t out_rows = args.out_rows;
    if (y_channels == 0) return;
    const cudaStream_t stream = stream_of(ctx);
    if (scatter && out_rows > 0 && (!args.covers_output || debug_sync_enabled())) {
        // Output rows without an edge are zero; the others are written once by the kernel. Where every row
        // has an edge nothing is zeroed (at 1.2 M rows of 64 float16 channels that was a third of the
        // pass), except under SPARSEGRID_CUDA_DEBUG, which fills such outputs with all-ones bytes (NaN in
        // every floating type) so that a row the kernels missed fails the tests.
        SPARSEGRID_CUDA_CHECK(cudaMemsetAsync(out, args.covers_output ? 0xFF : 0,
                                              static_cast<size_t>(out_rows * y_channels) * sizeof(T), stream));
    }
    if (rows == 0) return;
    const int64_t in_channels = transpose_weight ? y_channels : x_channels;
    const int64_t out_channels = transpose_weight ? x_channels : y_channels;
    if constexpr (kHasTensorKernel<T>) {
        if (use_tensor_cores<T>(ctx)) {
            if (engine_convolution<T>(args, ctx)) return;
            // Tensor cores: weights packed in T, float32 accumulators.
            Buffer<T> packed = Buffer<T>::allocate(int64_t{volume} * x_channels * y_channels, ctx);
            pack_weight<T, T>(args, packed.data(), in_channels, out_channels, stream);
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
    // Narrow layers (both channel counts at most 32) read the weights in place when they are in T;
    // others pack them once per call.
    WeightInPlace<T> in_place;
    Buffer<A> packed;
    if (x_channels <= 32 && y_channels <= 32 && args.weight_dtype == args.dtype) {
        in_place.weight = static_cast<const T*>(args.weight);
        in_place.k_stride = transpose_weight ? in_channels * volume : volume;
        in_place.n_stride = transpose_weight ? volume : in_channels * volume;
        in_place.volume = volume;
        in_place.reverse_taps = args.reverse_taps;
    } else {
        packed = Buffer<A>::allocate(int64_t{volume} * x_channels * y_channels, ctx);
        pack_weight<T, A>(args, packed.data(), in_channels, out_channels, stream);
    }
    const auto xc = static_cast<int32_t>(x_channels);
    const auto yc = static_cast<int32_t>(y_channels);
    const A* w = packed.data();
    const bool wide = wide_register_tiles();
    auto launch = [&](auto depth) {
        constexpr int BK = decltype(depth)::value;
        if (yc <= 16)
            return launch_map_conv<T, A, 256, 16, BK, 4, 4>(map, order, rows, volume, x, w, in_place, out, xc, yc,
                                                            scatter, stream);
        if (yc <= 32)
            return launch_map_conv<T, A, 128, 32, BK, 4, 4>(map, order, rows, volume, x, w, in_place, out, xc, yc,
                                                            scatter, stream);
        if constexpr (std::is_same_v<A, float>) {
            // k steps of 16 here: with 32 these tiles were slower on an H200 (k2s2 at C = 128 forward 1.79
            // against 1.46 ms).
            if (wide && yc > 64)
                return launch_map_conv<T, A, 64, 128, 16, 8, 8>(map, order, rows, volume, x, w, in_place, out, xc, yc,
                                                                scatter, stream);
        }
        launch_map_conv<T, A, 64, 64, BK, 4, 4>(map, order, rows, volume, x, w, in_place, out, xc, yc, scatter, stream);
    };
    if constexpr (std::is_same_v<T, float>) {
        if (wide && xc >= 32) return launch(std::integral_constant<int, 32>{});
    }
    constexpr int kDepth = sizeof(A) == 8 ? 8 : 16;
    launch(std::integral_constant<int, kDepth>{});
}

template void map_convolution_typed<float>(const MapConvolution&, const Context&);
template void map_convolution_typed<double>(const MapConvolution&, const Context&);
template void map_convolution_typed<__half>(const MapConvolution&, const Context&);
template void map_convolution_typed<__nv_bfloat16>(const MapConvolution&, const Context&);

}  // namespace sparsegrid::detail::cuda
