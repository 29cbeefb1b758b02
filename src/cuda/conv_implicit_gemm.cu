// The tensor-core convolution engine: forward and input gradient over a neighbour map as one implicit
// GEMM per block, for float16, bfloat16 and float in TF32 (float32 accumulators).
//
// A block owns BM output rows (taken in the map's row order, so that its rows share their taps) and BN
// output channels. It first loads its rows' map entries into shared memory and lists the taps at which
// any of its rows has an edge; its k loop then runs over (listed tap, channel chunk of `row bytes`)
// steps. Each step's operands -- the gathered input rows x[map[r][t], chunk] and the tap's packed weights
// W[t][n][chunk] -- arrive through a pipeline of `stages` shared-memory buffers filled by cp.async
// (absent sources are zero-filled by the copy itself), and are multiplied by ldmatrix + mma.sync. Every
// output element is summed by one thread in the order (tap, channel), 16 (TF32: 8) channels per mma:
// the same order in every tile configuration, so every configuration gives bitwise the same result, run
// after run. Taps that no row of a block has contribute nothing and are skipped.
//
// Scatter mode (outputs with at most one edge each, the fine side of a K = S plan): the block's rows are
// input rows, its A operand their own features at every tap, and after each tap's last chunk the
// accumulators go to the rows' one output row at that tap and restart from zero: the same sums as the
// gathering form, written once each.
//
// Taken for maps of at most 64 taps, when x has a multiple of 16 bytes per row (8 float16 / bfloat16
// channels, 4 float), the output an even channel count, and both start 16-byte aligned; the kernels of
// conv_forward.cu take the rest (odd channel counts, larger kernels).
#include "backend/backend.h"
#include "core/env.h"
#include "core/errors.h"
#include "cuda/conv_mma.cuh"
#include "cuda/conv_tiles.cuh"
#include "cuda/cuda_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace sparsegrid::detail::cuda {

