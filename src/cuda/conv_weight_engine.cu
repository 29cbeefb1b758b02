// The tensor-core engine's weight gradient, for float16, bfloat16 and float in TF32 (float32 sums):
// per tap t, partial[slot][t][a][b] = sum over the slot's rows r with an edge at t of
// gathered[map[r][t], a] * per_row[r, b], a GEMM with M = gathered channels, N = row channels and K =
// edges. Rows are split into a number of slots fixed by the problem's shape (never by the device or the
// tile configuration); a block owns one (tile, slot, tap), walks its slot's rows in lists of kListRows
// rows, compacts each list's edges at t into shared memory (a block scan: edges stay in row order), and
// runs a cp.async pipeline over the list's edges, 32 per step: ldmatrix.trans (16-bit) or scalar and
// paired fragment loads (TF32) and mma.sync. A second kernel adds the slots in slot order. Each
// element's sum runs over the same edge groups in the same order in every configuration: results are
// bitwise equal across configurations and runs, and no atomics are used.
#include "backend/backend.h"
#include "core/env.h"
#include "core/errors.h"
#include "cuda/conv_mma.cuh"
#include "cuda/conv_tiles.cuh"
#include "cuda/conv_warpgroup.cuh"
#include "cuda/cuda_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace sparsegrid::detail::cuda {

namespace {

constexpr int kListRows = 1024;         // rows compacted at a time (a constant: it fixes the edge groups)
constexpr int kEdgeStep = 32;           // edges per pipeline stage
constexpr int kWarpgroupEdgeStep = 64;  // edges per stage of the warpgroup kernels: 4 products of 16

/// A weight-gradient tile configuration: BM x BN of [gathered channels, row channels] per block, in
/// warps of WM x WN, `stages` deep.
struct WeightConfig {
    int bm, bn, wm, wn, stages;
    /// Warpgroup (wgmma) configurations: warpgroups of 64 x BN, kWarpgroupEdgeStep edges per step in the
    /// 128-byte swizzle (float16 and bfloat16 on compute capability 9.0 only); named "wg<BM>x<BN>/<stages>".
    bool warpgroup = false;
    std::string name() const {
        return (warpgroup ? "wg" : "w") + std::to_string(bm) + "x" + std::to_string(bn) + "/" + std::to_string(stages);
    }
    int threads() const { return warpgroup ? bm / 64 * 128 : (bm / wm) * (bn / wn) * 32; }
    /// Bytes of one staged row of `channels` elements of `element_bytes`: padded by 16 bytes (ldmatrix
    /// rows on distinct banks) or, for 4-byte elements read one by one, by 32 (a row stride of 8 banks
    /// modulo 32, so the fragment loads of a warp fall on distinct banks).
    static int pitch(int channels, int element_bytes) {
        return channels * element_bytes + (element_bytes == 4 ? 32 : 16);
    }
    size_t shared_bytes(int element_bytes) const {
        // Warpgroup stages: 128-byte rows of 64 channels per edge, 1024-byte aligned (the swizzle repeats
        // every 1024 bytes).
        if (warpgroup)
            return 1024 + static_cast<size_t>(stages) * kWarpgroupEdgeStep * 2 * static_cast<size_t>(bm + bn);
        return static_cast<size_t>(stages) * kEdgeStep *
            static_cast<size_t>(pitch(bm, element_bytes) + pitch(bn, element_bytes));
    }
};

// X(BM, BN, WM, WN, stages)
#define SPARSEGRID_WEIGHT_ENGINE_CONFIGS(X) \
    X(32, 32, 32, 16, 4)                    \
    X(64, 64, 32, 32, 4)                    \
    X(128, 64, 64, 32, 4)                   \
    X(128, 128, 64, 32, 3)

// X(BM, BN, stages): the warpgroup configurations.
#define SPARSEGRID_WEIGHT_WARPGROUP_CONFIGS(X) \
    X(128, 128, 3)                             \
    X(128, 64, 4)                              \
    X(64, 64, 4)

constexpr WeightConfig kWeightConfigs[] = {
#define SPARSEGRID_WEIGHT_ENTRY(BM, BN, WM, WN, S) WeightConfig{BM, BN, WM, WN, S},
    SPARSEGRID_WEIGHT_ENGINE_CONFIGS(SPARSEGRID_WEIGHT_ENTRY)
#undef SPARSEGRID_WEIGHT_ENTRY
#define SPARSEGRID_WEIGHT_WARPGROUP_ENTRY(BM, BN, S) WeightConfig{BM, BN, 64, BN, S, true},
        SPARSEGRID_WEIGHT_WARPGROUP_CONFIGS(SPARSEGRID_WEIGHT_WARPGROUP_ENTRY)
#undef SPARSEGRID_WEIGHT_WARPGROUP_ENTRY
};
constexpr int kWeightConfigCount = static_cast<int>(sizeof(kWeightConfigs) / sizeof(kWeightConfigs[0]));

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
/// Four 8 x 8 matrices of 16-bit elements, transposed: lane l receives elements (2 (l % 4), l / 4) and
/// (2 (l % 4) + 1, l / 4) of each matrix stored with 8 rows of 16 bytes.
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], uint32_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}
#endif

