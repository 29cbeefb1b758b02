// CUDA runtime glue of the core: the default stream-ordered allocator and copies. No torch here.
#include <sparsegrid/types.h>

#include <sparsegrid/buffer.h>

#include "core/checks.h"

#include <cuda_runtime.h>

namespace sparsegrid::detail::cuda_runtime {

#define SPARSEGRID_CUDA_CHECK(expr)                                                                   \
    do {                                                                                              \
        const cudaError_t sg_status = (expr);                                                         \
        if (sg_status != cudaSuccess)                                                                 \
            ::sparsegrid::detail::throw_error(#expr, " failed at ", __FILE__, ":", __LINE__, ": ",    \
                                              cudaGetErrorString(sg_status));                         \
    } while (0)

namespace {

class DeviceGuard {
public:
    explicit DeviceGuard(int index) {
        SPARSEGRID_CUDA_CHECK(cudaGetDevice(&m_previous));
        if (m_previous != index) SPARSEGRID_CUDA_CHECK(cudaSetDevice(index));
        m_index = index;
    }
    ~DeviceGuard() {
        if (m_previous != m_index) cudaSetDevice(m_previous);
    }

private:
    int m_previous = 0;
    int m_index = 0;
};

/// Stream-ordered allocation from the device's default memory pool.
class StreamOrderedAllocator final : public Allocator {
public:
    void* allocate(std::size_t bytes, Device device, void* stream) override {
        if (bytes == 0) return nullptr;
        DeviceGuard guard(device.index);
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

Allocator& default_allocator() {
    static StreamOrderedAllocator allocator;
    return allocator;
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes, void* stream) {
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int index = dst_device.is_cuda() ? dst_device.index : src_device.index;
    DeviceGuard guard(index);
    SPARSEGRID_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    if (dst_device.is_cpu()) {
        count_host_synchronization();
        SPARSEGRID_CUDA_CHECK(cudaStreamSynchronize(s));
    }
}

int device_count() {
    int count = 0;
    // No driver or no device is not an error here: the answer is simply zero.
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

void fill_bytes(void* dst, Device device, int value, std::size_t bytes, void* stream) {
    DeviceGuard guard(device.index);
    SPARSEGRID_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)));
}

}  // namespace sparsegrid::detail::cuda_runtime
