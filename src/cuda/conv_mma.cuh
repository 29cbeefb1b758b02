// Warp-level tensor-core primitives of the implicit-GEMM convolution engine (conv_implicit_gemm.cu):
// asynchronous 16-byte copies from global into shared memory (cp.async, zero-filled where the source is
// absent), ldmatrix, and mma.sync of 16 x 8 x 16 (float16, bfloat16) and 16 x 8 x 8 (TF32) with float32
// accumulators. Compute capability 8.0 and later; the callers never launch below that.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace sparsegrid::detail::cuda::mma {

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

/// 16 bytes from global `source` to shared `destination`, or 16 zero bytes (nothing read) when !valid.
__device__ __forceinline__ void copy16(uint32_t destination, const void* source, bool valid) {
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination), "l"(source), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/// Waits until at most `kPending` committed groups of this thread's copies are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// Four 8 x 8 matrices of 16-bit elements (8 rows of 16 bytes each) from shared memory: lane l gives
/// the address of row l % 8 of matrix l / 8 and receives, in r[i], its fragment of matrix i.
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], uint32_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

/// The tensor-core product of an element type: K, the depth of one mma (32 bytes of a row in every
/// type), and d += a b for a 16 x K row-major fragment a and a K x 8 column-major fragment b.
template <typename T>
struct Mma;

template <>
struct Mma<__half> {
    static constexpr int K = 16;
    __device__ __forceinline__ static void prepare(uint32_t&) {}
    __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <>
struct Mma<__nv_bfloat16> {
    static constexpr int K = 16;
    __device__ __forceinline__ static void prepare(uint32_t&) {}
    __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/// float in TF32: operands rounded to nearest (ties away, as cvt.rna) to 10 mantissa bits as they leave
/// shared memory, the same rounding the earlier wmma kernels applied.
template <>
struct Mma<float> {
    static constexpr int K = 8;
    __device__ __forceinline__ static void prepare(uint32_t& bits) {
        uint32_t rounded;
        asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(rounded) : "f"(__uint_as_float(bits)));
        bits = rounded;
    }
    __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/// A warp's accumulator tiles (MI x NI tiles of 16 x 8, 4 per lane) set to zero.
template <int MI, int NI>
__device__ __forceinline__ void clear(float (&acc)[MI][NI][4]) {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
}

/// acc[i][j] += a[i] b[j] for every tile of a warp, i outer, j inner.
template <typename T, int MI, int NI>
__device__ __forceinline__ void multiply(float (&acc)[MI][NI][4], const uint32_t (&a)[MI][4],
                                         const uint32_t (&b)[NI][2]) {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) Mma<T>::run(acc[i][j], a[i], b[j][0], b[j][1]);
}

/// The four matrices of one x4 load of B, r, as the fragments of B tiles 2j and 2j + 1.
template <int NI>
__device__ __forceinline__ void split_pair(uint32_t (&b)[NI][2], int j, const uint32_t (&r)[4]) {
    b[2 * j][0] = r[0];
    b[2 * j][1] = r[1];
    b[2 * j + 1][0] = r[2];
    b[2 * j + 1][1] = r[3];
}

/// Two adjacent output elements (an accumulator pair of one row) rounded to T and stored at once;
/// `out` is aligned to two elements.
__device__ __forceinline__ void store_pair(__half* out, float a, float b) {
    *reinterpret_cast<__half2*>(out) = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* out, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store_pair(float* out, float a, float b) {
    *reinterpret_cast<float2*>(out) = make_float2(a, b);
}

/// The pair (a, b) rounded to two 16-bit T, as one 32-bit word.
template <typename T>
__device__ __forceinline__ uint32_t packed_pair(float a, float b) {
    static_assert(sizeof(T) == 2, "a pair of 16-bit elements");
    alignas(4) T pair[2];
    store_pair(pair, a, b);
    return *reinterpret_cast<const uint32_t*>(pair);
}

/// The pair (a, b) as two T, at shared-memory `address`.
template <typename T>
__device__ __forceinline__ void store_shared_pair(uint32_t address, float a, float b) {
    if constexpr (sizeof(T) == 4) {
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(address), "f"(a), "f"(b) : "memory");
    } else {
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(packed_pair<T>(a, b)) : "memory");
    }
}

/// 16 bytes at shared-memory `address`.
__device__ __forceinline__ int4 load_shared16(uint32_t address) {
    int4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(address)
                 : "memory");
    return v;
}

#endif

}  // namespace sparsegrid::detail::cuda::mma