/// A weight-gradient block's first rows of either operand (m0, n0) and its tap, in either block order
/// of launch_weight_kernel: grid z is the tap (taps slowest), or with one z grid x is tile x tap (taps
/// fastest; with one tap both read the same).
struct BlockTileTap {
    int m0, n0;
    int32_t t;
};
template <int BM, int BN>
__device__ __forceinline__ BlockTileTap block_tile_and_tap(int32_t volume, int32_t tiles_n) {
    if (gridDim.z > 1) {
        const int tile = static_cast<int>(blockIdx.x);
        return {tile / tiles_n * BM, tile % tiles_n * BN, static_cast<int32_t>(blockIdx.z)};
    }
    const int tile = static_cast<int>(blockIdx.x / static_cast<unsigned>(volume));
    return {tile / tiles_n * BM, tile % tiles_n * BN, static_cast<int32_t>(blockIdx.x % static_cast<unsigned>(volume))};
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
/// The map entries at tap t of the rows [list0, list_end) (at most kListRows) that this thread owns:
/// kListRows / kThreadCount consecutive rows, -1 past list_end (all loads in flight at once).
template <int kThreadCount>
__device__ __forceinline__ void load_list(const int32_t* __restrict__ map, const int32_t* __restrict__ tap_major,
                                          int64_t rows, int32_t volume, int32_t t, int64_t list0, int64_t list_end,
                                          int32_t (&s)[kListRows / kThreadCount]) {
    constexpr int kRowsPerThread = kListRows / kThreadCount;
    static_assert(kListRows % kThreadCount == 0 && kListRows <= 65536, "whole rows per thread, 16-bit offsets");
    const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
        const int64_t r = list0 + tid * kRowsPerThread + i;
        s[i] = -1;
        // Tap-major, a thread's rows are one 32-byte sector and a warp's 32 consecutive ones; row-major,
        // every entry costs a sector of its own (a row of the map is `volume` entries long).
        if (r < list_end)
            s[i] = tap_major ? tap_major[int64_t{t} * rows + r] : map ? map[r * volume + t] : static_cast<int32_t>(r);
    }
}

/// The list's edges (the entries of load_list that are sources), in row order, into list_gathered (the
/// gathered row) and list_offset (the map row less the list's first): one block scan places them.
/// Returns their count, every thread's writes visible to the block.
template <int kThreadCount>
__device__ __forceinline__ int place_list(const int32_t (&s)[kListRows / kThreadCount],
                                          typename cub::BlockScan<int, kThreadCount>::TempStorage& scan_storage,
                                          int32_t* list_gathered, uint16_t* list_offset) {
    constexpr int kRowsPerThread = kListRows / kThreadCount;
    const int tid = static_cast<int>(threadIdx.x);
    int present[kRowsPerThread], position[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) present[i] = s[i] >= 0 ? 1 : 0;
    int edges = 0;
    cub::BlockScan<int, kThreadCount>(scan_storage).ExclusiveSum(present, position, edges);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
        if (s[i] >= 0) {
            list_gathered[position[i]] = s[i];
            list_offset[position[i]] = static_cast<uint16_t>(tid * kRowsPerThread + i);
        }
    __syncthreads();  // the list is complete
    return edges;
}
#endif

