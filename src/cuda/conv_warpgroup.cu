// Hopper warpgroup kernels of the convolution engine (compute capability 9.0, code built for sm_90a):
// the gathering forward pass and input gradient of conv_implicit_gemm.cu for float16 and bfloat16, with
// wgmma reading both operands from shared memory in place of ldmatrix + mma.sync.
//
// A block owns 128 output rows (in the map's row order) and BN output channels, in two warpgroups of 64
// rows each. Its prologue is that of implicit_gemm_kernel: the rows' sources at every tap into a shared
// table, and the list of taps any row has. Its k loop runs over (listed tap, chunk of 64 channels) steps;
// each step's gathered input rows and the tap's packed weights arrive by cp.async (absent sources
// zero-filled) into a stage of rows of 128 bytes in the 128-byte swizzle the tensor cores read (16-byte
// vector v of row r at v ^ (r % 8)), `stages` deep, and each warpgroup multiplies them by four
// m64nBNk16 wgmma, one group of them in flight while the next step is prepared. Every output element is
// summed in the order (tap, channel) by 16 channels per product, the order of the mma.sync kernels.
#include "backend/backend.h"
#include "core/errors.h"
#include "cuda/conv_mma.cuh"
#include "cuda/conv_tiles.cuh"
#include "cuda/cuda_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>

namespace sparsegrid::detail::cuda {

namespace {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SPARSEGRID_WARPGROUP_DEVICE 1
#endif

constexpr int kBlockRows = 128;  // BM: two warpgroups of 64 rows
constexpr int kRowBytes = 128;   // one k step: 64 channels of one tap, one swizzled row
constexpr int kBlockThreads = 256;
constexpr int kMaxTaps = 64;
constexpr int kTableStride = kBlockRows + 4;  // as implicit_gemm_kernel's table

#ifdef SPARSEGRID_WARPGROUP_DEVICE

/// The shared-memory descriptor of a K-major operand tile in the 128-byte swizzle starting at `address`
/// (1024-byte aligned, or offset from such a start by a multiple of 32 bytes within its rows): rows of
/// 128 bytes, groups of 8 rows 1024 bytes apart.
__device__ __forceinline__ uint64_t tile_descriptor(uint32_t address) {
    return static_cast<uint64_t>((address & 0x3FFFFu) >> 4) | (uint64_t{16 >> 4} << 16) | (uint64_t{1024 >> 4} << 32) |
        (uint64_t{1} << 62);
}

__device__ __forceinline__ void warpgroup_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void warpgroup_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void warpgroup_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
/// Makes this thread's completed cp.async writes to shared memory visible to the tensor cores' reads.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/// Keeps the compiler from moving accesses of the accumulators across the asynchronous products.
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// d (64 x N per warpgroup, float32) += A (64 x 16, shared, descriptor a) B (16 x N, shared, descriptor b).
/// Lane l of warp w of the warpgroup holds d[4 j + 2 h + e] = D[16 w + l / 4 + 8 h][8 j + 2 (l % 4) + e].
template <typename T, int N>
struct Warpgroup;

template <>
struct Warpgroup<__half, 64> {
    __device__ __forceinline__ static void run(float (&d)[32], uint64_t a, uint64_t b) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
            "{"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
            "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "l"(a), "l"(b), "r"(1));
    }
};

template <>
struct Warpgroup<__nv_bfloat16, 64> {
    __device__ __forceinline__ static void run(float (&d)[32], uint64_t a, uint64_t b) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
            "{"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
            "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "l"(a), "l"(b), "r"(1));
    }
};

template <>
struct Warpgroup<__half, 128> {
    __device__ __forceinline__ static void run(float (&d)[64], uint64_t a, uint64_t b) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
            "{"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
            "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(a), "l"(b), "r"(1));
    }
};

template <>
struct Warpgroup<__nv_bfloat16, 128> {
    __device__ __forceinline__ static void run(float (&d)[64], uint64_t a, uint64_t b) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
            "{"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
            "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(a), "l"(b), "r"(1));
    }
};

#endif  // SPARSEGRID_WARPGROUP_DEVICE

