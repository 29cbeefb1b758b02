// Hopper warpgroup kernels of the convolution engine (compute capability 9.0, code built for sm_90a):
// the gathering forward pass and input gradient of conv_implicit_gemm.cu for float16, bfloat16 and TF32,
// with wgmma reading both operands from shared memory in place of ldmatrix + mma.sync.
//
// A block owns BM output rows (in the map's row order; 128 or 256) and BN output channels, in BM / 64
// warpgroups of 64 rows each. Its prologue is that of implicit_gemm_kernel: the rows' sources at every tap into a shared
// table, and the list of taps any row has. Its k loop runs over (listed tap, chunk of 64 channels) steps;
// each step's gathered input rows arrive by cp.async (absent sources zero-filled), and the tap's weights,
// packed beforehand as tiles in the same layout, by one bulk copy counted on a transaction barrier of
// the stage, into a stage of rows of 128 bytes in the 128-byte swizzle the tensor cores read (16-byte
// vector v of row r at v ^ (r % 8)), `stages` deep, and each warpgroup multiplies them by four
// m64nBNk16 wgmma (k8 in TF32: 32 channels per step), one group of them in flight while the next step
// is prepared. Every output element is summed in the order (tap, channel) by 16 channels per product (8
// in TF32), the order of the mma.sync kernels. In TF32 the weights arrive rounded from their packing,
// and the input rows either were rounded once before the launch (a gathering pass that reads each row
// several times) or each thread rounds the rows it copied once they have landed, as the mma.sync kernels
// round both operands, so that the results stay bitwise theirs.
//
// Scatter mode (the fine side of a K = S plan, as in implicit_gemm_kernel): the block's rows are input
// rows, the A operand their own features at every tap (with at most `stages` channel chunks copied once,
// chunk c into the A area of stage c, and kept), and after each tap's last chunk the products are waited
// for, written to each row's one output row at that tap, and cleared: the same sums in the same order.
#include "backend/backend.h"
#include "core/errors.h"
#include "cuda/conv_mma.cuh"
#include "cuda/conv_tiles.cuh"
#include "cuda/conv_warpgroup.cuh"
#include "cuda/cuda_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

namespace sparsegrid::detail::cuda {

namespace {

constexpr int kRowBytes = 128;  // one k step: 64 channels of one tap, one swizzled row
constexpr int kMaxTaps = 64;
/// A warpgroup (128 threads) per 64 rows of the block.
constexpr int block_threads(int bm) { return 2 * bm; }
/// The source table's rows: as implicit_gemm_kernel's, bm + 4 entries.
constexpr int table_stride(int bm) { return bm + 4; }

#ifdef SPARSEGRID_WARPGROUP_DEVICE
/// The four floats of the 16 bytes at shared `address` rounded to TF32 (cvt.rna, as mma::Mma<float>).
__device__ __forceinline__ void round_to_tf32(uint32_t address) {
    float f[4];
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3])
                 : "r"(address)
                 : "memory");
    uint32_t r[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r[e]) : "f"(f[e]));
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

/// Transposes a 4 x 4 matrix of words over the four lanes of a quad (lanes 4 k .. 4 k + 3): lane q's
/// word i becomes lane i's word q. Two exchanges of two words each, every lane taking part.
__device__ __forceinline__ void quad_transpose(uint32_t (&a)[4], int q) {
    const bool high = (q & 2) != 0;  // swap the 2 x 2 blocks off the diagonal with lane q ^ 2
    uint32_t r = __shfl_xor_sync(0xffffffffu, high ? a[0] : a[2], 2);
    (high ? a[0] : a[2]) = r;
    r = __shfl_xor_sync(0xffffffffu, high ? a[1] : a[3], 2);
    (high ? a[1] : a[3]) = r;
    const bool odd = (q & 1) != 0;  // then the words off the diagonal of each block with lane q ^ 1
    r = __shfl_xor_sync(0xffffffffu, odd ? a[0] : a[1], 1);
    (odd ? a[0] : a[1]) = r;
    r = __shfl_xor_sync(0xffffffffu, odd ? a[2] : a[3], 1);
    (odd ? a[2] : a[3]) = r;
}
#endif