template <typename T, int BM, int BN, int WM, int WN, int kStages>
__global__
__launch_bounds__((BM / WM) * (BN / WN) * 32, engine_min_blocks(BM / WM * (BN / WN), WM* WN)) void weight_engine_kernel(
    const int32_t* __restrict__ map, const int32_t* __restrict__ tap_major, int64_t rows, int32_t volume,
    const T* __restrict__ gathered, const T* __restrict__ per_row, float* __restrict__ partial, int32_t a_channels,
    int32_t b_channels, int64_t rows_per_slot, int32_t tiles_n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // never launched there: the engine needs compute capability 8.0
#else
    using Op = mma::Mma<T>;
    constexpr int kThreadCount = (BM / WM) * (BN / WN) * 32;
    constexpr int kWarpsN = BN / WN;
    constexpr int E = static_cast<int>(sizeof(T));
    constexpr int kPitchA = BM * E + (E == 4 ? 32 : 16);
    constexpr int kPitchB = BN * E + (E == 4 ? 32 : 16);
    constexpr int kVectorsA = BM * E / 16;  // 16-byte copies per staged row
    constexpr int kVectorsB = BN * E / 16;
    constexpr int kElementsPerVector = 16 / E;
    constexpr int kStageBytes = kEdgeStep * (kPitchA + kPitchB);
    constexpr int MI = WM / 16;
    constexpr int NI = WN / 8;
    static_assert(NI % 2 == 0 && WM % 16 == 0, "whole mma tiles");
    static_assert((kEdgeStep * kVectorsA) % kThreadCount == 0 && (kEdgeStep * kVectorsB) % kThreadCount == 0,
                  "even copies");
    extern __shared__ __align__(128) unsigned char shared[];
    __shared__ typename cub::BlockScan<int, kThreadCount>::TempStorage scan_storage;
    __shared__ int32_t list_gathered[kListRows];  // per edge of the list: the gathered row
    __shared__ uint16_t list_offset[kListRows];   // and the map row less the list's first

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int warp_m = (warp / kWarpsN) * WM;
    const int warp_n = (warp % kWarpsN) * WN;
    const BlockTileTap block = block_tile_and_tap<BM, BN>(volume, tiles_n);
    const int m0 = block.m0, n0 = block.n0;
    const int32_t t = block.t;
    const int64_t slot = blockIdx.y;
    const int64_t begin = slot * rows_per_slot;
    const int64_t end = begin + rows_per_slot < rows ? begin + rows_per_slot : rows;
    const uint32_t base = mma::shared_address(shared);

    float acc[MI][NI][4];
    mma::clear(acc);

    for (int64_t list0 = begin; list0 < end; list0 += kListRows) {
        const int64_t list_end = list0 + kListRows < end ? list0 + kListRows : end;
        int32_t entries[kListRows / kThreadCount];
        load_list<kThreadCount>(map, tap_major, rows, volume, t, list0, list_end, entries);
        const int edges = place_list<kThreadCount>(entries, scan_storage, list_gathered, list_offset);
        const int steps = (edges + kEdgeStep - 1) / kEdgeStep;

        // Rows k of a stage: `channels` channels from c0 on of the row rows[edge] of `source` for the step's
        // edge k, zeros past the edges and the channels. `vectors`: 16-byte copies per staged row.
        auto copy_operand = [&](auto vectors, int pitch, unsigned char* stage_rows, const T* source, const auto* rows,
                                int c0, int channels, int step) {
            constexpr int kVectorsPerRow = decltype(vectors)::value;
#pragma unroll
            for (int c = 0; c < kEdgeStep * kVectorsPerRow / kThreadCount; ++c) {
                const int idx = tid + c * kThreadCount;
                const int k = idx / kVectorsPerRow;
                const int v = idx % kVectorsPerRow;
                const int edge = step * kEdgeStep + k;
                const int channel = c0 + v * kElementsPerVector;
                const bool valid = edge < edges && channel < channels;
                const T* from = valid ? source + int64_t{rows[edge]} * channels + channel : source;
                mma::copy16(mma::shared_address(stage_rows + k * pitch + v * 16), from, valid);
            }
        };
        auto load_step = [&](int step, int stage) {
            if (step >= steps) return;
            unsigned char* a_stage = shared + stage * kStageBytes;
            copy_operand(std::integral_constant<int, kVectorsA>{}, kPitchA, a_stage, gathered, list_gathered, m0,
                         a_channels, step);
            copy_operand(std::integral_constant<int, kVectorsB>{}, kPitchB, a_stage + kEdgeStep * kPitchA,
                         per_row + list0 * b_channels, list_offset, n0, b_channels, step);
        };

#pragma unroll
        for (int s = 0; s < kStages - 1; ++s) {
            load_step(s, s);
            mma::commit_copies();
        }
        for (int step = 0; step < steps; ++step) {
            mma::wait_copies<kStages - 2>();
            __syncthreads();
            load_step(step + kStages - 1, (step + kStages - 1) % kStages);
            mma::commit_copies();
            const uint32_t a_stage = base + static_cast<uint32_t>((step % kStages) * kStageBytes);
            const uint32_t b_stage = a_stage + static_cast<uint32_t>(kEdgeStep * kPitchA);
            if constexpr (E == 2) {
                // A (edges x gathered channels, stored edge-major) and B (edges x row channels) both go
                // through ldmatrix.trans. A matrices: (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7),
                // (k 8-15, m 8-15); B: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
                const int a_k = lane % 8 + 8 * (lane / 16);
                const int a_m = 8 * ((lane / 8) % 2);
                const int b_k = lane % 8 + 8 * ((lane / 8) % 2);
                const int b_n = 8 * (lane / 16);
#pragma unroll
                for (int kk = 0; kk < kEdgeStep / 16; ++kk) {
                    uint32_t a[MI][4];
                    uint32_t b[NI][2];
#pragma unroll
                    for (int i = 0; i < MI; ++i)
                        load_matrices_transposed(
                            a[i],
                            a_stage + static_cast<uint32_t>((16 * kk + a_k) * kPitchA + (warp_m + 16 * i + a_m) * E));
#pragma unroll
                    for (int j = 0; j < NI / 2; ++j) {
                        uint32_t r[4];
                        load_matrices_transposed(
                            r,
                            b_stage + static_cast<uint32_t>((16 * kk + b_k) * kPitchB + (warp_n + 16 * j + b_n) * E));
                        mma::split_pair(b, j, r);
                    }
                    mma::multiply<T>(acc, a, b);
                }
            } else {
                // TF32 (ldmatrix.trans moves 16-bit elements only): a = (m g, k q), (m g + 8, k q),
                // (m g, k q + 4), (m g + 8, k q + 4); b = (k q, n g), (k q + 4, n g) with g = lane / 4,
                // q = lane % 4. Row r of each 16-row tile of A is channel 2 (r % 8) + r / 8 of it, so
                // that a lane's (m g, k q) and (m g + 8, k q) are the adjacent channels 2 g, 2 g + 1: one
                // 8-byte load per pair (a half-warp's loads cover the 32 banks once, staged rows being 8
                // banks apart modulo 32). Each output's sum is unchanged; the epilogue writes row r to
                // its channel. B's elements (two edges apart) are read one by one.
                const float* a_tile = reinterpret_cast<const float*>(shared + (step % kStages) * kStageBytes);
                const float* b_tile = reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(a_tile) +
                                                                     kEdgeStep * kPitchA);
                constexpr int kLdA = kPitchA / 4, kLdB = kPitchB / 4;
                const int g = lane / 4, q = lane % 4;
#pragma unroll
                for (int kk = 0; kk < kEdgeStep / 8; ++kk) {
                    uint32_t a[MI][4];
                    uint32_t b[NI][2];
#pragma unroll
                    for (int i = 0; i < MI; ++i) {
                        const float* pair = a_tile + (8 * kk + q) * kLdA + warp_m + 16 * i + 2 * g;
                        const float2 low = *reinterpret_cast<const float2*>(pair);
                        const float2 high = *reinterpret_cast<const float2*>(pair + 4 * kLdA);
                        a[i][0] = __float_as_uint(low.x);
                        a[i][1] = __float_as_uint(low.y);
                        a[i][2] = __float_as_uint(high.x);
                        a[i][3] = __float_as_uint(high.y);
#pragma unroll
                        for (int e = 0; e < 4; ++e) Op::prepare(a[i][e]);
                    }
#pragma unroll
                    for (int j = 0; j < NI; ++j) {
                        const float* column = b_tile + (8 * kk + q) * kLdB + warp_n + 8 * j + g;
                        b[j][0] = __float_as_uint(column[0]);
                        b[j][1] = __float_as_uint(column[4 * kLdB]);
                        Op::prepare(b[j][0]);
                        Op::prepare(b[j][1]);
                    }
                    mma::multiply<T>(acc, a, b);
                }
            }
        }
        mma::wait_copies<0>();
        __syncthreads();  // stages and lists are rewritten by the next list
    }

    // Accumulator (i, j, 2h + e): a = m0 + warp_m + 16 i + lane / 4 + 8 h (TF32, whose rows are permuted:
    // m0 + warp_m + 16 i + 2 (lane / 4) + h), b = n0 + warp_n + 8 j + 2 (lane % 4) + e.
    float* out = partial + (slot * volume + t) * int64_t{a_channels} * b_channels;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int a = m0 + warp_m + 16 * i + (E == 4 ? 2 * (lane / 4) + h : lane / 4 + 8 * h);
            if (a >= a_channels) continue;
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                const int b = n0 + warp_n + 8 * j + 2 * (lane % 4);
                if (b < b_channels)
                    *reinterpret_cast<float2*>(out + int64_t{a} * b_channels + b) = make_float2(acc[i][j][2 * h],
                                                                                                acc[i][j][2 * h + 1]);
            }
        }
