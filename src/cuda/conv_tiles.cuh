// Shared pieces of the CUDA convolution kernels (conv_forward.cu, conv_weight_gradient.cu): element and
// accumulator types, the register-tile product, the tensor-core (wmma) fragment helpers, the choice of
// tensor cores and tile shapes, and the typed launchers that conv_dispatch.cu calls after its dtype
// switch. Every helper sums in a fixed order, so the kernels built on them are bitwise reproducible.
#pragma once

#include "backend/backend.h"
#include "cuda/cuda_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace sparsegrid::detail::cuda {

constexpr int kConvThreads = 256;

/// The accumulator of an element type: float for float, float16 and bfloat16; double for double.
template <typename T>
struct AccumulatorOf {
    using type = float;
};
template <>
struct AccumulatorOf<double> {
    using type = double;
};

/// Element to accumulator and back (round to nearest for float16 / bfloat16).
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

/// Whether the context's device has float16 / bfloat16 / TF32 tensor cores usable by wmma (compute
/// capability 8.0+).
inline bool tensor_cores_available(const Context& ctx) {
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

/// Whether convolutions take the wide tile shapes: float over more than 64 output channels in 64 x 128
/// tiles of 8 x 8 outputs per thread (k steps of 16), float k steps of 32 channels or edges elsewhere
/// where there are 32 or more (16 otherwise), float16 / bfloat16 tensor-core k steps of 64 channels
/// where there are 64 or more (32 otherwise, and in TF32). Yes, unless SPARSEGRID_CONV_TILES is "4x4",
/// which keeps 64 x 64 tiles of 4 x 4 per thread and the short k steps (for measurements; results are
/// bitwise equal, the sums keep their order). On an H200 the 8 x 8 tiles took k3s1 at C = 128 from 2.73
/// to 2.47 ms, and were slower at C = 64 (0.85 against 0.76 ms with 128 x 64 tiles), so 33 to 64 output
/// channels keep 64 x 64. Read once (conv_dispatch.cu).
bool wide_register_tiles();

/// grad_weight[(co * in_channels + ci) * volume + t] = sum over chunks, in order, of partial[chunk][t][ci][co],
/// or of partial[chunk][t][co][ci] when `swapped`. The threads walk the partial sums in their own order, so
/// that a warp reads 32 neighbouring floats of each chunk (the chunks are read `chunks` times, the output
/// written once): walking the output's order instead read 27 taps a slot apart per warp for k3.
template <typename T, typename A>
__global__ void reduce_weight_grad_kernel(const A* __restrict__ partial, int64_t chunks, int32_t volume,
                                          int64_t in_channels, int64_t out_channels, bool swapped,
                                          T* __restrict__ grad_weight) {
    const int64_t entries = in_channels * out_channels;
    const int64_t slot = int64_t{volume} * entries;
    SG_GRID_STRIDE_LOOP(n, slot) {
        const int64_t t = n / entries;
        const int64_t entry = n - t * entries;
        const int64_t first = entry / (swapped ? in_channels : out_channels);
        const int64_t second = entry - first * (swapped ? in_channels : out_channels);
        const int64_t ci = swapped ? second : first;
        const int64_t co = swapped ? first : second;
        A sum = A(0);
#pragma unroll 4
        for (int64_t c = 0; c < chunks; ++c) sum += partial[c * slot + n];
        grad_weight[(co * in_channels + ci) * volume + t] = from_acc<T>(sum);
    }
}

/// The final sum into the weight gradient's dtype: T, or float (`float_output`, for float16 / bfloat16
/// T whose weights are float32) straight from the float partial sums, which rounded to T give the T
/// output. On `stream`, no sync.
template <typename T, typename A>
void launch_reduce_weight_grad(const A* partial, int64_t chunks, int32_t volume, int64_t in_channels,
                               int64_t out_channels, bool swapped, void* grad_weight, bool float_output,
                               cudaStream_t stream) {
    const int64_t total = int64_t{volume} * in_channels * out_channels;
    if constexpr (std::is_same_v<A, float> && !std::is_same_v<T, float>) {
        if (float_output) {
            reduce_weight_grad_kernel<float, float><<<blocks_for(total), kThreads, 0, stream>>>(
                partial, chunks, volume, in_channels, out_channels, swapped, static_cast<float*>(grad_weight));
            SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
            return;
        }
    }
    reduce_weight_grad_kernel<T, A><<<blocks_for(total), kThreads, 0, stream>>>(
        partial, chunks, volume, in_channels, out_channels, swapped, static_cast<T*>(grad_weight));
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

/// A weight entry in T from the weight's dtype W: T itself, or float for float16 / bfloat16 T, rounded
/// to nearest even as a conversion of the whole weight would round it.
template <typename T, typename W>
__device__ __forceinline__ T weight_in(W v) {
    if constexpr (std::is_same_v<T, W>)
        return v;
    else
        return from_acc<T, float>(v);
}

template <typename W>
struct WeightType {
    using type = W;
};

/// f(WeightType<W>{}) with W the weight's element type: float where `weight_dtype` is Float32 and T is
/// float16 / bfloat16, T otherwise (the front end allows no other pairs).
template <typename T, typename F>
decltype(auto) with_weight_type(DType weight_dtype, F&& f) {
    if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
        if (weight_dtype == DType::Float32) return f(WeightType<float>{});
    }
    return f(WeightType<T>{});
}

// ---- typed launchers (defined for float, double, __half and __nv_bfloat16) --------------------------

/// map_convolution in T: packs the weights, picks the kernel and its tiles, launches it on ctx's stream.
/// The dispatch has checked the sizes against the CUDA limits. No sync.
template <typename T>
void map_convolution_typed(const MapConvolution& args, const Context& ctx);

/// map_weight_gradient in T: per-chunk partial sums, then their sum in chunk order. The dispatch has
/// checked the sizes against the CUDA limits. No sync.
template <typename T>
void map_weight_gradient_typed(const MapWeightGradient& args, const Context& ctx);

// ---- the tensor-core engine (conv_implicit_gemm.cu) ------------------------------------------------

/// map_convolution in T (float16, bfloat16, or float in TF32) on the implicit-GEMM engine, when it takes
/// the execution: returns false, having launched nothing, for executions it does not cover (more than
/// 64 taps, rows of x not a multiple of 16 bytes, an odd output width, unaligned pointers) or
/// when the engine is off (force_engine_configuration("off") or SPARSEGRID_CONV_CONFIG=off). The caller
/// has checked that tensor cores are to be used.
template <typename T>
bool engine_convolution(const MapConvolution& args, const Context& ctx);

/// The engine's weight gradient (conv_weight_engine.cu) in T: per tap, a split-K GEMM over the edges,
/// pipelined like the forward pass, into per-slot partial sums added in slot order. Returns false,
/// having launched nothing, for executions it does not cover (channel rows not a multiple of 16 bytes,
/// unaligned pointers, more than 2^31 rows) or when the engine is off.
template <typename T>
bool engine_weight_gradient(const MapWeightGradient& args, const Context& ctx);

/// The engine's tile configurations by name, forward (and input gradient) ones first, then the weight
/// gradient's; every configuration gives bitwise the same result.
std::vector<std::string> engine_configurations();
/// The weight gradient's configurations (conv_weight_engine.cu), the tail of engine_configurations().
std::vector<std::string> weight_engine_configurations();
/// How many of engine_configurations() are forward ones.
int forward_engine_configuration_count();

/// The widest rows (channels) the engine takes; wider ones take the tiled kernels.
constexpr int64_t kMaxEngineChannels = 65536;

constexpr int kEngineAutomatic = -1;
constexpr int kEngineOff = -2;
/// The configuration forced through force_engine_configuration or else SPARSEGRID_CONV_CONFIG: an
/// index into engine_configurations(), kEngineAutomatic or kEngineOff.
int forced_engine_configuration();

// ---- the tuner (conv_tuner.cu) ---------------------------------------------------------------------

/// What the tuner keys on, with the device's name: the execution ("forward" for the gathering forward
/// pass and input gradient, "scatter" for the scatter mode, "weight" for the weight gradient), the dtype ("float16", "bfloat16", "tf32"), the
/// channel counts, the taps and floor(log2(rows)).
struct EngineShape {
    const char* kind;
    const char* dtype;
    int64_t x_channels;
    int64_t y_channels;
    int32_t volume;
    int rows_log2;
};

struct TunedConfiguration {
    int index;  ///< into `names`, or kEngineAutomatic: no choice recorded and tuning off
    bool ran;   ///< the execution was run (timed) and its output is complete
};

/// True once the tuner is known to have nothing to say (tuning off, no recorded choice): callers then
/// take the automatic choice without building a shape or a launcher for tuned_configuration. One
/// atomic load.
bool engine_tuning_idle();

/// The recorded choice for `shape` (from this process or the tuning file); with tuning on and none
/// recorded, times run(i) for every i in `names` (waits for the device), records the fastest and
/// rewrites the file. Thread-safe.
TunedConfiguration tuned_configuration(const EngineShape& shape, const std::vector<std::string>& names,
                                       const std::function<void(int)>& run, const Context& ctx);

/// The tuner's choice for `shape` among the configurations that can run here (every one of `configs`
/// but the warpgroup ones without `warpgroup_ok`), run(i) launching configs[i]: tuned_configuration over
/// their names, with `index` mapped back into `configs` (kEngineAutomatic where nothing is recorded).
template <typename Config, size_t N, typename Run>
TunedConfiguration tune_among(const Config (&configs)[N], bool warpgroup_ok, const EngineShape& shape, Run&& run,
                              const Context& ctx) {
    std::vector<int> candidates;
    std::vector<std::string> names;
    for (int i = 0; i < static_cast<int>(N); ++i) {
        if (configs[i].warpgroup && !warpgroup_ok) continue;
        candidates.push_back(i);
        names.push_back(configs[i].name());
    }
    TunedConfiguration tuned = tuned_configuration(
        shape, names, [&](int i) { run(candidates[static_cast<size_t>(i)]); }, ctx);
    if (tuned.index != kEngineAutomatic) tuned.index = candidates[static_cast<size_t>(tuned.index)];
    return tuned;
}

/// Turns tuning on or off and names the file of recorded choices ("" for none), read now.
void set_engine_tuning(bool enabled, const std::string& file);

/// Blocks per multiprocessor an engine kernel of `warps` warps, each owning `warp_tile` outputs, is
/// compiled for (its register cap: 65536 / (32 warps min_blocks)): 16 warps for warp tiles of 32 x 32
/// (cap 128), two blocks for 64 x 32 (cap 128 in 8 warps, their 64 accumulators fit; none in 4 warps,
/// where 32 x 64 tiles and TF32 fragment loads needed more), one for 64 x 64 (128 accumulators). Without
/// a count the compiler's own choice went both ways on an H200: 136 registers for 128 x 128 tiles (one
/// block per multiprocessor: k3s1 float16 C = 128 forward 0.573 against 0.355 ms at 96 registers), and 64
/// with spills for 128 x 64 tiles.
constexpr int engine_min_blocks(int warps, int warp_tile) {
    return warp_tile >= 64 * 64 ? 1 : warp_tile >= 64 * 32 ? 2 : 16 / warps;
}

/// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current device, once per device:
/// `raised` (one per kernel) keeps bit d once done on device d (devices past 63: every time).
template <typename Kernel>
void raise_shared_memory_limit(Kernel* kernel, size_t bytes, std::atomic<uint64_t>& raised) {
    int device = 0;
    SPARSEGRID_CUDA_CHECK(cudaGetDevice(&device));
    const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
    if (bit != 0 && (raised.load(std::memory_order_acquire) & bit)) return;
    SPARSEGRID_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    raised.fetch_or(bit, std::memory_order_acq_rel);
}

template <typename T>
constexpr const char* engine_dtype_name() {
    if constexpr (std::is_same_v<T, __half>) return "float16";
    if constexpr (std::is_same_v<T, __nv_bfloat16>) return "bfloat16";
    return "tf32";
}

inline int floor_log2(int64_t value) {
    int bits = 0;
    while (value > 1) {
        value >>= 1;
        ++bits;
    }
    return bits;
}

/// Forces the engine onto one configuration in this process ("" or "auto": the automatic choice, which
/// SPARSEGRID_CONV_CONFIG overrides; "off": the kernels of conv_forward.cu). Raises for an unknown name,
/// listing the valid ones.
void force_engine_configuration(const std::string& name);

#ifdef __CUDACC__
/// The prologue of the engine's gathering kernels (implicit_gemm_kernel, warpgroup_gemm_kernel): the
/// block's kRows rows from row0 (through `order` where given, -1 past `rows`) into row_of, their sources
/// at every tap into table[t * kTableStride + row] (-1 where absent), and the taps any of them has, in
/// order, into active. Each warp reads whole map rows (lane = tap), all of its rows' loads in flight at
/// once (up to kMaxBatch rows): with the read of the rows themselves, two dependent trips to memory
/// before the block's first copies, where four rows at a time took five on a block of 128 rows and 8
/// warps. Returns the count of active taps, every write visible to the block.
template <int kRows, int kThreads, int kTableStride, int kMaxBatch = 16>
__device__ __forceinline__ int block_tap_table(const int32_t* __restrict__ map, const int32_t* __restrict__ order,
                                               int64_t rows, int32_t volume, int64_t row0, int64_t* row_of,
                                               int32_t* table, int32_t* active, unsigned long long& tap_mask) {
    constexpr int kWarps = kThreads / 32;
    constexpr int kPerWarp = kRows / kWarps;
    constexpr int kBatch = kPerWarp < kMaxBatch ? kPerWarp : kMaxBatch;  // rows per warp loaded together
    static_assert(kRows % (kBatch * kWarps) == 0, "the table is built kBatch rows per warp at a time");
    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid % 32;
    const int warp = tid / 32;
    if (tid == 0) tap_mask = 0;
    for (int i = tid; i < kRows; i += kThreads) {
        const int64_t p = row0 + i;
        row_of[i] = p < rows ? (order ? int64_t{order[p]} : p) : -1;
    }
    __syncthreads();
    unsigned long long mine = 0;
    // kHalves: 32 taps per half (two halves only where the kernel has more than 32 taps, so that the
    // common kernels hold kBatch registers of sources, not 2 kBatch; with at most four rows at a time,
    // always two, in one code path).
    auto read_rows = [&](auto halves) {
        constexpr int kHalves = decltype(halves)::value;
        for (int m0 = warp; m0 < kRows; m0 += kBatch * kWarps) {
            int32_t s[kBatch][kHalves];
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
                const int64_t r = row_of[m0 + u * kWarps];
#pragma unroll
                for (int h = 0; h < kHalves; ++h) {
                    const int t = lane + 32 * h;
                    s[u][h] = -1;
                    if (r >= 0 && t < volume) s[u][h] = map ? map[r * volume + t] : static_cast<int32_t>(r);
                }
            }
#pragma unroll
            for (int u = 0; u < kBatch; ++u)
#pragma unroll
                for (int h = 0; h < kHalves; ++h) {
                    const int t = lane + 32 * h;
                    if (t < volume) table[t * kTableStride + m0 + u * kWarps] = s[u][h];
                    mine |= static_cast<unsigned long long>(__ballot_sync(0xffffffffu, s[u][h] >= 0)) << (32 * h);
                }
        }
    };
    if (kMaxBatch > 4 && volume <= 32)
        read_rows(std::integral_constant<int, 1>{});
    else
        read_rows(std::integral_constant<int, 2>{});
    if (lane == 0 && mine != 0) atomicOr(&tap_mask, mine);
    __syncthreads();
    const unsigned long long taps = tap_mask;
    if (tid < volume && ((taps >> tid) & 1ull)) active[__popcll(taps & ((1ull << tid) - 1ull))] = tid;
    __syncthreads();
    return __popcll(taps);
}