template <typename T, int kBlockRows, int BN, int kStages, bool kScatter>
__global__ __launch_bounds__(block_threads(kBlockRows), kBlockRows == 128 ? 2 : 1) void warpgroup_gemm_kernel(
    const int32_t* __restrict__ map, const int32_t* __restrict__ order, int64_t rows, int32_t volume,
    const T* __restrict__ x, const T* __restrict__ tiles, T* __restrict__ out, int32_t x_channels, int32_t y_channels,
    bool x_rounded) {
#ifndef SPARSEGRID_WARPGROUP_DEVICE
    __trap();  // never launched: warpgroup_engine_available() is false without sm_90a code
#else
    constexpr int kBlockThreads = block_threads(kBlockRows);
    constexpr int kTableStride = table_stride(kBlockRows);
    constexpr int kElementsPerVector = 16 / static_cast<int>(sizeof(T));
    constexpr int kChunk = kRowBytes / static_cast<int>(sizeof(T));  // channels per k step
    constexpr int kVectors = kRowBytes / 16;                         // 16-byte copies per tile row
    constexpr int kATileBytes = kBlockRows * kRowBytes;
    constexpr int kBTileBytes = BN * kRowBytes;
    constexpr int kStageBytes = kATileBytes + kBTileBytes;
    constexpr int kGroups = kBlockThreads / kVectors;
    constexpr int kRowsA = kBlockRows / kGroups;  // 4
    constexpr int kAccumulators = BN / 2;
    // One group of products in flight while the next step's copies are issued needs a stage more.
    constexpr int kInFlight = kStages >= 4 ? 1 : 0;
    constexpr int kAhead = kStages - 1 - kInFlight;  // steps whose copies are issued ahead
    static_assert(kRowsA == 4, "sources load as one int4 vector");
    static_assert(kStageBytes % 1024 == 0 && kAhead >= 1, "1024-byte aligned stages, a step ahead");

    extern __shared__ __align__(1024) unsigned char shared[];
    const uint32_t raw = mma::shared_address(shared);
    const uint32_t base = (raw + 1023u) & ~1023u;  // the swizzle repeats every 1024 bytes
    int32_t* table = reinterpret_cast<int32_t*>(shared + (base - raw) + kStages * kStageBytes);
    __shared__ int64_t row_of[kBlockRows];
    __shared__ int32_t active[kMaxTaps];
    __shared__ unsigned long long tap_mask;
    // b_landed[s]: stage s's weight tile has landed (one arrival and the tile's bytes per phase).
    __shared__ __align__(8) uint64_t b_landed[kStages];

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int64_t row0 = int64_t{blockIdx.x} * kBlockRows;
    const int n0 = static_cast<int>(blockIdx.y) * BN;
    const uint32_t landed = mma::shared_address(b_landed);
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < kStages; ++s) warpgroup::barrier_init(landed + 8 * s, 1);
        warpgroup::fence_barrier_init();
    }

    // The block's rows, their sources at every tap, and the taps any of them has (barriers included).
    const int chunks = (x_channels + kChunk - 1) / kChunk;
    const int steps = block_tap_table<kBlockRows, kBlockThreads, kTableStride>(map, order, rows, volume, row0, row_of,
                                                                               table, active, tap_mask) *
        chunks;

    // This thread's copies: 16-byte vector v of rows group * kRowsA + c of A, each at its swizzled place.
    const int group = tid / kVectors;
    const int v = tid % kVectors;
    int64_t own_rows[kScatter ? kRowsA : 1];  // scatter: the A rows are the block's own rows
    if constexpr (kScatter) {
#pragma unroll
        for (int c = 0; c < kRowsA; ++c) own_rows[c] = row_of[group * kRowsA + c];
    }
    uint32_t a_copy[kRowsA];