namespace {

constexpr int kMaxEngineTaps = 64;

/// Scatter mode's output areas: per warp 16 rows of WN elements and 16 bytes of padding.
constexpr size_t scatter_area_bytes(int warps, int wn, size_t element_bytes) {
    return static_cast<size_t>(warps) * 16 * (static_cast<size_t>(wn) * element_bytes + 16);
}

/// A tile configuration: BM x BN outputs per block, in warps of WM x WN, k chunks of `row bytes` of a
/// row per pipeline stage (64 or 128 bytes: 32 or 64 16-bit channels, 16 or 32 float), `stages` deep.
/// Warpgroup configurations (conv_warpgroup.cu: wgmma, float16, bfloat16 and TF32 gathering on compute
/// capability 9.0 only) have BM = 128 (the kernel takes 256 too), 128-byte chunks and warpgroups of 64 x BN,
/// and read the weights packed as tiles (pack_engine_tiles_kernel).
struct EngineConfig {
    int bm, bn, row_bytes, wm, wn, stages;
    bool warpgroup = false;
    std::string name() const {
        if (warpgroup) return "g" + std::to_string(bm) + "x" + std::to_string(bn) + "/" + std::to_string(stages);
        return std::to_string(bm) + "x" + std::to_string(bn) + "x" + std::to_string(row_bytes) + "B/" +
            std::to_string(stages);
    }
    /// Dynamic shared memory: the stages, then the source table of `volume` taps (rows of bm + 4 entries:
    /// 16-byte aligned, and its stores from the map fall on 8 banks rather than one), then in scatter
    /// mode with warps of 32 rows each warp's area for its outputs (scatter_area_bytes, elements of
    /// `element_bytes`).
    size_t shared_bytes(int32_t volume, bool scatter, size_t element_bytes) const {
        if (warpgroup) return warpgroup_engine_shared_bytes(bm, bn, stages, volume);
        return static_cast<size_t>(stages) * static_cast<size_t>(bm + bn) * static_cast<size_t>(row_bytes + 16) +
            static_cast<size_t>(volume) * static_cast<size_t>(bm + 4) * sizeof(int32_t) +
            (scatter && wm <= 32 ? scatter_area_bytes(bm / wm * (bn / wn), wn, element_bytes) : 0);
    }
};

// X(BM, BN, row bytes, WM, WN, stages): every configuration the engine can run; each is compiled for
// every type and tested for exact results and bitwise agreement (test_convolution_cuda.cpp).
#define SPARSEGRID_CONV_ENGINE_CONFIGS(X) \
    X(128, 32, 128, 32, 32, 4)            \
    X(64, 64, 128, 32, 32, 4)             \
    X(128, 64, 128, 32, 32, 3)            \
    X(128, 64, 64, 32, 32, 4)             \
    X(256, 64, 64, 64, 32, 3)             \
    X(64, 128, 128, 32, 64, 3)            \
    X(128, 128, 64, 64, 32, 4)            \
    X(128, 128, 128, 64, 32, 3)           \
    X(256, 128, 64, 64, 64, 3)

constexpr EngineConfig kEngineConfigs[] = {
#define SPARSEGRID_CONFIG_ENTRY(BM, BN, RB, WM, WN, S) EngineConfig{BM, BN, RB, WM, WN, S},
    SPARSEGRID_CONV_ENGINE_CONFIGS(SPARSEGRID_CONFIG_ENTRY)
#undef SPARSEGRID_CONFIG_ENTRY
#define SPARSEGRID_WARPGROUP_ENTRY(BM, BN, S) EngineConfig{BM, BN, 128, 64, BN, S, true},
        SPARSEGRID_WARPGROUP_ENGINE_CONFIGS(SPARSEGRID_WARPGROUP_ENTRY)
#undef SPARSEGRID_WARPGROUP_ENTRY
};
constexpr int kEngineConfigCount = static_cast<int>(sizeof(kEngineConfigs) / sizeof(kEngineConfigs[0]));

/// The packed value of the weight at tap t for x channel xi and y channel yi (see below), in T.
template <typename T, typename W>
__device__ __forceinline__ T packed_weight(const W* __restrict__ weight, int32_t volume, int64_t in_channels, int64_t t,
                                           int64_t xi, int64_t yi, bool transpose, bool reverse_taps) {
    const int64_t ci = transpose ? yi : xi;
    const int64_t co = transpose ? xi : yi;
    T value = weight_in<T>(weight[(co * in_channels + ci) * volume + (reverse_taps ? volume - 1 - t : t)]);
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // TF32 runs from compute capability 8.0
    if constexpr (std::is_same_v<T, float>) {
        // Float packs only for TF32: rounded here once (the warpgroup kernels read the packed weights as
        // they are; the mma.sync kernels' own rounding leaves a rounded value unchanged).
        uint32_t bits = __float_as_uint(value);
        mma::Mma<float>::prepare(bits);
        value = __uint_as_float(bits);
    }
#endif
    return value;
}

/// packed[(t * y_channels + yi) * x_channels + xi] from weight[(co * in_channels + ci) * volume + t] with
/// (xi, yi) = (ci, co), or (co, ci) when `transpose`: per tap, one row of x channels per output channel,
/// the column-major B operand of the mma. With `reverse_taps`, packed tap t holds the weight's tap
/// volume - 1 - t. A float weight W of a 16-bit T is rounded to T here.
template <typename T, typename W>
__global__ void pack_engine_weight_kernel(const W* __restrict__ weight, T* __restrict__ packed, int32_t volume,
                                          int64_t in_channels, int64_t out_channels, bool transpose,
                                          bool reverse_taps) {
    const int64_t total = int64_t{volume} * in_channels * out_channels;
    const int64_t x_channels = transpose ? out_channels : in_channels;
    const int64_t y_channels = transpose ? in_channels : out_channels;
    // n runs over packed positions, so the writes are coalesced and the reads gather (weights are small).
    SG_GRID_STRIDE_LOOP(n, total) {
        const int64_t xi = n % x_channels;
        const int64_t rest = n / x_channels;
        packed[n] = packed_weight<T>(weight, volume, in_channels, rest / y_channels, xi, rest % y_channels, transpose,
                                     reverse_taps);
    }
}

/// The weights as the warpgroup kernels read them: per tap t and chunk c of 128 bytes of x channels,
/// warpgroup_tile_rows(y_channels) rows of 128 bytes, row yi holding channels c * chunk .. of output yi
/// with its 16-byte vector v at v ^ (yi % 8) (the 128-byte swizzle of their shared-memory tiles), so
/// that a block's tile of BN rows is one contiguous copy. Zeros past the channels; `total` elements.
template <typename T, typename W>
__global__ void pack_engine_tiles_kernel(const W* __restrict__ weight, T* __restrict__ tiles, int64_t total,
                                         int32_t volume, int64_t in_channels, int64_t out_channels, bool transpose,
                                         bool reverse_taps) {
    constexpr int64_t kChunk = 128 / static_cast<int64_t>(sizeof(T));
    constexpr int64_t kPerVector = 16 / static_cast<int64_t>(sizeof(T));
    const int64_t x_channels = transpose ? out_channels : in_channels;
    const int64_t y_channels = transpose ? in_channels : out_channels;
    const int64_t chunks = (x_channels + kChunk - 1) / kChunk;
    const int64_t y_rows = warpgroup_tile_rows(y_channels);
    SG_GRID_STRIDE_LOOP(n, total) {
        const int64_t e = n % kChunk;
        const int64_t yi = (n / kChunk) % y_rows;
        const int64_t c = (n / kChunk / y_rows) % chunks;
        const int64_t t = n / kChunk / y_rows / chunks;
        const int64_t xi = c * kChunk + (((e / kPerVector) ^ (yi % 8)) * kPerVector) + e % kPerVector;
        tiles[n] = xi < x_channels && yi < y_channels
            ? packed_weight<T>(weight, volume, in_channels, t, xi, yi, transpose, reverse_taps)
            : T{};
    }
}

template <typename T, int BM, int BN, int kRowBytes, int WM, int WN, int kStages, bool kScatter>
__global__ __launch_bounds__((BM / WM) * (BN / WN) * 32,
                             engine_min_blocks(BM / WM * (BN / WN),
                                               WM* WN)) void implicit_gemm_kernel(const int32_t* __restrict__ map,
                                                                                  const int32_t* __restrict__ order,
                                                                                  int64_t rows, int32_t volume,
                                                                                  const T* __restrict__ x,
                                                                                  const T* __restrict__ packed,
                                                                                  T* __restrict__ out,
                                                                                  int32_t x_channels,
                                                                                  int32_t y_channels) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // never launched there: the engine needs compute capability 8.0
#else
    using Op = mma::Mma<T>;
    constexpr int kThreadCount = (BM / WM) * (BN / WN) * 32;
    constexpr int kWarpsN = BN / WN;
    constexpr int kPitch = kRowBytes + 16;    // 16 bytes of padding: ldmatrix rows fall on distinct banks
    constexpr int kVectors = kRowBytes / 16;  // 16-byte copies per tile row
    constexpr int kElementsPerVector = 16 / static_cast<int>(sizeof(T));
    constexpr int kChunk = kRowBytes / static_cast<int>(sizeof(T));  // channels per k step
    constexpr int kStageBytes = (BM + BN) * kPitch;
    constexpr int MI = WM / 16;  // mma tiles per warp along rows (16 each) and channels (8 each)
    constexpr int NI = WN / 8;
    static_assert(kRowBytes % 32 == 0 && NI % 2 == 0 && WM % 16 == 0, "whole mma tiles");
    static_assert((BM * kVectors) % kThreadCount == 0 && (BN * kVectors) % kThreadCount == 0, "even copies");

