// Default allocators, host/device copies and backend availability.
#include <sparsegrid/buffer.h>
#include <sparsegrid/types.h>

#include "core/backend.h"
#include "core/checks.h"

#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

namespace sparsegrid {

#if defined(SPARSEGRID_WITH_CUDA)
namespace detail::cuda_runtime {
Allocator& default_allocator();
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes, void* stream);
void fill_bytes(void* dst, Device device, int value, std::size_t bytes, void* stream);
int device_count();
}  // namespace detail::cuda_runtime
#endif

std::string Device::str() const { return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index); }

namespace {

/// 64-byte aligned host memory: full cache lines for every buffer, no false sharing between buffers.
class HostAllocator final : public Allocator {
public:
    void* allocate(std::size_t bytes, Device, void*) override {
        if (bytes == 0) return nullptr;
        const std::size_t rounded = (bytes + 63) / 64 * 64;
        void* ptr = std::aligned_alloc(64, rounded);
        if (!ptr) throw std::bad_alloc();
        return ptr;
    }
    void deallocate(void* ptr, std::size_t, Device, void*) noexcept override { std::free(ptr); }
};

int g_requested_threads = 0;
std::atomic<int64_t> g_host_synchronizations{0};

}  // namespace

Allocator& default_allocator(Device device) {
    static HostAllocator host;
    if (device.is_cpu()) return host;
#if defined(SPARSEGRID_WITH_CUDA)
    return detail::cuda_runtime::default_allocator();
#else
    detail::throw_backend_unavailable("default_allocator", device);
#endif
}

bool cuda_backend_available() {
#if defined(SPARSEGRID_WITH_CUDA)
    return true;
#else
    return false;
#endif
}

int64_t host_synchronizations() { return g_host_synchronizations.load(std::memory_order_relaxed); }

namespace detail {
void count_host_synchronization() { g_host_synchronizations.fetch_add(1, std::memory_order_relaxed); }
}  // namespace detail

int cuda_device_count() {
#if defined(SPARSEGRID_WITH_CUDA)
    return detail::cuda_runtime::device_count();
#else
    return 0;
#endif
}

int cpu_threads() { return g_requested_threads > 0 ? g_requested_threads : omp_get_max_threads(); }

void set_cpu_threads(int num_threads) {
    if (num_threads < 0) detail::throw_error("set_cpu_threads: num_threads must be >= 0, got ", num_threads);
    static const int default_threads = omp_get_max_threads();
    g_requested_threads = num_threads;
    omp_set_num_threads(num_threads > 0 ? num_threads : default_threads);
}

namespace detail {

[[noreturn]] void throw_backend_unavailable(const char* op, Device device) {
    throw_error(op, ": no backend for device ", device.str(), " in this build of sparsegrid",
                cuda_backend_available() ? " (the CUDA backend does not implement this operation yet)"
                                         : " (built without CUDA)");
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes, void* stream) {
    if (bytes == 0) return;
    if (dst_device.is_cpu() && src_device.is_cpu()) {
        std::memcpy(dst, src, bytes);
        return;
    }
#if defined(SPARSEGRID_WITH_CUDA)
    cuda_runtime::copy_bytes(dst, dst_device, src, src_device, bytes, stream);
#else
    (void)stream;
    throw_backend_unavailable("copy_bytes", dst_device.is_cpu() ? src_device : dst_device);
#endif
}

void fill_bytes(void* dst, Device device, int value, std::size_t bytes, void* stream) {
    if (bytes == 0) return;
    if (device.is_cpu()) {
        std::memset(dst, value, bytes);
        return;
    }
#if defined(SPARSEGRID_WITH_CUDA)
    cuda_runtime::fill_bytes(dst, device, value, bytes, stream);
#else
    (void)stream;
    throw_backend_unavailable("fill_bytes", device);
#endif
}

}  // namespace detail
}  // namespace sparsegrid