#pragma unroll
    for (int c = 0; c < kRowsA; ++c) {
        const int m = group * kRowsA + c;
        a_copy[c] = static_cast<uint32_t>(m * kRowBytes + ((v ^ (m % 8)) * 16));
    }
    // The weights of step (tap t, chunk c) for this block's output channels: BN rows of 128 bytes, packed
    // in the swizzle (pack_engine_tiles_kernel), one contiguous tile.
    const unsigned char* tile_source = reinterpret_cast<const unsigned char*>(tiles) + int64_t{n0} * kRowBytes;
    const int64_t tile_stride = warpgroup_tile_rows(y_channels) * kRowBytes;

    // Scatter mode with at most kStages chunks: chunk c of the block's own rows is copied once, by the
    // c-th load (the first tap's), into the A area of stage c, and read from there at every tap. Rows
    // without an edge at a tap then multiply their features instead of zeros, but those products are
    // never written (their target is -1).
    const bool resident_a = kScatter && chunks <= kStages;
    int load_tap = 0, load_chunk = 0, loaded = 0;
    // The tap of the next load and this thread's four sources at it, read from shared memory one load
    // ahead (when the load before it starts a new tap), so that a step's copies wait on no shared read.
    int next_t = 0;
    int4 next_q = make_int4(-1, -1, -1, -1);
    auto read_next = [&] {
        next_t = active[load_tap];
        next_q = *reinterpret_cast<const int4*>(table + next_t * kTableStride + group * kRowsA);
    };
    if (steps > 0) read_next();
    auto load_next = [&](int stage) {
        if (loaded >= steps) return;
        const bool copy_a = !resident_a || load_tap == 0;
        ++loaded;
        const int t = next_t;
        const int4 q = next_q;
        const int chunk = load_chunk;
        const int k = load_chunk * kChunk + v * kElementsPerVector;
        if (++load_chunk == chunks) {
            load_chunk = 0;
            ++load_tap;
            if (loaded < steps) read_next();
        }
        const uint32_t at = base + static_cast<uint32_t>(stage * kStageBytes);
        if (tid == 0) {
            const unsigned char* source = tile_source + (int64_t{t} * chunks + chunk) * tile_stride;
            const uint32_t barrier = landed + 8 * static_cast<uint32_t>(stage);
            warpgroup::barrier_expect(barrier, kBTileBytes);
            warpgroup::bulk_copy(at + kATileBytes, source, kBTileBytes, barrier);
        }
        if (!copy_a) return;
        const bool k_valid = k < x_channels;
        const int32_t src[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int c = 0; c < kRowsA; ++c) {
            int64_t row;
            const bool valid = a_row_source<kScatter>(src[c], kScatter ? own_rows[c] : int64_t{-1}, resident_a, k_valid,
                                                      row);
            mma::copy16(at + a_copy[c], x + (valid ? row * x_channels + k : 0), valid);
        }
    };

    float acc[kAccumulators];
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;