    constexpr int kTableStride = BM + 4;
    // Each thread copies kRowsA consecutive rows of the A tile (and kRowsB of the B tile) at one 16-byte
    // column v: the rows' sources arrive in one shared-memory load, and the column is the thread's own.
    constexpr int kGroups = kThreadCount / kVectors;
    constexpr int kRowsA = BM / kGroups;
    constexpr int kRowsB = BN / kGroups;
    static_assert(kThreadCount % kVectors == 0 && BM % kGroups == 0 && BN % kGroups == 0, "whole row groups");
    static_assert(kRowsA == 2 || kRowsA == 4 || kRowsA == 8, "sources load as one int2 or int4 vector, or two");

    extern __shared__ __align__(128) unsigned char shared[];
    int32_t* table = reinterpret_cast<int32_t*>(shared + kStages * kStageBytes);  // [tap][kTableStride]: sources
    __shared__ int64_t row_of[BM];
    __shared__ int32_t active[kMaxEngineTaps];
    __shared__ unsigned long long tap_mask;

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int warp_m = (warp / kWarpsN) * WM;
    const int warp_n = (warp % kWarpsN) * WN;
    const int64_t row0 = int64_t{blockIdx.x} * BM;
    const int n0 = static_cast<int>(blockIdx.y) * BN;

    // The block's rows, their sources at every tap, and the taps any of them has (in scatter mode four
    // rows per warp at a time, as before: with more, some of its instantiations spill).
    constexpr int kTableBatch = kScatter ? 4 : 16;
    const int chunks = (x_channels + kChunk - 1) / kChunk;
    const int steps = block_tap_table<BM, kThreadCount, kTableStride, kTableBatch>(map, order, rows, volume, row0,
                                                                                   row_of, table, active, tap_mask) *
        chunks;

    // This thread's copies: rows group * kRowsA + c of A and group * kRowsB + c of B, bytes 16 v.
    const int group = tid / kVectors;
    const int v = tid % kVectors;
    const uint32_t a_copy = static_cast<uint32_t>((group * kRowsA) * kPitch + v * 16);
    const uint32_t b_copy = static_cast<uint32_t>(BM * kPitch + (group * kRowsB) * kPitch + v * 16);
    int64_t own_rows[kScatter ? kRowsA : 1];  // scatter: the A rows are the block's own rows
    if constexpr (kScatter) {
#pragma unroll
        for (int c = 0; c < kRowsA; ++c) own_rows[c] = row_of[group * kRowsA + c];
    }
    bool b_row_valid[kRowsB];
#pragma unroll
    for (int c = 0; c < kRowsB; ++c) b_row_valid[c] = n0 + group * kRowsB + c < y_channels;
    const uint32_t base = mma::shared_address(shared);

