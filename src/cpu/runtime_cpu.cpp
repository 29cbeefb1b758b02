// CPU runtime entry points: aligned host memory, plain copies, and steady-clock timing events.
#include "backend/backend.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>

namespace sparsegrid::detail {

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

using TimePoint = std::chrono::steady_clock::time_point;

}  // namespace

Allocator& CpuBackend::default_allocator(void) {
    static HostAllocator host;
    return host;
}

int CpuBackend::device_count(void) { return 1; }

void CpuBackend::copy_bytes(void* dst, Device, const void* src, Device, std::size_t bytes, void*) {
    std::memcpy(dst, src, bytes);
}

void CpuBackend::fill_bytes(void* dst, Device, int value, std::size_t bytes, void*) { std::memset(dst, value, bytes); }

void CpuBackend::synchronize(const Context&) {}

void* CpuBackend::create_event(Device) { return new TimePoint(); }

void CpuBackend::destroy_event(void* event) { delete static_cast<TimePoint*>(event); }

void CpuBackend::record_event(void* event, const Context&) {
    *static_cast<TimePoint*>(event) = std::chrono::steady_clock::now();
}

double CpuBackend::elapsed_ms(void* start, void* stop) {
    return std::chrono::duration<double, std::milli>(*static_cast<TimePoint*>(stop) - *static_cast<TimePoint*>(start))
        .count();
}

}  // namespace sparsegrid::detail