/// The source of one A row of a k step in the gathering kernels: `source`, its row in the tap's table
/// (-1 where absent), or in scatter mode the block's own row `own` (-1 past the rows; with the A rows
/// resident, copied once, `own` decides presence, else the tap's table does). Returns whether the row is
/// copied (present and `k_valid`) and sets `row` to it.
template <bool kScatter>
__device__ __forceinline__ bool a_row_source(int32_t source, int64_t own, bool resident_a, bool k_valid, int64_t& row) {
    bool present = source >= 0;
    row = source;
    if constexpr (kScatter) {
        present = resident_a ? own >= 0 : present;
        row = own;
    }
    return present && k_valid;
}
#endif

// ---- the warpgroup kernels (conv_warpgroup.cu) -----------------------------------------------------

// X(BM, BN, stages): the warpgroup (wgmma) configurations, BM rows (a warpgroup per 64) by BN output
// channels per block, k steps of one tap and 128 bytes of a row (64 float16 / bfloat16 channels, 32
// float); named "g<BM>x<BN>/<stages>". (256-row blocks, which read each tap's weights once per 256 rows,
// and pairs of 128-row blocks sharing each weight tile were slower in every case measured:
// docs/ENGINE_NOTES.md, item 4.)
#define SPARSEGRID_WARPGROUP_ENGINE_CONFIGS(X) \
    X(128, 128, 4)                             \
    X(128, 128, 3)                             \
    X(128, 64, 4)                              \
    X(128, 64, 3)