    // Issues the copies of the next k step into stage `stage` (nothing past the last step; the caller
    // commits a group either way, so that group counting stays uniform). Steps are issued in order, so
    // the (tap, chunk) of the next one is kept as counters.
    //
    // Scatter mode with at most kStages channel chunks: the A tile of a chunk (the block's own rows) is
    // the same at every tap, so chunk c is copied once, by the c-th load, into the A area of stage c
    // (loads go to the stages in turn), and only B is pipelined after that. Rows without an edge at a tap
    // then multiply their features instead of zeros, but those products are never written (their target
    // is -1), and the written ones are the same sums in the same order.
    // (128 x 128 tiles of 128-byte rows keep one chunk: the addressing of more cost them a spill.)
    constexpr int kResidentChunks = BM * BN >= 128 * 128 && kRowBytes >= 128 ? 1 : kStages;
    const bool resident_a = kScatter && (kResidentChunks > 1 ? chunks <= kResidentChunks : chunks == 1);
    int load_tap = 0, load_chunk = 0, loaded = 0;
    auto load_next = [&](int stage) {
        if (loaded >= steps) return;
        // The first tap's loads are the first `chunks` ones.
        const bool copy_a = !resident_a || (kResidentChunks > 1 ? load_tap == 0 : loaded == 0);
        ++loaded;
        const int t = active[load_tap];
        const int k = load_chunk * kChunk + v * kElementsPerVector;
        if (++load_chunk == chunks) {
            load_chunk = 0;
            ++load_tap;
        }
        const bool k_valid = k < x_channels;
        const uint32_t b_stage = base + static_cast<uint32_t>(stage * kStageBytes) + b_copy;
        const T* w = packed + (int64_t{t} * y_channels + n0 + group * kRowsB) * x_channels + k;
#pragma unroll
        for (int c = 0; c < kRowsB; ++c) {
            const bool valid = b_row_valid[c] && k_valid;
            mma::copy16(b_stage + static_cast<uint32_t>(c * kPitch), valid ? w + c * x_channels : packed, valid);
        }
        if (!copy_a) return;
        const uint32_t a_stage = base + static_cast<uint32_t>(stage * kStageBytes) + a_copy;
        int32_t src[kRowsA];
        const int32_t* sources = table + t * kTableStride + group * kRowsA;
        if constexpr (kRowsA == 2) {
            const int2 q = *reinterpret_cast<const int2*>(sources);
            src[0] = q.x, src[1] = q.y;
        } else {
#pragma unroll
            for (int c = 0; c < kRowsA; c += 4) {
                const int4 q = *reinterpret_cast<const int4*>(sources + c);
                src[c] = q.x, src[c + 1] = q.y, src[c + 2] = q.z, src[c + 3] = q.w;
            }
        }
#pragma unroll
        for (int c = 0; c < kRowsA; ++c) {
            int64_t row;
            const bool valid = a_row_source<kScatter>(src[c], kScatter ? own_rows[c] : int64_t{-1}, resident_a, k_valid,
                                                      row);
            const T* from = x + (valid ? row * x_channels + k : 0);
            mma::copy16(a_stage + static_cast<uint32_t>(c * kPitch), from, valid);
        }
    };

    float acc[MI][NI][4];
    mma::clear(acc);

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        load_next(s);
        mma::commit_copies();
    }
    // ldmatrix addresses: A rows warp_m + 16 i + lane % 16, bytes 16 (lane / 16); B rows (output channels)
    // warp_n + 16 j + lane % 8 + 8 (lane / 16), bytes 16 ((lane / 8) % 2).
    const uint32_t a_lane = static_cast<uint32_t>((warp_m + lane % 16) * kPitch + (lane / 16) * 16);
    const uint32_t b_lane = static_cast<uint32_t>(BM * kPitch + (warp_n + lane % 8 + 8 * (lane / 16)) * kPitch +
                                                  ((lane / 8) % 2) * 16);
    // Writes the accumulators to the output rows row_at(m) of the block's rows m (none where negative).
    // Accumulator (i, j, 2h + e) is row warp_m + 16 i + lane / 4 + 8 h, channel warp_n + 8 j + 2 (lane % 4) + e.
    auto write_rows = [&](auto row_at) {
#pragma unroll
        for (int i = 0; i < MI; ++i) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int64_t r = row_at(warp_m + 16 * i + lane / 4 + 8 * h);
                if (r < 0) continue;
                T* row_out = out + r * y_channels + n0;
#pragma unroll
                for (int j = 0; j < NI; ++j) {
                    const int n = warp_n + 8 * j + 2 * (lane % 4);
                    if (n0 + n < y_channels) mma::store_pair(row_out + n, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                }
            }
        }
    };
    // Scatter mode: a warp's products of a tap go out through an area of shared memory of its own, 16 rows
    // at a time, written as the accumulators lie and read back as 16-byte vectors along the rows, so that
    // a store instruction writes WN elements of 8 rows (16 bytes of 8 rows otherwise). Where the
    // output is not in whole aligned vectors, the pairs are stored directly, and so they are by warps of
    // 64 rows (whose accumulators leave no registers for the second path: it spilled).
    constexpr bool kStagedScatter = kScatter && WM <= 32;
    constexpr int kScatterPitch = WN * static_cast<int>(sizeof(T)) + 16;
    constexpr int kScatterVectors = WN * static_cast<int>(sizeof(T)) / 16;  // per row of a warp tile
    static_assert(!kScatter || (16 * kScatterVectors) % 32 == 0, "whole vector rounds per warp");
    auto write_scattered = [&](const int32_t* targets) {
        const uint32_t scatter_area = mma::shared_address(shared) +
            static_cast<uint32_t>(kStages * kStageBytes + volume * kTableStride * 4 +
                                  static_cast<int>(threadIdx.x / 32) * 16 * kScatterPitch);
#pragma unroll
        for (int i = 0; i < MI; ++i) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int j = 0; j < NI; ++j)
                    mma::store_shared_pair<T>(
                        scatter_area +
                            static_cast<uint32_t>((lane / 4 + 8 * h) * kScatterPitch +
                                                  (8 * j + 2 * (lane % 4)) * static_cast<int>(sizeof(T))),
                        acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            __syncwarp();
#pragma unroll
            for (int idx = lane; idx < 16 * kScatterVectors; idx += 32) {
                const int r = idx / kScatterVectors;
                const int vv = idx % kScatterVectors;
                const int64_t target = targets[warp_m + 16 * i + r];
                const int n = n0 + warp_n + vv * kElementsPerVector;
                if (target >= 0 && n < y_channels)
                    *reinterpret_cast<int4*>(out + target * y_channels + n) = mma::load_shared16(
                        scatter_area + static_cast<uint32_t>(r * kScatterPitch + vv * 16));
            }
            __syncwarp();  // the area is rewritten by the next 16 rows
        }
    };
    int tap_index = 0, chunk = 0;  // scatter: of the step being multiplied
    for (int step = 0; step < steps; ++step) {
        mma::wait_copies<kStages - 2>();
        __syncthreads();  // step's stage is complete for every thread; the stage of step - 1 is free
        load_next((step + kStages - 1) % kStages);
        mma::commit_copies();
        const uint32_t stage = base + static_cast<uint32_t>((step % kStages) * kStageBytes);
        // Resident: the A area of the stage that took this chunk's first load.
        const uint32_t a_tile = resident_a
            ? base + (kResidentChunks > 1 ? static_cast<uint32_t>(chunk * kStageBytes) : 0u)
            : stage;
#pragma unroll
        for (int kk = 0; kk < kRowBytes / 32; ++kk) {
            uint32_t a[MI][4];
            uint32_t b[NI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                mma::load_matrices(a[i], a_tile + a_lane + static_cast<uint32_t>(16 * i * kPitch + kk * 32));
#pragma unroll
                for (int e = 0; e < 4; ++e) Op::prepare(a[i][e]);
            }
#pragma unroll
            for (int j = 0; j < NI / 2; ++j) {
                uint32_t r[4];
                mma::load_matrices(r, stage + b_lane + static_cast<uint32_t>(16 * j * kPitch + kk * 32));
#pragma unroll
                for (int e = 0; e < 4; ++e) Op::prepare(r[e]);
                mma::split_pair(b, j, r);
            }
            mma::multiply<T>(acc, a, b);
        }
        if constexpr (kScatter) {
            if (++chunk < chunks) continue;
            chunk = 0;
            // The tap's products are complete: each goes to its row's one output row at this tap.
            const int32_t* targets = table + active[tap_index++] * kTableStride;
            // (Tested at every tap: held in a register across the loop, the flag cost 128 x 32 tiles a spill.)
            if (kStagedScatter && y_channels % kElementsPerVector == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0)
                write_scattered(targets);
            else
                write_rows([&](int m) { return int64_t{targets[m]}; });
            mma::clear(acc);
        }
    }
    mma::wait_copies<0>();  // no copy may still target shared memory when the block exits
    if constexpr (!kScatter) write_rows([&](int m) { return row_of[m]; });