template <typename T, int BN, int kStages>
__global__ __launch_bounds__(kBlockThreads,
                             2) void warpgroup_gemm_kernel(const int32_t* __restrict__ map,
                                                           const int32_t* __restrict__ order, int64_t rows,
                                                           int32_t volume, const T* __restrict__ x,
                                                           const T* __restrict__ packed, T* __restrict__ out,
                                                           int32_t x_channels, int32_t y_channels) {
#ifndef SPARSEGRID_WARPGROUP_DEVICE
    __trap();  // never launched: warpgroup_engine_available() is false without sm_90a code
#else
    constexpr int kElementsPerVector = 16 / static_cast<int>(sizeof(T));
    constexpr int kChunk = kRowBytes / static_cast<int>(sizeof(T));  // channels per k step
    constexpr int kVectors = kRowBytes / 16;                         // 16-byte copies per tile row
    constexpr int kATileBytes = kBlockRows * kRowBytes;
    constexpr int kStageBytes = (kBlockRows + BN) * kRowBytes;
    constexpr int kGroups = kBlockThreads / kVectors;
    constexpr int kRowsA = kBlockRows / kGroups;  // 4
    constexpr int kRowsB = BN / kGroups;          // 4 or 2
    constexpr int kWarps = kBlockThreads / 32;
    constexpr int kAccumulators = BN / 2;
    // One group of products in flight while the next step's copies are issued needs a stage more.
    constexpr int kInFlight = kStages >= 4 ? 1 : 0;
    constexpr int kAhead = kStages - 1 - kInFlight;  // steps whose copies are issued ahead
    static_assert(kRowsA == 4 && (kRowsB == 2 || kRowsB == 4), "sources load as one int4 vector");
    static_assert(kStageBytes % 1024 == 0 && kAhead >= 1, "1024-byte aligned stages, a step ahead");

    extern __shared__ __align__(1024) unsigned char shared[];
    const uint32_t raw = mma::shared_address(shared);
    const uint32_t base = (raw + 1023u) & ~1023u;  // the swizzle repeats every 1024 bytes
    int32_t* table = reinterpret_cast<int32_t*>(shared + (base - raw) + kStages * kStageBytes);
    __shared__ int64_t row_of[kBlockRows];
    __shared__ int32_t active[kMaxTaps];
    __shared__ unsigned long long tap_mask;

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int64_t row0 = int64_t{blockIdx.x} * kBlockRows;
    const int n0 = static_cast<int>(blockIdx.y) * BN;

    // The block's rows, their sources at every tap, and the taps any of them has (as implicit_gemm_kernel).
    if (tid == 0) tap_mask = 0;
    for (int i = tid; i < kBlockRows; i += kBlockThreads) {
        const int64_t p = row0 + i;
        row_of[i] = p < rows ? (order ? int64_t{order[p]} : p) : -1;
    }
    __syncthreads();
    unsigned long long mine = 0;
    for (int m0 = warp; m0 < kBlockRows; m0 += 4 * kWarps) {
        int32_t s[4][2];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int64_t r = row_of[m0 + u * kWarps];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int t = lane + 32 * h;
                s[u][h] = -1;
                if (r >= 0 && t < volume) s[u][h] = map ? map[r * volume + t] : static_cast<int32_t>(r);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int t = lane + 32 * h;
                if (t < volume) table[t * kTableStride + m0 + u * kWarps] = s[u][h];
                mine |= static_cast<unsigned long long>(__ballot_sync(0xffffffffu, s[u][h] >= 0)) << (32 * h);
            }
    }
    if (lane == 0 && mine != 0) atomicOr(&tap_mask, mine);
    __syncthreads();
    const unsigned long long taps = tap_mask;
    if (tid < volume && ((taps >> tid) & 1ull)) active[__popcll(taps & ((1ull << tid) - 1ull))] = tid;
    __syncthreads();
    const int chunks = (x_channels + kChunk - 1) / kChunk;
    const int steps = __popcll(taps) * chunks;

    // This thread's copies: 16-byte vector v of rows group * kRowsA + c of A and group * kRowsB + c of B,
    // each at its swizzled place.
    const int group = tid / kVectors;
    const int v = tid % kVectors;
    uint32_t a_copy[kRowsA], b_copy[kRowsB];
    bool b_row_valid[kRowsB];
#pragma unroll
    for (int c = 0; c < kRowsA; ++c) {
        const int m = group * kRowsA + c;
        a_copy[c] = static_cast<uint32_t>(m * kRowBytes + ((v ^ (m % 8)) * 16));
    }
