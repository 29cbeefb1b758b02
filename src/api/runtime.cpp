// Runtime front end: default allocators, copies, synchronisation, timers and the process-wide counters,
// each handed to the backend of the device it concerns.
#include <sparsegrid/buffer.h>
#include <sparsegrid/context.h>

#include "api/dispatch.h"
#include "core/errors.h"

#include <omp.h>

#include <atomic>

namespace sparsegrid {

using detail::on_backend;

std::string Device::str() const { return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index); }

namespace {

int g_requested_threads = 0;
std::atomic<int64_t> g_host_synchronizations{0};

}  // namespace

Allocator& default_allocator(Device device) {
    return on_backend("default_allocator", device,
                      [](auto backend) -> Allocator& { return backend.default_allocator(); });
}

bool cuda_backend_available() {
#if defined(SPARSEGRID_WITH_CUDA)
    return true;
#else
    return false;
#endif
}

int64_t host_synchronizations() { return g_host_synchronizations.load(std::memory_order_relaxed); }

int cuda_device_count() {
#if defined(SPARSEGRID_WITH_CUDA)
    return detail::CudaBackend::device_count();
#else
    return 0;
#endif
}

void synchronize(const Context& ctx) {
    on_backend("synchronize", ctx.device, [&](auto backend) { backend.synchronize(ctx); });
}

StreamTimer::StreamTimer(const Context& ctx) : m_ctx(ctx) {
    on_backend("StreamTimer", ctx.device, [&](auto backend) {
        m_start_event = backend.create_event(ctx.device);
        m_stop_event = backend.create_event(ctx.device);
    });
}

StreamTimer::~StreamTimer() {
    on_backend("StreamTimer", m_ctx.device, [&](auto backend) {
        backend.destroy_event(m_start_event);
        backend.destroy_event(m_stop_event);
    });
}

void StreamTimer::start() {
    on_backend("StreamTimer::start", m_ctx.device, [&](auto backend) { backend.record_event(m_start_event, m_ctx); });
}

double StreamTimer::stop_ms() {
    return on_backend("StreamTimer::stop_ms", m_ctx.device, [&](auto backend) {
        backend.record_event(m_stop_event, m_ctx);
        return backend.elapsed_ms(m_start_event, m_stop_event);
    });
}

int cpu_threads() { return g_requested_threads > 0 ? g_requested_threads : omp_get_max_threads(); }

void set_cpu_threads(int num_threads) {
    if (num_threads < 0) detail::throw_error("set_cpu_threads: num_threads must be >= 0, got ", num_threads);
    static const int default_threads = omp_get_max_threads();
    g_requested_threads = num_threads;
    omp_set_num_threads(num_threads > 0 ? num_threads : default_threads);
}

namespace detail {

void count_host_synchronization() { g_host_synchronizations.fetch_add(1, std::memory_order_relaxed); }

[[noreturn]] void throw_backend_unavailable(const char* op, Device device) {
    throw_error(op, ": device ", device.str(), " is not available: this build of sparsegrid has no CUDA backend");
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes, void* stream) {
    if (bytes == 0) return;
    // A copy that touches a CUDA device is the CUDA backend's; host to host is the CPU's.
    const Device device = dst_device.is_cpu() ? src_device : dst_device;
    on_backend("copy_bytes", device,
               [&](auto backend) { backend.copy_bytes(dst, dst_device, src, src_device, bytes, stream); });
}

void fill_bytes(void* dst, Device device, int value, std::size_t bytes, void* stream) {
    if (bytes == 0) return;
    on_backend("fill_bytes", device, [&](auto backend) { backend.fill_bytes(dst, device, value, bytes, stream); });
}

}  // namespace detail
}  // namespace sparsegrid