#endif
}

/// The launchers' arguments: map, order, rows, volume, x, packed weights, out, x channels, y channels,
/// scatter, x_rounded (TF32: x already rounded, read by the warpgroup kernels only), shared bytes, stream.
using EngineKernel = void (*)(const int32_t*, const int32_t*, int64_t, int32_t, const void*, const void*, void*,
                              int32_t, int32_t, bool, bool, size_t, cudaStream_t);

/// Launches configuration (BM, BN, ...) in T, raising the kernel's dynamic shared-memory limit first on
/// each device it runs on.
template <typename T, int BM, int BN, int kRowBytes, int WM, int WN, int kStages>
void launch_engine(const int32_t* map, const int32_t* order, int64_t rows, int32_t volume, const void* x,
                   const void* packed, void* out, int32_t x_channels, int32_t y_channels, bool scatter,
                   bool /*x_rounded: these kernels round the fragments they load*/, size_t shared_bytes,
                   cudaStream_t stream) {
    // The gathering and the scatter kernels are separate instantiations: a run-time switch cost the
    // gathering one registers and time.
    auto* kernel = scatter ? implicit_gemm_kernel<T, BM, BN, kRowBytes, WM, WN, kStages, true>
                           : implicit_gemm_kernel<T, BM, BN, kRowBytes, WM, WN, kStages, false>;
    static std::atomic<uint64_t> raised[2] = {0, 0};  // one per instantiation
    raise_shared_memory_limit(
        kernel, EngineConfig{BM, BN, kRowBytes, WM, WN, kStages}.shared_bytes(kMaxEngineTaps, scatter, sizeof(T)),
        raised[scatter ? 1 : 0]);
    const dim3 grid(static_cast<unsigned>((rows + BM - 1) / BM), static_cast<unsigned>((y_channels + BN - 1) / BN));
    kernel<<<grid, (BM / WM) * (BN / WN) * 32, shared_bytes, stream>>>(
        map, order, rows, volume, static_cast<const T*>(x), static_cast<const T*>(packed), static_cast<T*>(out),
        x_channels, y_channels);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

/// A warpgroup configuration as an EngineKernel (float16, bfloat16 and TF32, gathering or scattering;
/// `packed`: the weights packed as tiles).
template <typename T, int BM, int BN, int kStages>
void launch_warpgroup(const int32_t* map, const int32_t* order, int64_t rows, int32_t volume, const void* x,
                      const void* packed, void* out, int32_t x_channels, int32_t y_channels, bool scatter,
                      bool x_rounded, size_t shared_bytes, cudaStream_t stream) {
    launch_warpgroup_engine<T, BM, BN, kStages>(map, order, rows, volume, x, packed, out, x_channels, y_channels,
                                                scatter, x_rounded, shared_bytes, stream);
}

template <typename T>
constexpr std::array<EngineKernel, kEngineConfigCount> engine_launchers() {
    return {
#define SPARSEGRID_LAUNCHER_ENTRY(BM, BN, RB, WM, WN, S) &launch_engine<T, BM, BN, RB, WM, WN, S>,
        SPARSEGRID_CONV_ENGINE_CONFIGS(SPARSEGRID_LAUNCHER_ENTRY)
#undef SPARSEGRID_LAUNCHER_ENTRY
#define SPARSEGRID_WARPGROUP_LAUNCHER(BM, BN, S) &launch_warpgroup<T, BM, BN, S>,
            SPARSEGRID_WARPGROUP_ENGINE_CONFIGS(SPARSEGRID_WARPGROUP_LAUNCHER)
#undef SPARSEGRID_WARPGROUP_LAUNCHER
    };
}

/// kEngineAutomatic, kEngineOff, or the index of the forced configuration in engine_configurations().
std::atomic<int> g_forced_config{kEngineAutomatic};

/// The index of `name` in engine_configurations(), kEngineAutomatic for "" and "auto", kEngineOff for
/// "off"; raises for anything else, listing the valid names (`what` names the setting).
int configuration_index(const std::string& name, const char* what) {
    if (name.empty() || name == "auto") return kEngineAutomatic;
    if (name == "off") return kEngineOff;
    const std::vector<std::string> names = engine_configurations();
    std::string valid;
    for (size_t i = 0; i < names.size(); ++i) {
        if (names[i] == name) return static_cast<int>(i);
        valid += " " + names[i];
    }
    throw_error(what, " must be auto, off or one of", valid, ", got '", name, "'");
}

int config_index(int bm, int bn, int row_bytes, int stages) {
    for (int i = 0; i < kEngineConfigCount; ++i) {
        const EngineConfig& c = kEngineConfigs[i];
        if (!c.warpgroup && c.bm == bm && c.bn == bn && c.row_bytes == row_bytes && c.stages == stages) return i;
    }
    return 0;  // unreachable for the names below (they are in the list)
}

int warpgroup_config_index(int bm, int bn, int stages) {
    for (int i = 0; i < kEngineConfigCount; ++i) {
        const EngineConfig& c = kEngineConfigs[i];
        if (c.warpgroup && c.bm == bm && c.bn == bn && c.stages == stages) return i;
    }
    return 0;  // unreachable for the names below (they are in the list)
}

/// The automatic choice by output width and input row bytes. Measured on an H200 over the batch-16
/// reference k3s1 and k2s2 maps, in = out = C (forward / input gradient, ms): 128 x 64 tiles lead up to
/// 64 output channels, with 64-byte k chunks for rows of 64 bytes (float16 C = 32: 0.081 against 0.134
/// with 128-byte chunks, half of them zeros) and 128-byte chunks from 128 (TF32 C = 64: 0.263 against
/// 0.275); 128 x 128 tiles with 64-byte chunks above 64 (float16 C = 128: 0.355, next best 0.383; TF32
/// 0.755). 128 x 32 tiles (4 warps) never led, even at 32 output channels. TF32 above 64 output channels
/// over 27 taps or more, gathering: 64 x 128 tiles of 128-byte chunks (k3s1 C = 128: 0.610 against 0.662
/// with 128 x 128 x 64 B / 4; over the 8 taps of k2s2 the latter still led, 0.360 against 0.375).
/// Where the warpgroup kernels run (`warpgroup`: compute capability 9.0), gathering,
/// they lead from rows of 128 bytes and 64 output channels (float16, forward / input gradient, ms):
/// g128x64/4 up to 64 output channels (k3s1 C = 64: 0.093 / 0.090 against 0.118 / 0.118 with
/// 128 x 64 x 128 B / 3; the k2s2 input gradient 0.078 against 0.085) and g128x128/3 above (k3s1
/// C = 128: 0.198 / 0.197 against 0.310 / 0.309 with 128 x 128 x 64 B / 4; the k2s2 input gradient
/// 0.146 against 0.200). bfloat16 alike. In TF32 the same two lead from 32 output channels (k3s1,
/// forward / input gradient, ms): g128x64/4 at C = 32 (0.115 / 0.113 against 0.127 / 0.128 with
/// 128 x 64 x 128 B / 3) and C = 64 (0.196 / 0.197 against 0.222 / 0.223), g128x128/3 at C = 128 (0.438 /
/// 0.438 against 0.609 / 0.607 with 64 x 128 x 128 B / 3; the k2s2 input gradient 0.242 against 0.359).
/// In scatter mode (the k2s2 forward pass, ms) the warpgroup kernels lead only in TF32, from rows of 128
/// bytes and 32 output channels: g128x64/4 at C = 32 (0.117 against 0.127) and C = 64 (0.209 against
/// 0.219), g128x128/4 at C = 128 (0.468 against 0.582 with 128 x 128 x 64 B / 4); in float16 the mma.sync
/// kernels stay ahead (C = 64: 0.153 against 0.200; C = 128: 0.324 against 0.370), each tap's products
/// being waited for before they are written. Since their warps of 32 rows store through shared memory
/// (16-byte vectors), 16-bit scatter above 64 output channels takes 64 x 128 x 128 B / 3, whose warps
/// are 32 rows tall (H100, k2s2 forward, float16 C = 128: 0.315 / 0.322 against 0.363 / 0.366 with
/// 128 x 128 x 64 B / 4, whose 64-row warps store pairs; bfloat16 0.323 against 0.366; at C = 64
/// 128 x 64 x 128 B / 3 stays ahead, 0.146 against 0.191). From 256 output channels the 16-bit scatter
/// goes back to g128x64/4 (H100, float16 C = 256: 0.715 against 0.780 ms, the outputs no longer zeroed
/// first; 0.909 against 0.956 when they were).
int automatic_config(int64_t x_channels, int64_t y_channels, size_t element_bytes, int volume, bool scatter,
                     bool warpgroup) {
    const int64_t row_bytes = x_channels * static_cast<int64_t>(element_bytes);
    if (warpgroup && scatter && element_bytes == 4 && row_bytes >= 128 && y_channels >= 32)
        return y_channels <= 64 ? warpgroup_config_index(128, 64, 4) : warpgroup_config_index(128, 128, 4);
    if (warpgroup && !scatter && row_bytes >= 128 && y_channels >= (element_bytes == 4 ? 32 : 64))
        return y_channels <= 64 ? warpgroup_config_index(128, 64, 4) : warpgroup_config_index(128, 128, 3);
    if (warpgroup && scatter && element_bytes == 2 && row_bytes >= 128 && y_channels >= 256)
        return warpgroup_config_index(128, 64, 4);
    if (y_channels <= 64) return row_bytes >= 128 ? config_index(128, 64, 128, 3) : config_index(128, 64, 64, 4);
    if (scatter && element_bytes == 2 && row_bytes >= 128) return config_index(64, 128, 128, 3);
    if (element_bytes == 4 && row_bytes >= 128 && volume >= 27 && !scatter) return config_index(64, 128, 128, 3);
    return config_index(128, 128, 64, 4);
}

}  // namespace