/// The rows of output channels of the warpgroup kernels' packed weight tiles: a multiple of the widest
/// block, so that every block's tile lies whole in the buffer (rows past the output channels are zeros).
constexpr int64_t warpgroup_tile_rows(int64_t y_channels) { return (y_channels + 127) / 128 * 128; }

/// Whether the warpgroup kernels can run on the context's device: this build has sm_90a code
/// (SPARSEGRID_SM90A, set by the build when the CUDA architectures include 90a) and the device is of
/// compute capability 9.0.
bool warpgroup_engine_available(const Context& ctx);

/// Dynamic shared memory of a warpgroup configuration over `volume` taps (with 1024 bytes to align it).
size_t warpgroup_engine_shared_bytes(int bm, int bn, int stages, int32_t volume);

/// The forward pass or input gradient (gathering, or in scatter mode) of configuration (BM, BN, stages)
/// in T (__half, __nv_bfloat16, or float in TF32), with the arguments of the engine's other launchers
/// (conv_implicit_gemm.cu) but the weights packed as tiles (pack_engine_tiles_kernel there). In TF32,
/// `x_rounded` says that x is already rounded to TF32 (round_x_to_tf32 there); otherwise the kernel
/// rounds the rows it gathers in shared memory. The products are the same either way.
template <typename T, int BM, int BN, int kStages>
void launch_warpgroup_engine(const int32_t* map, const int32_t* order, int64_t rows, int32_t volume, const void* x,
                             const void* tiles, void* out, int32_t x_channels, int32_t y_channels, bool scatter,
                             bool x_rounded, size_t shared_bytes, cudaStream_t stream);

}  // namespace sparsegrid::detail::cuda
