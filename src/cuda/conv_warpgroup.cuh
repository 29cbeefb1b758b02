// Hopper warpgroup primitives of the convolution engine (conv_warpgroup.cu, conv_weight_engine.cu):
// shared-memory descriptors of tiles in the 128-byte swizzle, the fences and waits around wgmma, and
// wgmma with float32 accumulators: m64nNk16 for float16 and bfloat16, m64nNk8 for TF32. Device code
// only where the build targets sm_90a (SPARSEGRID_WARPGROUP_DEVICE); the callers launch their kernels
// only where warpgroup_engine_available() says so.
#pragma once

#include "cuda/conv_mma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SPARSEGRID_WARPGROUP_DEVICE 1
#endif

namespace sparsegrid::detail::cuda::warpgroup {

#ifdef SPARSEGRID_WARPGROUP_DEVICE

/// The descriptor of an operand tile in the 128-byte swizzle starting at shared `address` (1024-byte
/// aligned, or offset from such a start by a multiple of 32 bytes within its rows). The swizzle: 16-byte
/// vector v of a 128-byte row r lies at v ^ (r % 8). K-major (rows along M or N, 64 16-bit elements of K
/// per row): groups of 8 rows `stride_bytes` apart, `leading_bytes` unused (16). MN-major (rows along K,
/// 64 elements of M or N per row): groups of 8 rows of K `stride_bytes` apart, blocks of 64 elements of
/// M or N `leading_bytes` apart.
__device__ __forceinline__ uint64_t tile_descriptor(uint32_t address, uint32_t leading_bytes, uint32_t stride_bytes) {
    return static_cast<uint64_t>((address & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
        (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/// Waits until at most `kPending` committed groups of this warpgroup's products are still running.
template <int kPending>
__device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
/// Makes this thread's completed cp.async writes to shared memory visible to the tensor cores' reads.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Transaction barriers (mbarrier) and bulk copies: the weights' tiles arrive as one cp.async.bulk each,
// counted in bytes on a barrier of their stage.

/// Initializes the barrier at shared `address` for `count` arrivals per phase.
__device__ __forceinline__ void barrier_init(uint32_t address, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(address), "r"(count) : "memory");
}
/// Makes initialized barriers visible to the bulk copies that complete on them.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/// Arrives on the barrier at shared `address` and expects `bytes` more to land on it in this phase.
__device__ __forceinline__ void barrier_expect(uint32_t address, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(address), "r"(bytes) : "memory");
}
/// Waits until the phase of parity `parity` of the barrier at shared `address` has completed. Acquires at
/// the block's scope: the barriers count this block's own copies (an acquire at the cluster's scope
/// invalidates the L1 cache at every wait).
__device__ __forceinline__ void barrier_wait(uint32_t address, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nsg_wait:\n"
        "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra sg_wait;\n}\n" ::"r"(address),
        "r"(parity)
        : "memory");
}
/// `bytes` (a multiple of 16) from global `source` to shared `destination`, landing on `barrier`.
__device__ __forceinline__ void bulk_copy(uint32_t destination, const void* source, uint32_t bytes, uint32_t barrier) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(destination),
        "l"(source), "r"(bytes), "r"(barrier)
        : "memory");
}
/// Keeps the compiler from moving accesses of the accumulators across the asynchronous products.
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define SPARSEGRID_WG_D32                                                                                       \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define SPARSEGRID_WG_D64                                                                                         \
    SPARSEGRID_WG_D32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), \
        "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]),   \
        "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),   \
        "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),   \
        "+f"(d[63])
#define SPARSEGRID_WG_R32                                                                                       \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SPARSEGRID_WG_R64                                                                     \
    SPARSEGRID_WG_R32                                                                         \
    ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
    "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

/// d (64 x N per warpgroup, float32) += A (64 x 16, descriptor a) B (16 x N, descriptor b), both in
/// shared memory (64 x 8 and 8 x N for float in TF32); kTransposed: both operands MN-major (else
/// K-major; 16-bit types only). Lane l of warp w of the warpgroup
/// holds d[4 j + 2 h + e] = D[16 w + l / 4 + 8 h][8 j + 2 (l % 4) + e].
template <typename T, int N, int kTransposed>
struct Product;

// Operands: the accumulators, then a, b, the scale-d predicate and the transpose flag (%A, %B, %P, %X).
#define SPARSEGRID_WG_PRODUCT(TYPE, PTX, N, REGS, OPERANDS, A, B, P, X)                                             \
    template <int kTransposed>                                                                                      \
    struct Product<TYPE, N, kTransposed> {                                                                          \
        __device__ __forceinline__ static void run(float (&d)[N / 2], uint64_t a, uint64_t b) {                     \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P                                                    \
                         ", 0;\n"                                                                                   \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " {" REGS "}, %" #A ", %" #B \
                         ", p, 1, 1, %" #X ", %" #X ";\n}\n"                                                        \
                         : OPERANDS                                                                                 \
                         : "l"(a), "l"(b), "r"(1), "n"(kTransposed));                                               \
        }                                                                                                           \
    };
// TF32 (float operands, K-major only): m64nNk8, the same 32 bytes of K per product as k16 in 16 bits.
// The tensor cores read the upper 19 bits of each float: operands must already be rounded to TF32
// (conv_warpgroup.cu rounds them in shared memory or at packing, as cvt.rna).
#define SPARSEGRID_WG_PRODUCT_TF32(N, REGS, OPERANDS, A, B, P)                                               \
    template <>                                                                                              \
    struct Product<float, N, 0> {                                                                            \
        __device__ __forceinline__ static void run(float (&d)[N / 2], uint64_t a, uint64_t b) {              \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P                                             \
                         ", 0;\n"                                                                            \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 {" REGS "}, %" #A ", %" #B \
                         ", p, 1, 1;\n}\n"                                                                   \
                         : OPERANDS                                                                          \
                         : "l"(a), "l"(b), "r"(1));                                                          \
        }                                                                                                    \
    };
SPARSEGRID_WG_PRODUCT_TF32(64, SPARSEGRID_WG_R32, SPARSEGRID_WG_D32, 32, 33, 34)
SPARSEGRID_WG_PRODUCT_TF32(128, SPARSEGRID_WG_R64, SPARSEGRID_WG_D64, 64, 65, 66)
#undef SPARSEGRID_WG_PRODUCT_TF32
SPARSEGRID_WG_PRODUCT(__half, "f16", 64, SPARSEGRID_WG_R32, SPARSEGRID_WG_D32, 32, 33, 34, 35)
SPARSEGRID_WG_PRODUCT(__nv_bfloat16, "bf16", 64, SPARSEGRID_WG_R32, SPARSEGRID_WG_D32, 32, 33, 34, 35)
SPARSEGRID_WG_PRODUCT(__half, "f16", 128, SPARSEGRID_WG_R64, SPARSEGRID_WG_D64, 64, 65, 66, 67)
SPARSEGRID_WG_PRODUCT(__nv_bfloat16, "bf16", 128, SPARSEGRID_WG_R64, SPARSEGRID_WG_D64, 64, 65, 66, 67)
#undef SPARSEGRID_WG_PRODUCT
#undef SPARSEGRID_WG_D32
#undef SPARSEGRID_WG_D64
#undef SPARSEGRID_WG_R32
#undef SPARSEGRID_WG_R64

#endif  // SPARSEGRID_WARPGROUP_DEVICE

}  // namespace sparsegrid::detail::cuda::warpgroup