std::vector<std::string> engine_configurations() {
    std::vector<std::string> names;
    for (const EngineConfig& config : kEngineConfigs) names.push_back(config.name());
    for (const std::string& name : weight_engine_configurations()) names.push_back(name);
    return names;
}

int forward_engine_configuration_count() { return kEngineConfigCount; }

void force_engine_configuration(const std::string& name) {
    g_forced_config.store(configuration_index(name, "configuration"));
}

int forced_engine_configuration() {
    const int forced = g_forced_config.load(std::memory_order_relaxed);
    if (forced != kEngineAutomatic) return forced;
    // SPARSEGRID_CONV_CONFIG, read once (where the API has forced nothing).
    static const int from_environment = configuration_index(env_string("SPARSEGRID_CONV_CONFIG"),
                                                            "SPARSEGRID_CONV_CONFIG");
    return from_environment;
}

namespace {

/// The weights packed for the mma.sync kernels or, with `tiles`, as the warpgroup kernels' tiles.
template <typename T>
Buffer<T> pack_engine_weight(const MapConvolution& args, bool tiles, const Context& ctx) {
    const int64_t in_channels = args.transpose_weight ? args.out_channels : args.x_channels;
    const int64_t out_channels = args.transpose_weight ? args.x_channels : args.out_channels;
    constexpr int64_t kChunk = 128 / static_cast<int64_t>(sizeof(T));
    const int64_t size = tiles ? int64_t{args.volume} * ((args.x_channels + kChunk - 1) / kChunk) *
            warpgroup_tile_rows(args.out_channels) * kChunk
                               : int64_t{args.volume} * args.x_channels * args.out_channels;
    Buffer<T> packed = Buffer<T>::allocate(size, ctx);
    const cudaStream_t stream = stream_of(ctx);
    with_weight_type<T>(args.weight_dtype, [&](auto weight_type) {
        using W = typename decltype(weight_type)::type;
        const W* weight = static_cast<const W*>(args.weight);
        if (tiles)
            pack_engine_tiles_kernel<T, W>
                <<<blocks_for(size), kThreads, 0, stream>>>(weight, packed.data(), size, args.volume, in_channels,
                                                            out_channels, args.transpose_weight, args.reverse_taps);
        else
            pack_engine_weight_kernel<T, W>
                <<<blocks_for(size), kThreads, 0, stream>>>(weight, packed.data(), args.volume, in_channels,
                                                            out_channels, args.transpose_weight, args.reverse_taps);
    });
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    return packed;
}

/// out[i] = x[i] rounded to TF32 (cvt.rna, as mma::Mma<float>::prepare), four floats at a time.
__global__ void round_to_tf32_kernel(const float4* __restrict__ x, float4* __restrict__ out, int64_t vectors) {
    SG_GRID_STRIDE_LOOP(i, vectors) {
        float4 v = x[i];
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
        float* f = &v.x;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            uint32_t bits = __float_as_uint(f[e]);
            mma::Mma<float>::prepare(bits);
            f[e] = __uint_as_float(bits);
        }
#endif
        out[i] = v;
    }
}