#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
        load_next(s);
        mma::commit_copies();
    }
    // TF32: the rows of A this thread copied for step s, rounded in place once landed, as the mma.sync
    // kernels round them (the tensor cores would drop the low bits); the packed weights were rounded when
    // packed. A resident A area is rounded once, when its chunk arrives (the first tap's steps). Each
    // step's rows are rounded while the previous step's products run (below), so that the rounding is
    // not on the path from the copies' arrival to the products. With `x_rounded` x was rounded once
    // before the launch (round_to_tf32_kernel), and nothing is rounded here.
    const bool round_a = std::is_same_v<T, float> && !x_rounded;
    auto round_own_rows = [&](int s) {
        if constexpr (std::is_same_v<T, float>) {
            if (s >= steps || (resident_a && s >= chunks)) return;
            const uint32_t at = base + static_cast<uint32_t>((s % kStages) * kStageBytes);
#pragma unroll
            for (int c = 0; c < kRowsA; ++c) round_to_tf32(at + a_copy[c]);
        }
    };
    if (round_a) {
        mma::wait_copies<kAhead - 1>();  // step 0's copies (kAhead groups issued)
        round_own_rows(0);
    }
    const int wg = warp / 4;  // this warp's warpgroup
    const uint32_t a_rows = static_cast<uint32_t>(wg * 64 * kRowBytes);
    // Lane l of warp w of warpgroup g: rows 64 g + 16 w + l / 4 + 8 h, channels 8 j + 2 (l % 4) + e.
    const int m_lane = wg * 64 + (warp % 4) * 16 + lane / 4;
    // Writes the accumulators to the output rows row_at(m) of the block's rows m (none where negative).
    // In 16 bits, where the output rows are whole aligned 16-byte vectors, the four lanes of a quad (one
    // row, 8 channels each per group of 8) trade their pairs (quad_transpose) so that each lane stores the
    // 8 channels of one group as one vector: an instruction writes 64 contiguous bytes of each of 8 rows,
    // in place of 16 bytes of each with a pair per lane.
    const bool vector_rows = sizeof(T) == 2 && y_channels % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
    auto write_rows = [&](auto row_at) {
        if constexpr (sizeof(T) == 2) {
            if (vector_rows) {
                const int q = lane % 4;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int64_t r = row_at(m_lane + 8 * h);
#pragma unroll
                    for (int g = 0; g < BN / 32; ++g) {
                        // Word i of lane q: channels 8 (4 g + i) + 2 q, + 1; after the transpose, channels
                        // 8 (4 g + q) + 2 i, + 1.
                        uint32_t words[4];
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                            words[i] = mma::packed_pair<T>(acc[4 * (4 * g + i) + 2 * h],
                                                           acc[4 * (4 * g + i) + 2 * h + 1]);
                        quad_transpose(words, q);
                        const int n = n0 + 32 * g + 8 * q;
                        if (r >= 0 && n < y_channels)
                            *reinterpret_cast<uint4*>(out + r * y_channels + n) = make_uint4(words[0], words[1],
                                                                                             words[2], words[3]);
                    }
                }
                return;
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t r = row_at(m_lane + 8 * h);
            if (r < 0) continue;
            T* row_out = out + r * y_channels + n0;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                const int n = 8 * j + 2 * (lane % 4);
                if (n0 + n < y_channels) mma::store_pair(row_out + n, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
            }
        }
    };
    int tap_index = 0, chunk = 0;  // scatter: of the step being multiplied
    for (int step = 0; step < steps; ++step) {
        // This thread's copies of `step` have landed (kAhead - 1 later groups may still be in flight);
        // after the barrier every thread's have, and every warpgroup's products of step - 1 - kInFlight
        // are complete, so that step's stage can be refilled.
        // (TF32: they were rounded by this thread in the previous iteration or the prologue, or before the
        // launch.)
        mma::wait_copies<kAhead - 1>();
        warpgroup::fence_async_shared();
        __syncthreads();
        load_next((step + kAhead) % kStages);
        mma::commit_copies();
        const uint32_t stage = base + static_cast<uint32_t>((step % kStages) * kStageBytes);
        // Resident: the A area of the stage that took this chunk's first load.
        const uint32_t a_tile = resident_a ? base + static_cast<uint32_t>(chunk * kStageBytes) : stage;
        const uint64_t a = warpgroup::tile_descriptor(a_tile + a_rows, 16, 1024);
        const uint64_t b = warpgroup::tile_descriptor(stage + kATileBytes, 16, 1024);
        warpgroup::barrier_wait(landed + 8 * static_cast<uint32_t>(step % kStages),
                                static_cast<uint32_t>(step / kStages) & 1u);
        warpgroup::fence();
        warpgroup::fence_accumulators(acc);
#pragma unroll
        for (int kk = 0; kk < kRowBytes / 32; ++kk)  // 16 channels (32 bytes) per product
            warpgroup::Product<T, BN, 0>::run(acc, a + static_cast<uint64_t>(2 * kk),
                                              b + static_cast<uint64_t>(2 * kk));
        warpgroup::commit();
        warpgroup::fence_accumulators(acc);
        if (round_a) {
            // The next step's copies (kAhead groups outstanding, that step's the oldest) while these
            // products run. Its stage is neither this step's nor one an unfinished product reads
            // (kStages >= 3, at most kInFlight + 1 = 2 groups of products outstanding), nor the one
            // load_next just filled (step + kAhead).
            mma::wait_copies<kAhead - 1>();
            round_own_rows(step + 1);
        }
        if constexpr (kScatter) {
            if (++chunk == chunks) {
                chunk = 0;
                // The tap's products are complete: each goes to its row's one output row at this tap.
                warpgroup::wait<0>();
                warpgroup::fence_accumulators(acc);
                const int32_t* targets = table + active[tap_index++] * kTableStride;
                write_rows([&](int m) { return int64_t{targets[m]}; });
#pragma unroll
                for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
                continue;
            }
        }
        warpgroup::wait<kInFlight>();
    }
    warpgroup::wait<0>();
    warpgroup::fence_accumulators(acc);
    mma::wait_copies<0>();  // no copy may still target shared memory when the block exits
    if constexpr (!kScatter) write_rows([&](int m) { return row_of[m]; });