#pragma unroll
    for (int c = 0; c < kRowsB; ++c) {
        const int n = group * kRowsB + c;
        b_copy[c] = static_cast<uint32_t>(kATileBytes + n * kRowBytes + ((v ^ (n % 8)) * 16));
        b_row_valid[c] = n0 + n < y_channels;
    }

    int load_tap = 0, load_chunk = 0, loaded = 0;
    auto load_next = [&](int stage) {
        if (loaded >= steps) return;
        ++loaded;
        const int t = active[load_tap];
        const int k = load_chunk * kChunk + v * kElementsPerVector;
        if (++load_chunk == chunks) {
            load_chunk = 0;
            ++load_tap;
        }
        const bool k_valid = k < x_channels;
        const uint32_t at = base + static_cast<uint32_t>(stage * kStageBytes);
        const T* w = packed + (int64_t{t} * y_channels + n0 + group * kRowsB) * x_channels + k;
#pragma unroll
        for (int c = 0; c < kRowsB; ++c) {
            const bool valid = b_row_valid[c] && k_valid;
            mma::copy16(at + b_copy[c], valid ? w + c * x_channels : packed, valid);
        }
        const int4 q = *reinterpret_cast<const int4*>(table + t * kTableStride + group * kRowsA);
        const int32_t src[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int c = 0; c < kRowsA; ++c) {
            const bool valid = src[c] >= 0 && k_valid;
            mma::copy16(at + a_copy[c], x + (valid ? int64_t{src[c]} * x_channels + k : 0), valid);
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
    const int warpgroup = warp / 4;
    const uint32_t a_rows = static_cast<uint32_t>(warpgroup * 64 * kRowBytes);
    for (int step = 0; step < steps; ++step) {
        // This thread's copies of `step` have landed (kAhead - 1 later groups may still be in flight);
        // after the barrier every thread's have, and every warpgroup's products of step - 1 - kInFlight
        // are complete, so that step's stage can be refilled.
        mma::wait_copies<kAhead - 1>();
        fence_async_shared();
        __syncthreads();
        load_next((step + kAhead) % kStages);
        mma::commit_copies();
        const uint32_t stage = base + static_cast<uint32_t>((step % kStages) * kStageBytes);
        const uint64_t a = tile_descriptor(stage + a_rows);
        const uint64_t b = tile_descriptor(stage + kATileBytes);
        warpgroup_fence();
        fence_accumulators(acc);
#pragma unroll
        for (int kk = 0; kk < kRowBytes / 32; ++kk)  // 16 channels (32 bytes) per product
            Warpgroup<T, BN>::run(acc, a + static_cast<uint64_t>(2 * kk), b + static_cast<uint64_t>(2 * kk));
        warpgroup_commit();
        fence_accumulators(acc);
        warpgroup_wait<kInFlight>();
    }
    warpgroup_wait<0>();
    fence_accumulators(acc);
    mma::wait_copies<0>();  // no copy may still target shared memory when the block exits

    // Lane l of warp w of warpgroup g: rows 64 g + 16 w + l / 4 + 8 h, channels 8 j + 2 (l % 4) + e.
    const int m_lane = warpgroup * 64 + (warp % 4) * 16 + lane / 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int64_t r = row_of[m_lane + 8 * h];
        if (r < 0) continue;
        T* row_out = out + r * y_channels + n0;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int n = 8 * j + 2 * (lane % 4);
            if (n0 + n < y_channels) mma::store_pair(row_out + n, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
    }
#endif
}

}  // namespace

size_t warpgroup_engine_shared_bytes(int bn, int stages, int32_t volume) {
    return 1024 + static_cast<size_t>(stages) * static_cast<size_t>(kBlockRows + bn) * kRowBytes +
        static_cast<size_t>(volume) * kTableStride * sizeof(int32_t);
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

template <typename T, int BN, int kStages>
void launch_warpgroup_engine(const int32_t* map, const int32_t* order, int64_t rows, int32_t volume, const void* x,
                             const void* packed, void* out, int32_t x_channels, int32_t y_channels, size_t shared_bytes,
                             cudaStream_t stream) {
    auto* kernel = warpgroup_gemm_kernel<T, BN, kStages>;
    static std::atomic<uint64_t> raised{0};
    raise_shared_memory_limit(kernel, warpgroup_engine_shared_bytes(BN, kStages, kMaxTaps), raised);
    const dim3 grid(static_cast<unsigned>((rows + kBlockRows - 1) / kBlockRows),
                    static_cast<unsigned>((y_channels + BN - 1) / BN));
    kernel<<<grid, kBlockThreads, shared_bytes, stream>>>(map, order, rows, volume, static_cast<const T*>(x),
                                                          static_cast<const T*>(packed), static_cast<T*>(out),
                                                          x_channels, y_channels);
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
}

#define SPARSEGRID_WARPGROUP_INSTANCE(T, BN, S)                                                                    \
    template void launch_warpgroup_engine<T, BN, S>(const int32_t*, const int32_t*, int64_t, int32_t, const void*, \
                                                    const void*, void*, int32_t, int32_t, size_t, cudaStream_t);
#define SPARSEGRID_WARPGROUP_TYPES(BN, S)        \
    SPARSEGRID_WARPGROUP_INSTANCE(__half, BN, S) \
    SPARSEGRID_WARPGROUP_INSTANCE(__nv_bfloat16, BN, S)
SPARSEGRID_WARPGROUP_ENGINE_CONFIGS(SPARSEGRID_WARPGROUP_TYPES)
#undef SPARSEGRID_WARPGROUP_TYPES
#undef SPARSEGRID_WARPGROUP_INSTANCE

}  // namespace sparsegrid::detail::cuda