#endif
}

/// The weight gradient on warpgroups (wgmma, compute capability 9.0, float16 and bfloat16): the blocks,
/// slots, lists and edge groups of weight_engine_kernel, BM / 64 warpgroups of 64 x BN each. A stage
/// holds kWarpgroupEdgeStep edges of both operands as rows along K: per 64 channels, one 128-byte row
/// per edge in the 128-byte swizzle (MN-major tiles), filled by cp.async. Each step runs one product of
/// 16 edges per 16-edge group that weight_engine_kernel runs there (it pads the edges to multiples of
/// 32): the same groups in the same order, so bitwise its results.
template <typename T, int BM, int BN, int kStages>
__global__ __launch_bounds__(BM / 64 * 128, BM == 128 ? 2 : 3) void weight_warpgroup_kernel(
    const int32_t* __restrict__ map, const int32_t* __restrict__ tap_major, int64_t rows, int32_t volume,
    const T* __restrict__ gathered, const T* __restrict__ per_row, float* __restrict__ partial, int32_t a_channels,
    int32_t b_channels, int64_t rows_per_slot, int32_t tiles_n) {
#ifndef SPARSEGRID_WARPGROUP_DEVICE
    __trap();  // never launched: warpgroup_engine_available() is false without sm_90a code
#else
    constexpr int kThreadCount = BM / 64 * 128;
    constexpr int kPiece = kWarpgroupEdgeStep * 128;  // 64 channels of a step's edges
    constexpr int kABytes = BM / 64 * kPiece;
    constexpr int kStageBytes = kABytes + BN / 64 * kPiece;
    constexpr int kVectorsA = BM / 8;  // 16-byte copies per edge
    constexpr int kVectorsB = BN / 8;
    constexpr int kProducts = kWarpgroupEdgeStep / 16;
    static_assert(sizeof(T) == 2, "16-bit elements");
    static_assert(
        (kWarpgroupEdgeStep * kVectorsA) % kThreadCount == 0 && (kWarpgroupEdgeStep * kVectorsB) % kThreadCount == 0,
        "even copies");

    extern __shared__ __align__(128) unsigned char shared[];
    __shared__ typename cub::BlockScan<int, kThreadCount>::TempStorage scan_storage;
    __shared__ int32_t list_gathered[kListRows];
    __shared__ uint16_t list_offset[kListRows];
    const uint32_t raw = mma::shared_address(shared);
    const uint32_t base = (raw + 1023u) & ~1023u;

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int wg = warp / 4;
    const BlockTileTap block = block_tile_and_tap<BM, BN>(volume, tiles_n);
    const int m0 = block.m0, n0 = block.n0;
    const int32_t t = block.t;
    const int64_t slot = blockIdx.y;
    const int64_t begin = slot * rows_per_slot;
    const int64_t end = begin + rows_per_slot < rows ? begin + rows_per_slot : rows;

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;

    // One pipeline over the steps of all the slot's lists: the loads run kStages - 1 steps ahead of the
    // products and cross into the next list as soon as the last step of this one is issued (its list
    // arrays are then no longer read), so a list's compaction and first copies overlap the previous
    // list's last products instead of waiting for them. products_of[stage]: the products of the step
    // loaded into `stage`, one per 16-edge group of its list (written before the barrier its products
    // follow).
    __shared__ int products_of[kStages];
    int64_t list0 = begin, next_list0 = begin;  // the list being loaded (its edges, groups, steps, next step)
    int edges = 0, groups = 0, steps = 0, next_step = 0;
    auto next_list = [&]() {  // compacts the next list with edges into the list arrays; false past the end
        while (next_list0 < end) {
            list0 = next_list0;
            next_list0 = list0 + kListRows < end ? list0 + kListRows : end;
            int32_t entries[kListRows / kThreadCount];
            load_list<kThreadCount>(map, tap_major, rows, volume, t, list0, next_list0, entries);
            __syncthreads();  // every thread's copies of the previous list have read its arrays
            edges = place_list<kThreadCount>(entries, scan_storage, list_gathered, list_offset);
            steps = (edges + kWarpgroupEdgeStep - 1) / kWarpgroupEdgeStep;
            groups = 2 * ((edges + 31) / 32);  // weight_engine_kernel's products of 16 edges
            next_step = 0;
            if (steps > 0) return true;
        }
        return false;
    };

    // Edge k of a stage, channels c0 + 8 v ... of row rows[edge] of `source`: 16-byte vector v % 8 of row
    // k of piece v / 8, at its swizzled place; zeros past the edges and the channels.
    auto copy_operand = [&](auto vectors, uint32_t at, const T* source, const auto* list, int c0, int channels,
                            int step) {
        constexpr int kVectors = decltype(vectors)::value;
#pragma unroll
        for (int c = 0; c < kWarpgroupEdgeStep * kVectors / kThreadCount; ++c) {
            const int idx = tid + c * kThreadCount;
            const int k = idx / kVectors;
            const int v = idx % kVectors;
            const int edge = step * kWarpgroupEdgeStep + k;
            const int channel = c0 + v * 8;
            const bool valid = edge < edges && channel < channels;
            const T* from = valid ? source + int64_t{list[edge]} * channels + channel : source;
            mma::copy16(at + static_cast<uint32_t>((v / 8) * kPiece + k * 128 + (((v % 8) ^ (k % 8)) * 16)), from,
                        valid);
        }
    };
    bool loading = next_list();
    int issued = 0;
    auto load_next = [&](int stage) {  // the next step's copies into `stage`, if any is left
        if (loading && next_step == steps) loading = next_list();
        if (!loading) return;
        const uint32_t at = base + static_cast<uint32_t>(stage * kStageBytes);
        copy_operand(std::integral_constant<int, kVectorsA>{}, at, gathered, list_gathered, m0, a_channels, next_step);
        copy_operand(std::integral_constant<int, kVectorsB>{}, at + kABytes, per_row + list0 * b_channels, list_offset,
                     n0, b_channels, next_step);
        if (tid == 0)
            products_of[stage] = groups - kProducts * next_step < kProducts ? groups - kProducts * next_step
                                                                            : kProducts;
        ++next_step;
        ++issued;
    };

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        load_next(s);
        mma::commit_copies();
    }
    for (int step = 0; step < issued; ++step) {
        // Every warpgroup's products of step - 1 are complete (waited for below) once past the barrier,
        // so that step's stage can be refilled.
        mma::wait_copies<kStages - 2>();
        warpgroup::fence_async_shared();
        __syncthreads();
        const int products = products_of[step % kStages];
        load_next((step + kStages - 1) % kStages);
        mma::commit_copies();
        const uint32_t stage = base + static_cast<uint32_t>((step % kStages) * kStageBytes);
        // A: this warpgroup's 64 gathered channels; B: BN row channels, pieces kPiece apart. Groups of 8
        // edges 1024 bytes apart; 16 edges (2048 bytes) per product.
        const uint64_t a = warpgroup::tile_descriptor(stage + static_cast<uint32_t>(wg * kPiece), kPiece, 1024);
        const uint64_t b = warpgroup::tile_descriptor(stage + kABytes, kPiece, 1024);
        warpgroup::fence();
        warpgroup::fence_accumulators(acc);
#pragma unroll
        for (int kk = 0; kk < kProducts; ++kk)
            if (kk < products)
                warpgroup::Product<T, BN, 1>::run(acc, a + static_cast<uint64_t>(128 * kk),
                                                  b + static_cast<uint64_t>(128 * kk));
        warpgroup::commit();
        warpgroup::fence_accumulators(acc);
        warpgroup::wait<0>();
    }
    mma::wait_copies<0>();  // no copy may still target shared memory when the block exits

    // Lane l of warp w of warpgroup g: a = m0 + 64 g + 16 (w % 4) + l / 4 + 8 h, b = n0 + 8 j + 2 (l % 4) + e.
    float* out = partial + (slot * volume + t) * int64_t{a_channels} * b_channels;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int a = m0 + 64 * wg + 16 * (warp % 4) + lane / 4 + 8 * h;
        if (a >= a_channels) continue;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int b = n0 + 8 * j + 2 * (lane % 4);
            if (b < b_channels)
                *reinterpret_cast<float2*>(out + int64_t{a} * b_channels + b) = make_float2(acc[4 * j + 2 * h],
                                                                                            acc[4 * j + 2 * h + 1]);
        }
    }