#endif
}

}  // namespace

size_t warpgroup_engine_shared_bytes(int bm, int bn, int stages, int32_t volume) {
    return 1024 + static_cast<size_t>(stages) * static_cast<size_t>(bm + bn) * kRowBytes +
        static_cast<size_t>(volume) * static_cast<size_t>(table_stride(bm)) * sizeof(int32_t);
}

bool warpgroup_engine_available(const Context& ctx) {
#ifdef SPARSEGRID_SM90A
    int major = 0, minor = 0;
    SPARSEGRID_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx.device.index));
    SPARSEGRID_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ctx.device.index));
    return major == 9 && minor == 0;
#else
    (void)ctx;
    return false;
#endif
}

template <typename T, int BM, int BN, int kStages>
void launch_warpgroup_engine(const int32_t* map, const int32_t* order, int64_t rows, int32_t volume, const void* x,
                             const void* tiles, void* out, int32_t x_channels, int32_t y_channels, bool scatter,
                             bool x_rounded, size_t shared_bytes, cudaStream_t stream) {
    auto* kernel = scatter ? warpgroup_gemm_kernel<T, BM, BN, kStages, true>
                           : warpgroup_gemm_kernel<T, BM, BN, kStages, false>;
    static std::atomic<uint64_t> raised[2] = {0, 0};  // one per instantiation
    raise_shared_memory_limit(kernel, warpgroup_engine_shared_bytes(BM, BN, kStages, kMaxTaps),
                              raised[scatter ? 1 : 0]);
    const dim3 grid(static_cast<unsigned>((rows + BM - 1) / BM), static_cast<unsigned>((y_channels + BN - 1) / BN));
    kernel<<<grid, block_threads(BM), shared_bytes, stream>>>(map, order, rows, volume, static_cast<const T*>(x),
                                                              static_cast<const T*>(tiles), static_cast<T*>(out),
                                                              x_channels, y_channels, x_rounded);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

#define SPARSEGRID_WARPGROUP_INSTANCE(T, BM, BN, S)                                                                    \
    template void launch_warpgroup_engine<T, BM, BN, S>(const int32_t*, const int32_t*, int64_t, int32_t, const void*, \
                                                        const void*, void*, int32_t, int32_t, bool, bool, size_t,      \
                                                        cudaStream_t);
#define SPARSEGRID_WARPGROUP_TYPES(BM, BN, S)               \
    SPARSEGRID_WARPGROUP_INSTANCE(__half, BM, BN, S)        \
    SPARSEGRID_WARPGROUP_INSTANCE(__nv_bfloat16, BM, BN, S) \
    SPARSEGRID_WARPGROUP_INSTANCE(float, BM, BN, S)
SPARSEGRID_WARPGROUP_ENGINE_CONFIGS(SPARSEGRID_WARPGROUP_TYPES)
#undef SPARSEGRID_WARPGROUP_TYPES
#undef SPARSEGRID_WARPGROUP_INSTANCE

}  // namespace sparsegrid::detail::cuda
