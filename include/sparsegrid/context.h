// Devices, the allocator interface, the execution context every operation runs in, and the process-wide
// runtime switches. No backend headers here: C++ users without CUDA or torch include this as is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace sparsegrid {

/// Every invalid argument, overflow or unsupported request raises this, with a message of the form
/// "<operation>: <argument> must be <expectation>, got <value>".
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

enum class DeviceType : int8_t { CPU = 0, CUDA = 1 };

struct Device {
    DeviceType type = DeviceType::CPU;
    int index = 0;

    static Device cpu() { return Device{DeviceType::CPU, 0}; }
    static Device cuda(int index = 0) { return Device{DeviceType::CUDA, index}; }
    bool is_cpu() const { return type == DeviceType::CPU; }
    bool is_cuda() const { return type == DeviceType::CUDA; }
    bool operator==(const Device& other) const { return type == other.type && index == other.index; }
    bool operator!=(const Device& other) const { return !(*this == other); }
    std::string str() const;
};

/// Memory for every buffer the core creates comes from an Allocator, on the context's stream, so that a
/// framework (PyTorch's caching allocator) or a deployment runtime can own all device memory.
/// Implementations must be thread-safe and outlive every buffer they allocated.
class Allocator {
public:
    virtual ~Allocator() = default;
    /// Returns memory for `bytes` bytes (bytes may be 0: return any pointer, possibly null) usable in
    /// stream order on `stream`. Throws on failure; never returns null for bytes > 0.
    virtual void* allocate(std::size_t bytes, Device device, void* stream) = 0;
    virtual void deallocate(void* ptr, std::size_t bytes, Device device, void* stream) noexcept = 0;
};

/// The default allocator of a device: aligned host memory for CPU, stream-ordered cudaMallocAsync for
/// CUDA. Throws Error if the library was built without support for that device.
Allocator& default_allocator(Device device);

/// Where and how an operation runs. A null allocator means default_allocator(device). `stream` is a
/// cudaStream_t for CUDA (null = the legacy default stream) and ignored on CPU. Results of an operation
/// live on the context's device and are ordered on its stream.
struct Context {
    Device device = Device::cpu();
    void* stream = nullptr;
    Allocator* allocator = nullptr;
    /// Float32 convolutions may run on TF32 tensor cores (CUDA, compute capability 8.0+): inputs rounded
    /// to TF32's 10-bit mantissa, products summed in float32, still deterministic. Off by default, as
    /// in cuBLAS and PyTorch; the CPU backend always computes in float32.
    bool allow_tf32 = false;

    Allocator& resolved_allocator() const { return allocator ? *allocator : default_allocator(device); }
};

/// True when the library was compiled with its CUDA backend.
bool cuda_backend_available();
/// Number of CUDA devices usable by this build (0 without the CUDA backend or without a GPU).
int cuda_device_count();

/// Host synchronisations the library has performed so far (process-wide, all threads): every wait of
/// the host for a CUDA stream, e.g. to read back a data-dependent output size. Always 0 on the CPU
/// backend. Tests and benchmarks read it before and after an operation to count that operation's syncs.
int64_t host_synchronizations();

/// Waits until all work queued on the context's stream has finished (no-op on the CPU). An explicit
/// request of the caller, so not counted by host_synchronizations().
void synchronize(const Context& ctx);

/// Measures the time of work queued on a context's stream between start() and stop_ms(): CUDA events
/// on a CUDA device, a steady clock on the CPU. stop_ms() waits for the stream (not counted by
/// host_synchronizations()).
class StreamTimer {
public:
    explicit StreamTimer(const Context& ctx);
    ~StreamTimer();
    StreamTimer(const StreamTimer&) = delete;
    StreamTimer& operator=(const StreamTimer&) = delete;
    void start();
    double stop_ms();

private:
    Context m_ctx;
    void* m_start_event = nullptr;
    void* m_stop_event = nullptr;
};

/// Number of threads the CPU backend uses (OpenMP). set_cpu_threads(0) restores the default.
int cpu_threads();
void set_cpu_threads(int num_threads);

}  // namespace sparsegrid