/// Whether a TF32 pass on the warpgroup kernels reads x rounded once into a copy (round_x_to_tf32)
/// rather than rounding every gathered row in shared memory: when gathering, over 27 taps or more, or
/// onto more rows than x has, where each row of x is gathered several times on average. The copy costs a
/// read and a write of x and the kernels then leave a pass over shared memory out of every k step
/// (H100, k3s1 C = 64: see ENGINE_NOTES). SPARSEGRID_TF32_ROUND_ONCE=0 rounds in the kernels always.
bool rounds_x_once(const MapConvolution& args) {
    static const bool enabled = env_string("SPARSEGRID_TF32_ROUND_ONCE") != "0";
    return enabled && !args.scatter && args.x_rows > 0 && (args.volume >= 27 || args.rows > args.x_rows);
}

/// x (args.x_rows rows of args.x_channels floats, a multiple of 4, 16-byte aligned) rounded to TF32.
Buffer<float> round_x_to_tf32(const MapConvolution& args, const Context& ctx) {
    const int64_t vectors = checked_mul("round_x_to_tf32", "x elements", args.x_rows, args.x_channels) / 4;
    Buffer<float> rounded = Buffer<float>::allocate(vectors * 4, ctx);
    const cudaStream_t stream = stream_of(ctx);
    if (vectors > 0)
        round_to_tf32_kernel<<<blocks_for(vectors), kThreads, 0, stream>>>(
            static_cast<const float4*>(args.x), reinterpret_cast<float4*>(rounded.data()), vectors);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    return rounded;
}

}  // namespace