#endif
}

using WeightKernel = void (*)(const int32_t*, const int32_t*, int64_t, int32_t, const void*, const void*, float*,
                              int32_t, int32_t, int64_t, int64_t, bool, cudaStream_t);

/// Launches a weight-gradient kernel of `config` in T: one block per (BM x BN tile, slot, tap), after
/// raising the kernel's dynamic shared-memory limit on the device (`raised`: the kernel's own record).
template <typename T, typename Kernel>
void launch_weight_kernel(Kernel kernel, const WeightConfig& config, std::atomic<uint64_t>& raised, const int32_t* map,
                          const int32_t* tap_major, int64_t rows, int32_t volume, const void* gathered,
                          const void* per_row, float* partial, int32_t a_channels, int32_t b_channels, int64_t slots,
                          int64_t rows_per_slot, bool taps_fastest, cudaStream_t stream) {
    const size_t shared_bytes = config.shared_bytes(static_cast<int>(sizeof(T)));
    raise_shared_memory_limit(kernel, shared_bytes, raised);
    const int64_t tiles_m = (a_channels + config.bm - 1) / config.bm,
                  tiles_n = (b_channels + config.bn - 1) / config.bn;
    // Taps fastest, grid x is tile x tap and y the slot: a wave of resident blocks covers every tap of a
    // few slots, whose rows (each source and target row of a slot, read once per tap) stay in L2, where
    // with the taps slowest (x the tile, y the slot, z the tap) a wave streams every slot's rows of a few
    // taps. engine_weight_gradient picks the order and keeps grid x within 2^31 - 1 and z within 65535.
    // The order of the blocks is no part of the sums.
    const dim3 grid = taps_fastest
        ? dim3(static_cast<unsigned>(tiles_m * tiles_n * volume), static_cast<unsigned>(slots), 1u)
        : dim3(static_cast<unsigned>(tiles_m * tiles_n), static_cast<unsigned>(slots), static_cast<unsigned>(volume));
    kernel<<<grid, config.threads(), shared_bytes, stream>>>(
        map, tap_major, rows, volume, static_cast<const T*>(gathered), static_cast<const T*>(per_row), partial,
        a_channels, b_channels, rows_per_slot, static_cast<int32_t>(tiles_n));
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

template <typename T, int BM, int BN, int WM, int WN, int kStages>
void launch_weight_engine(const int32_t* map, const int32_t* tap_major, int64_t rows, int32_t volume,
                          const void* gathered, const void* per_row, float* partial, int32_t a_channels,
                          int32_t b_channels, int64_t slots, int64_t rows_per_slot, bool taps_fastest,
                          cudaStream_t stream) {
    static std::atomic<uint64_t> raised{0};
    launch_weight_kernel<T>(weight_engine_kernel<T, BM, BN, WM, WN, kStages>, WeightConfig{BM, BN, WM, WN, kStages},
                            raised, map, tap_major, rows, volume, gathered, per_row, partial, a_channels, b_channels,
                            slots, rows_per_slot, taps_fastest, stream);
}

/// A warpgroup configuration as a WeightKernel (16-bit types only: engine_weight_gradient takes no
/// warpgroup configuration for float).
template <typename T, int BM, int BN, int kStages>
void launch_weight_warpgroup(const int32_t* map, const int32_t* tap_major, int64_t rows, int32_t volume,
                             const void* gathered, const void* per_row, float* partial, int32_t a_channels,
                             int32_t b_channels, int64_t slots, int64_t rows_per_slot, bool taps_fastest,
                             cudaStream_t stream) {
    if constexpr (sizeof(T) == 2) {
        static std::atomic<uint64_t> raised{0};
        launch_weight_kernel<T>(weight_warpgroup_kernel<T, BM, BN, kStages>,
                                WeightConfig{BM, BN, 64, BN, kStages, true}, raised, map, tap_major, rows, volume,
                                gathered, per_row, partial, a_channels, b_channels, slots, rows_per_slot, taps_fastest,
                                stream);
    } else {
        (void)map, (void)tap_major, (void)rows, (void)volume, (void)gathered, (void)per_row, (void)partial;
        (void)a_channels, (void)b_channels, (void)slots, (void)rows_per_slot, (void)taps_fastest, (void)stream;
        throw_error("convolution engine: a warpgroup weight-gradient configuration was chosen for ",
                    engine_dtype_name<T>(), " (internal error)");
    }
}

template <typename T>
constexpr std::array<WeightKernel, kWeightConfigCount> weight_launchers() {
    return {
#define SPARSEGRID_WEIGHT_LAUNCHER(BM, BN, WM, WN, S) &launch_weight_engine<T, BM, BN, WM, WN, S>,
        SPARSEGRID_WEIGHT_ENGINE_CONFIGS(SPARSEGRID_WEIGHT_LAUNCHER)
#undef SPARSEGRID_WEIGHT_LAUNCHER
#define SPARSEGRID_WEIGHT_WARPGROUP_LAUNCHER(BM, BN, S) &launch_weight_warpgroup<T, BM, BN, S>,
            SPARSEGRID_WEIGHT_WARPGROUP_CONFIGS(SPARSEGRID_WEIGHT_WARPGROUP_LAUNCHER)
#undef SPARSEGRID_WEIGHT_WARPGROUP_LAUNCHER
    };
}

/// Slots of rows: about 1024 blocks of (slot, tap) over the taps, at least kListRows rows per slot, at
/// most 64 MiB of partial sums, at most 65535. Depends only on the problem's shape, so the edge groups
/// and their order do too.
int64_t weight_engine_slots(int64_t rows, int32_t volume, int64_t slot_bytes) {
    constexpr int64_t kTargetBlocks = 1024;
    constexpr int64_t kMaxBytes = int64_t{64} << 20;
    int64_t slots = std::max<int64_t>(1, kTargetBlocks / volume);
    slots = std::min(slots, (rows + kListRows - 1) / kListRows);
    slots = std::min(slots, kMaxBytes / std::max<int64_t>(1, slot_bytes));
    slots = std::min<int64_t>(slots, 65535);
    return std::max<int64_t>(slots, 1);
}

/// The block order of launch_weight_kernel: taps fastest when the two operands (the rows of `gathered`
/// and of `per_row`) together pass the device's L2 cache, so that a wave of blocks shares a few slots'
/// rows; otherwise, with the operands resident in L2 anyway, taps slowest, which measured faster there
/// (not profiled; H100, float16, batch-16 reference, k3s1 C = 64: 38.6 MB of operands, 0.116 ms against
/// 0.121 taps fastest; at 77 MB, C = 128, 0.244 against 0.286 taps slowest). Grids of more than 65535 taps take taps fastest. SPARSEGRID_WEIGHT_TAPS_FASTEST=1 or 0
/// forces either order (for tests and measurements; read at every call). No part of the sums.
bool weight_taps_fastest(const MapWeightGradient& args, int64_t a_channels, int64_t b_channels, size_t element_bytes,
                         const Context& ctx) {
    if (args.volume > 65535) return true;
    const std::string forced = env_string("SPARSEGRID_WEIGHT_TAPS_FASTEST");
    if (forced == "1") return true;
    if (forced == "0") return false;
    if (!forced.empty())
        throw_error(
            "SPARSEGRID_WEIGHT_TAPS_FASTEST must be 1 (taps fastest), 0 (taps slowest) or unset "
            "(automatic), not \"",
            forced, "\"");
    int l2_bytes = 0;
    SPARSEGRID_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, ctx.device.index));
    const int64_t gathered_rows = args.gathered_rows > 0 ? args.gathered_rows : args.rows;
    // In double: an estimate, free of overflow.
    const double operand_bytes = (static_cast<double>(gathered_rows) * static_cast<double>(a_channels) +
                                  static_cast<double>(args.rows) * static_cast<double>(b_channels)) *
        static_cast<double>(element_bytes);
    return operand_bytes > static_cast<double>(l2_bytes);
}

