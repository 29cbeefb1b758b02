// Buffer<T>: a typed, reference-counted array on one device, allocated through a Context's allocator.
// Copies of a Buffer share storage; sparsegrid never writes into a buffer it has handed out, which is
// what makes GridBatch and KernelMap cheap to copy and safe to share.
#pragma once

#include <sparsegrid/context.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace sparsegrid {

namespace detail {
/// Copies `bytes` bytes between any two devices, ordered on `stream`. Returns after the copy is
/// complete when the destination is host memory (a host synchronisation for CUDA sources).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes, void* stream);
/// Records one host synchronisation (see host_synchronizations()).
void count_host_synchronization();
/// Sets `bytes` bytes to `value`, ordered on `stream`.
void fill_bytes(void* dst, Device device, int value, std::size_t bytes, void* stream);
}  // namespace detail

/// A span over memory the caller owns, used for inputs. `size` counts elements of T.
template <typename T>
struct Span {
    T* data = nullptr;
    int64_t size = 0;

    Span() = default;
    Span(T* data_, int64_t size_) : data(data_), size(size_) {}
    template <typename U>
    Span(const std::vector<U>& v) : data(v.data()), size(static_cast<int64_t>(v.size())) {}
    template <typename U>
    Span(std::vector<U>& v) : data(v.data()), size(static_cast<int64_t>(v.size())) {}
};

template <typename T>
class Buffer {
public:
    Buffer() = default;

    /// Uninitialised storage for `count` elements on ctx.device.
    static Buffer allocate(int64_t count, const Context& ctx) {
        if (count < 0) throw Error("Buffer::allocate: count must be >= 0, got " + std::to_string(count));
        Buffer result;
        result.m_size = count;
        result.m_device = ctx.device;
        if (count == 0) return result;
        Allocator* allocator = &ctx.resolved_allocator();
        const std::size_t bytes = static_cast<std::size_t>(count) * sizeof(T);
        void* stream = ctx.stream;
        Device device = ctx.device;
        void* raw = allocator->allocate(bytes, device, stream);
        result.m_data = std::shared_ptr<T>(static_cast<T*>(raw), [allocator, bytes, device, stream](T* p) {
            allocator->deallocate(p, bytes, device, stream);
        });
        return result;
    }

    /// A copy of host memory [data, data + count) on ctx.device.
    static Buffer from_host(const T* data, int64_t count, const Context& ctx) {
        Buffer result = allocate(count, ctx);
        if (count > 0)
            detail::copy_bytes(result.data(), ctx.device, data, Device::cpu(),
                               static_cast<std::size_t>(count) * sizeof(T), ctx.stream);
        return result;
    }
    static Buffer from_host(const std::vector<T>& values, const Context& ctx) {
        return from_host(values.data(), static_cast<int64_t>(values.size()), ctx);
    }

    T* data() const { return m_data.get(); }
    int64_t size() const { return m_size; }
    bool empty() const { return m_size == 0; }
    Device device() const { return m_device; }

    /// The first `count` elements (0 <= count <= size()) as a buffer that shares this one's storage:
    /// the whole allocation stays alive while either buffer does. For results whose size is known only
    /// after they are written, into storage of a bound known before.
    Buffer prefix(int64_t count) const {
        if (count < 0 || count > m_size)
            throw Error("Buffer::prefix: count must be in [0, " + std::to_string(m_size) + "], got " +
                        std::to_string(count));
        if (count == 0) {
            Buffer empty;
            empty.m_device = m_device;
            return empty;
        }
        Buffer result = *this;
        result.m_size = count;
        return result;
    }

    /// A host copy. Synchronises `stream` when the buffer lives on a CUDA device.
    std::vector<T> to_host(void* stream = nullptr) const {
        std::vector<T> out(static_cast<std::size_t>(m_size));
        if (m_size > 0)
            detail::copy_bytes(out.data(), Device::cpu(), data(), m_device,
                               static_cast<std::size_t>(m_size) * sizeof(T), stream);
        return out;
    }

private:
    std::shared_ptr<T> m_data;
    int64_t m_size = 0;
    Device m_device = Device::cpu();
};

}  // namespace sparsegrid