template <typename T>
bool engine_convolution(const MapConvolution& args, const Context& ctx) {
    const int64_t x_channels = args.x_channels;
    const int64_t y_channels = args.out_channels;
    constexpr int kElementsPerVector = 16 / static_cast<int>(sizeof(T));
    int index = forced_engine_configuration();
    if (index >= kEngineConfigCount) index = kEngineAutomatic;  // a weight-gradient configuration
    if (index == kEngineOff || args.volume > kMaxEngineTaps || (args.map == nullptr && args.volume != 1)) return false;
    if (x_channels % kElementsPerVector != 0 || y_channels % 2 != 0) return false;
    // The kernel counts its k steps (taps x chunks) and copies in int: wider rows take the tiled kernels.
    if (x_channels > kMaxEngineChannels || y_channels > kMaxEngineChannels) return false;
    if (reinterpret_cast<uintptr_t>(args.x) % 16 != 0 || reinterpret_cast<uintptr_t>(args.out) % (2 * sizeof(T)) != 0)
        return false;
    // The weights in the layout of the configurations that run (both when tuning): the mma.sync kernels'
    // (0) or the warpgroup kernels' tiles (1), each packed once. False for an allocator's odd alignment.
    Buffer<T> packed[2];
    bool packed_done[2] = {false, false};
    auto prepare = [&](bool tiles) {
        const int kind = tiles ? 1 : 0;
        if (!packed_done[kind]) packed[kind] = pack_engine_weight<T>(args, tiles, ctx);
        packed_done[kind] = true;
        return reinterpret_cast<uintptr_t>(packed[kind].data()) % 16 == 0;
    };
    // TF32 on the warpgroup kernels: x rounded once into a copy where that pays (rounds_x_once), made
    // when a warpgroup configuration first runs.
    Buffer<float> rounded_x;
    bool rounded_done = false;
    static constexpr std::array<EngineKernel, kEngineConfigCount> launchers = engine_launchers<T>();
    auto launch = [&](int config) {
        const bool warpgroup = kEngineConfigs[config].warpgroup;
        const void* x = args.x;
        bool x_rounded = false;
        if constexpr (std::is_same_v<T, float>) {
            if (warpgroup && rounds_x_once(args)) {
                if (!rounded_done) rounded_x = round_x_to_tf32(args, ctx);
                rounded_done = true;
                x = rounded_x.data();
                x_rounded = true;
            }
        }
        launchers[static_cast<size_t>(config)](
            args.map, args.order, args.rows, args.volume, x, packed[warpgroup ? 1 : 0].data(), args.out,
            static_cast<int32_t>(x_channels), static_cast<int32_t>(y_channels), args.scatter, x_rounded,
            kEngineConfigs[config].shared_bytes(args.volume, args.scatter, sizeof(T)), stream_of(ctx));
    };
    // Warpgroup configurations: on a device that runs them; elsewhere a forced one gives way to the
    // automatic choice (the same results: every configuration sums in one order).
    const bool warpgroup_ok = warpgroup_engine_available(ctx);
    if (index >= 0 && kEngineConfigs[index].warpgroup && !warpgroup_ok) index = kEngineAutomatic;
    if (index == kEngineAutomatic && !engine_tuning_idle()) {
        if (!prepare(false) || (warpgroup_ok && !prepare(true))) return false;
        const EngineShape shape{args.scatter ? "scatter" : "forward",
                                engine_dtype_name<T>(),
                                x_channels,
                                y_channels,
                                args.volume,
                                floor_log2(args.rows)};
        const TunedConfiguration tuned = tune_among(kEngineConfigs, warpgroup_ok, shape, launch, ctx);
        if (tuned.ran) return true;
        index = tuned.index;
    }
    if (index == kEngineAutomatic)
        index = automatic_config(x_channels, y_channels, sizeof(T), args.volume, args.scatter, warpgroup_ok);
    if (!prepare(kEngineConfigs[index].warpgroup)) return false;
    launch(index);
    return true;
}

template bool engine_convolution<float>(const MapConvolution&, const Context&);
template bool engine_convolution<__half>(const MapConvolution&, const Context&);
template bool engine_convolution<__nv_bfloat16>(const MapConvolution&, const Context&);

}  // namespace sparsegrid::detail::cuda
