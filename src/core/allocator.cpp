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
void synchronize(const Context& ctx);
void* create_event(Device device);
void destroy_event(void* event) noexcept;
void record_event(void* event, const Context& ctx);
double elapsed_ms(void* start, void* stop);
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

void synchronize(const Context& ctx) {
    if (ctx.device.is_cpu()) return;
#if defined(SPARSEGRID_WITH_CUDA)
    detail::cuda_runtime::synchronize(ctx);
#else
    detail::throw_backend_unavailable("synchronize", ctx.device);
#endif
}

StreamTimer::StreamTimer(const Context& ctx) : m_ctx(ctx) {
    if (ctx.device.is_cpu()) return;
#if defined(SPARSEGRID_WITH_CUDA)
    m_start_event = detail::cuda_runtime::create_event(ctx.device);
    m_stop_event = detail::cuda_runtime::create_event(ctx.device);
#else
    detail::throw_backend_unavailable("StreamTimer", ctx.device);
#endif
}

StreamTimer::~StreamTimer() {
#if defined(SPARSEGRID_WITH_CUDA)
    if (m_start_event) detail::cuda_runtime::destroy_event(m_start_event);
    if (m_stop_event) detail::cuda_runtime::destroy_event(m_stop_event);
#endif
}

void StreamTimer::start() {
#if defined(SPARSEGRID_WITH_CUDA)
    if (m_start_event) {
        detail::cuda_runtime::record_event(m_start_event, m_ctx);
        return;
    }
#endif
    m_begin = std::chrono::steady_clock::now();
}

double StreamTimer::stop_ms() {
#if defined(SPARSEGRID_WITH_CUDA)
    if (m_stop_event) {
        detail::cuda_runtime::record_event(m_stop_event, m_ctx);
        return detail::cuda_runtime::elapsed_ms(m_start_event, m_stop_event);
    }
#endif
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - m_begin).count();
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
    throw_error(op, ": device ", device.str(), " is not available: this build of sparsegrid has no CUDA backend");
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