int weight_config_index(int bm, int bn, bool warpgroup = false) {
    for (int i = 0; i < kWeightConfigCount; ++i)
        if (kWeightConfigs[i].bm == bm && kWeightConfigs[i].bn == bn && kWeightConfigs[i].warpgroup == warpgroup)
            return i;
    return 0;
}

/// The automatic choice by the channel counts of both operands. Where the warpgroup kernels run (16-bit
/// types on compute capability 9.0) they lead from 64 channels on both sides (H200, float16, batch-16
/// reference, ms): k3s1 C = 64 0.142 against 0.151 (wg64x64/4 against w64x64/4), C = 128 0.340 against
/// 0.394 (wg128x128/3 against w128x128/3), k2s2 C = 128 0.189 against 0.205.
int automatic_weight_config(int64_t a_channels, int64_t b_channels, bool warpgroup) {
    if (warpgroup && a_channels >= 64 && b_channels >= 64)
        return a_channels <= 64 && b_channels <= 64 ? weight_config_index(64, 64, true)
                                                    : weight_config_index(128, 128, true);
    if (a_channels <= 32 && b_channels <= 32) return weight_config_index(32, 32);
    if (a_channels <= 64 && b_channels <= 64) return weight_config_index(64, 64);
    return weight_config_index(128, 128);
}

}  // namespace

