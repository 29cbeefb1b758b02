// The CUDA backend's runtime entry points (the default stream-ordered allocator, copies, fills,
// synchronisation, timing events) and the backend's own glue: the debug switch, the device guard and
// the pinned readback. No torch here.
#include <sparsegrid/buffer.h>
#include <sparsegrid/types.h>

#include "backend/backend.h"
#include "core/env.h"
#include "cuda/cuda_common.cuh"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace sparsegrid::detail {

namespace cuda {

bool debug_sync_enabled() {
    static const bool enabled = env_switch("SPARSEGRID_CUDA_DEBUG", false);
    return enabled;
}

void debug_wait(cudaStream_t stream) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    SPARSEGRID_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusNone) SPARSEGRID_CUDA_CHECK(cudaStreamSynchronize(stream));
}

DeviceGuard::DeviceGuard(const Context& ctx) : m_index(ctx.device.index) {
    SPARSEGRID_CUDA_CHECK(cudaGetDevice(&m_previous));
    if (m_previous != m_index) SPARSEGRID_CUDA_CHECK(cudaSetDevice(m_index));
}

DeviceGuard::~DeviceGuard() {
    if (m_previous != m_index) cudaSetDevice(m_previous);
}

namespace {

/// One pinned staging area per host thread, grown on demand and reused: pinned allocation is slow,
/// and pageable device-to-host copies would wait on their own.
struct PinnedStaging {
    unsigned char* data = nullptr;
    size_t capacity = 0;
    ~PinnedStaging() {
        if (data) cudaFreeHost(data);
    }
    unsigned char* reserve(size_t bytes) {
        if (bytes > capacity) {
            if (data) SPARSEGRID_CUDA_CHECK(cudaFreeHost(data));
            data = nullptr;
            capacity = 0;
            const size_t rounded = std::max<size_t>(bytes, 4096) * 2;
            SPARSEGRID_CUDA_CHECK(cudaMallocHost(&data, rounded));
            capacity = rounded;
        }
        return data;
    }
};

thread_local PinnedStaging t_staging;

}  // namespace

size_t Readback::enqueue_bytes(const void* device_data, size_t bytes) {
    const size_t slot = m_total;
    m_requests.emplace_back(device_data, bytes);
    m_slots.push_back(slot);
    m_total += (bytes + 15) / 16 * 16;
    return slot;
}

void Readback::wait() {
    DeviceGuard guard(m_ctx);
    unsigned char* staging = t_staging.reserve(m_total);
    const cudaStream_t stream = stream_of(m_ctx);
    for (size_t r = 0; r < m_requests.size(); ++r)
        if (m_requests[r].second > 0)
            SPARSEGRID_CUDA_CHECK(cudaMemcpyAsync(staging + m_slots[r], m_requests[r].first, m_requests[r].second,
                                                  cudaMemcpyDeviceToHost, stream));
    count_host_synchronization();
    SPARSEGRID_CUDA_CHECK(cudaStreamSynchronize(stream));
    m_staging = staging;
}

void Readback::copy_out(size_t slot, void* dst, size_t bytes) const {
    if (bytes > 0) std::memcpy(dst, m_staging + slot, bytes);
}

namespace {

/// Stream-ordered allocation from the device's default memory pool.
class StreamOrderedAllocator final : public Allocator {
public:
    /// Freed memory stays in the device's default pool instead of going back to the driver at every
    /// synchronisation, so the per-step allocations of a training loop are recycled, not re-mapped.
    static void keep_pool_memory(int device) {
        static std::once_flag flags[64];
        std::call_once(flags[device % 64], [device] {
            cudaMemPool_t pool = nullptr;
            if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
                uint64_t threshold = UINT64_MAX;
                cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
            }
            cudaGetLastError();
        });
    }

    void* allocate(std::size_t bytes, Device device, void* stream) override {
        if (bytes == 0) return nullptr;
        DeviceGuard guard(Context{device, stream, nullptr});
        keep_pool_memory(device.index);
        void* ptr = nullptr;
        SPARSEGRID_CUDA_CHECK(cudaMallocAsync(&ptr, bytes, static_cast<cudaStream_t>(stream)));
        return ptr;
    }
    void deallocate(void* ptr, std::size_t, Device device, void* stream) noexcept override {
        if (!ptr) return;
        int previous = 0;
        cudaGetDevice(&previous);
        if (previous != device.index) cudaSetDevice(device.index);
        cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream));
        if (previous != device.index) cudaSetDevice(previous);
    }
};

}  // namespace

}  // namespace cuda

// ---- backend entry points -------------------------------------------------------------------------

using namespace cuda;

Allocator& CudaBackend::default_allocator() {
    static StreamOrderedAllocator allocator;
    return allocator;
}

int CudaBackend::device_count() {
    int count = 0;
    // No driver or no device is not an error here: the answer is simply zero.
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

// Every copy that touches a CUDA device (host <-> device, device <-> device): the front end hands host
// to host to the CPU backend. A copy into host memory waits for it, counted as a host synchronisation;
// an empty copy does nothing (also for the backend's own calls, which do not pass the front end).
void CudaBackend::copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes,
                             void* stream) {
    if (bytes == 0) return;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    const Device device = dst_device.is_cuda() ? dst_device : src_device;
    DeviceGuard guard(Context{device, stream, nullptr});
    SPARSEGRID_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    if (dst_device.is_cpu()) {
        count_host_synchronization();
        SPARSEGRID_CUDA_CHECK(cudaStreamSynchronize(s));
    }
}

void CudaBackend::synchronize(const Context& ctx) {
    DeviceGuard guard(ctx);
    SPARSEGRID_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream)));
}

void* CudaBackend::create_event(Device device) {
    DeviceGuard guard(Context{device, nullptr, nullptr});
    cudaEvent_t event = nullptr;
    SPARSEGRID_CUDA_CHECK(cudaEventCreate(&event));
    return event;
}

// Never throws (timers release their events in destructors); a failure is left to the next check.
void CudaBackend::destroy_event(void* event) {
    if (event && cudaEventDestroy(static_cast<cudaEvent_t>(event)) != cudaSuccess) cudaGetLastError();
}

void CudaBackend::record_event(void* event, const Context& ctx) {
    DeviceGuard guard(ctx);
    SPARSEGRID_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(ctx.stream)));
}

double CudaBackend::elapsed_ms(void* start, void* stop) {
    SPARSEGRID_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop)));
    float ms = 0.0f;
    SPARSEGRID_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop)));
    return ms;
}

void CudaBackend::fill_bytes(void* dst, Device device, int value, std::size_t bytes, void* stream) {
    if (bytes == 0) return;
    DeviceGuard guard(Context{device, stream, nullptr});
    SPARSEGRID_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)));
}

}  // namespace sparsegrid::detail
