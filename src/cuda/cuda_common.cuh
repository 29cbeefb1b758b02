// Shared helpers of the CUDA backend: error checks, launches, scratch memory through the context's
// allocator, two-phase CUB calls, and the single pinned readback that data-dependent sizes need.
#pragma once

#include <sparsegrid/buffer.h>
#include <sparsegrid/types.h>

#include "backend/backend.h"
#include "core/errors.h"
#include "core/keys.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace sparsegrid::detail::cuda {

#define SPARSEGRID_CUDA_CHECK(expr)                                                                \
    do {                                                                                           \
        const cudaError_t sg_status = (expr);                                                      \
        if (sg_status != cudaSuccess)                                                              \
            ::sparsegrid::detail::throw_error(#expr, " failed at ", __FILE__, ":", __LINE__, ": ", \
                                              cudaGetErrorString(sg_status));                      \
    } while (0)

/// Checks the last launch; with SPARSEGRID_CUDA_DEBUG set (and not "0") also waits for it, so an
/// asynchronous fault is reported at the launch that caused it (debug waits are not counted as syncs).
/// A stream being captured into a CUDA graph is not waited for: the wait would invalidate the capture.
#define SPARSEGRID_CUDA_CHECK_LAUNCH(stream)                                           \
    do {                                                                               \
        SPARSEGRID_CUDA_CHECK(cudaGetLastError());                                     \
        if (::sparsegrid::detail::cuda::debug_sync_enabled())                          \
            ::sparsegrid::detail::cuda::debug_wait(static_cast<cudaStream_t>(stream)); \
    } while (0)

/// SPARSEGRID_CUDA_DEBUG, read once (core/env.h's env_switch, off by default).
bool debug_sync_enabled();

/// The debug wait of SPARSEGRID_CUDA_CHECK_LAUNCH: synchronises the stream unless it is capturing.
void debug_wait(cudaStream_t stream);

inline cudaStream_t stream_of(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

constexpr int kThreads = 256;

/// Blocks for a grid-stride loop over n items (capped; the loop covers the rest).
inline unsigned blocks_for(int64_t n) {
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

#define SG_GRID_STRIDE_LOOP(index, n)                                                 \
    for (int64_t index = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; index < (n); \
         index += int64_t{blockDim.x} * gridDim.x)

/// Makes the context's device current for the lifetime of the guard.
class DeviceGuard {
public:
    explicit DeviceGuard(const Context& ctx);
    ~DeviceGuard();
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;

private:
    int m_previous = 0;
    int m_index = 0;
};

/// value / divisor (both non-negative, divisor > 0) in 32-bit arithmetic when both fit: a 64-bit
/// division is a long instruction sequence on the GPU, and many kernels divide every thread's index.
__device__ __forceinline__ int64_t divide(int64_t value, int64_t divisor) {
    if (value <= UINT32_MAX && divisor <= UINT32_MAX)
        return static_cast<uint32_t>(value) / static_cast<uint32_t>(divisor);
    return value / divisor;
}

/// Device index of the member owning item n: the last m with offsets[m] <= n (binary search).
__device__ __forceinline__ int64_t member_of(const int64_t* offsets, int64_t batch_size, int64_t n) {
    int64_t lo = 0, hi = batch_size;  // answer in [lo, hi)
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (offsets[mid] <= n)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/// First position in [lo, hi) whose key is >= value.
template <typename KeyT>
__device__ __forceinline__ int64_t lower_bound(const KeyT* keys, int64_t lo, int64_t hi, KeyT value) {
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < value)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/// Copies small device arrays to the host with one wait: enqueue reads, then wait once.
/// Staging goes through pinned memory so the copies are truly asynchronous until wait().
class Readback {
public:
    explicit Readback(const Context& ctx) : m_ctx(ctx) {}
    /// Schedules a copy of `count` elements; the returned slot is valid after wait().
    template <typename T>
    size_t enqueue(const T* device_data, int64_t count) {
        return enqueue_bytes(device_data, static_cast<size_t>(count) * sizeof(T));
    }
    void wait();
    template <typename T>
    std::vector<T> get(size_t slot, int64_t count) const {
        std::vector<T> out(static_cast<size_t>(count));
        copy_out(slot, out.data(), static_cast<size_t>(count) * sizeof(T));
        return out;
    }

private:
    size_t enqueue_bytes(const void* device_data, size_t bytes);
    void copy_out(size_t slot, void* dst, size_t bytes) const;

    Context m_ctx;
    std::vector<std::pair<const void*, size_t>> m_requests;
    std::vector<size_t> m_slots;
    size_t m_total = 0;
    const unsigned char* m_staging = nullptr;
};

/// Runs a two-phase CUB device call: f(temp, bytes) is called once with temp = null to size the
/// temporary storage, then again with that much scratch memory from the context's allocator (released
/// in stream order after the call is enqueued). f returns the cudaError_t of the CUB call; both
/// phases are checked.
template <typename F>
void cub_call(const Context& ctx, F&& f) {
    size_t bytes = 0;
    SPARSEGRID_CUDA_CHECK(f(nullptr, bytes));
    Buffer<uint8_t> temp = Buffer<uint8_t>::allocate(static_cast<int64_t>(bytes), ctx);
    SPARSEGRID_CUDA_CHECK(f(static_cast<void*>(temp.data()), bytes));
}

}  // namespace sparsegrid::detail::cuda