std::vector<std::string> weight_engine_configurations() {
    std::vector<std::string> names;
    for (const WeightConfig& config : kWeightConfigs) names.push_back(config.name());
    return names;
}

template <typename T>
bool engine_weight_gradient(const MapWeightGradient& args, const Context& ctx) {
    int index = forced_engine_configuration();
    if (index == kEngineOff) return false;
    index = index >= forward_engine_configuration_count() ? index - forward_engine_configuration_count()
                                                          : kEngineAutomatic;
    const bool rows_are_source = args.rows_are_source;
    const void* gathered = rows_are_source ? args.grad : args.x;
    const void* per_row = rows_are_source ? args.x : args.grad;
    const int64_t a_channels = rows_are_source ? args.out_channels : args.in_channels;
    const int64_t b_channels = rows_are_source ? args.in_channels : args.out_channels;
    constexpr int kElementsPerVector = 16 / static_cast<int>(sizeof(T));
    if (a_channels % kElementsPerVector != 0 || b_channels % kElementsPerVector != 0) return false;
    if (a_channels > kMaxEngineChannels || b_channels > kMaxEngineChannels) return false;
    if (reinterpret_cast<uintptr_t>(gathered) % 16 != 0 || reinterpret_cast<uintptr_t>(per_row) % 16 != 0) return false;
    if (args.rows > INT32_MAX || (args.map == nullptr && args.volume != 1)) return false;
    // One block per (tile, tap) along grid x (launch_weight_kernel), at most 2^31 - 1 of them; the
    // smallest tiles (32 x 32) bound the count for every configuration.
    if ((a_channels + 31) / 32 * ((b_channels + 31) / 32) > INT32_MAX / std::max<int32_t>(args.volume, 1)) return false;
    const cudaStream_t stream = stream_of(ctx);
    const bool taps_fastest = weight_taps_fastest(args, a_channels, b_channels, sizeof(T), ctx);
    const int64_t slot_elements = int64_t{args.volume} * a_channels * b_channels;
    int64_t slots = 0;
    int64_t rows_per_slot = 0;
    Buffer<float> partial;
    if (args.rows > 0) {
        slots = weight_engine_slots(args.rows, args.volume, slot_elements * static_cast<int64_t>(sizeof(float)));
        rows_per_slot = (args.rows + slots - 1) / slots;
        slots = (args.rows + rows_per_slot - 1) / rows_per_slot;
        partial = Buffer<float>::allocate(slots * slot_elements, ctx);
    }
    // Warpgroup configurations: 16-bit types on a device that runs them; elsewhere a forced one gives way
    // to the automatic choice (the same results: every configuration sums in one order).
    const bool warpgroup_ok = sizeof(T) == 2 && warpgroup_engine_available(ctx);
    if (index >= 0 && kWeightConfigs[index].warpgroup && !warpgroup_ok) index = kEngineAutomatic;
    static constexpr std::array<WeightKernel, kWeightConfigCount> launchers = weight_launchers<T>();
    auto launch = [&](int config) {
        if (args.rows > 0)
            launchers[static_cast<size_t>(config)](args.map, args.tap_major, args.rows, args.volume, gathered, per_row,
                                                   partial.data(), static_cast<int32_t>(a_channels),
                                                   static_cast<int32_t>(b_channels), slots, rows_per_slot, taps_fastest,
                                                   stream);
        launch_reduce_weight_grad<T, float>(partial.data(), slots, args.volume, args.in_channels, args.out_channels,
                                            rows_are_source, args.grad_weight, args.grad_weight_dtype == DType::Float32,
                                            stream);
    };
    if (index == kEngineAutomatic && !engine_tuning_idle()) {
        const EngineShape shape{"weight",    engine_dtype_name<T>(), a_channels, b_channels,
                                args.volume, floor_log2(args.rows)};
        const TunedConfiguration tuned = tune_among(kWeightConfigs, warpgroup_ok, shape, launch, ctx);
        if (tuned.ran) return true;
        index = tuned.index;
    }
    if (index == kEngineAutomatic) index = automatic_weight_config(a_channels, b_channels, warpgroup_ok);
    launch(index);
    return true;
}

template bool engine_weight_gradient<float>(const MapWeightGradient&, const Context&);
template bool engine_weight_gradient<__half>(const MapWeightGradient&, const Context&);
template bool engine_weight_gradient<__nv_bfloat16>(const MapWeightGradient&, const Context&);

}  // namespace sparsegrid::detail::cuda
