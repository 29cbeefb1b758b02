// The runtime glue of the PyTorch layer (torch_runtime.h): streams, allocators, contexts, argument
// checks and the convolution timer.
#include "torch_runtime.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/version.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace sparsegrid_torch {

namespace {

// ---- streams ---------------------------------------------------------------------------------------

/// The native handle (cudaStream_t) of a c10::Stream, through the device-generic interface. The member
/// came with torch 2.x (native_handle(), named stream_handle() in some versions) and is absent from
/// 1.x: detected rather than assumed, so that the layer builds against every LibTorch it meets.
template <typename S, typename = void>
struct HasNativeHandle : std::false_type {};
template <typename S>
struct HasNativeHandle<S, std::void_t<decltype(std::declval<const S&>().native_handle())>> : std::true_type {};
template <typename S, typename = void>
struct HasStreamHandle : std::false_type {};
template <typename S>
struct HasStreamHandle<S, std::void_t<decltype(std::declval<const S&>().stream_handle())>> : std::true_type {};

template <typename S>
void* native_stream_handle(const S& stream, const char* op) {
    if constexpr (HasNativeHandle<S>::value) {
        return stream.native_handle();
    } else if constexpr (HasStreamHandle<S>::value) {
        return stream.stream_handle();
    } else {
        fail(op,
             ": CUDA tensors need the native handle of PyTorch's current stream (c10::Stream::native_handle()), "
             "which LibTorch ",
             TORCH_VERSION,
             " does not provide; build the PyTorch layer against a torch 2.x "
             "that has it");
    }
}

/// Every CUDA stream a context was made with, by (device index, native handle), so that the core's
/// stream can be turned back into a c10::Stream for events and the caching allocator. Streams are few
/// (PyTorch's pools and the user's own), so the table stays small. Never destroyed: buffers may be
/// freed during interpreter shutdown.
class StreamRegistry {
public:
    static StreamRegistry& instance() {
        static auto* registry = new StreamRegistry();
        return *registry;
    }
    void add(const c10::Stream& stream, void* handle) {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_streams.insert_or_assign(std::make_pair(static_cast<int>(stream.device_index()), handle), stream);
    }
    c10::Stream find(const sparsegrid::Device& device, void* handle) const {
        std::lock_guard<std::mutex> lock(m_mutex);
        const auto it = m_streams.find(std::make_pair(device.index, handle));
        if (it == m_streams.end())
            fail("sparsegrid: the stream ", handle, " on ", device.str(),
                 " was not created through the PyTorch layer; build grids from tensors");
        return it->second;
    }

private:
    mutable std::mutex m_mutex;
    std::map<std::pair<int, void*>, c10::Stream> m_streams;
};

/// PyTorch's current stream on `device`, registered.
std::pair<c10::Stream, void*> current_stream(const c10::Device& device, const char* op) {
    const c10::Stream stream = c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStream(device);
    void* handle = native_stream_handle(stream, op);
    StreamRegistry::instance().add(stream, handle);
    return {stream, handle};
}

// ---- allocators ------------------------------------------------------------------------------------

/// Host memory of the core through PyTorch's CPU allocator.
class TorchCpuAllocator final : public sparsegrid::Allocator {
public:
    void* allocate(std::size_t bytes, sparsegrid::Device, void*) override {
        return bytes == 0 ? nullptr : c10::GetCPUAllocator()->raw_allocate(bytes);
    }
    void deallocate(void* ptr, std::size_t, sparsegrid::Device, void*) noexcept override {
        if (ptr) c10::GetCPUAllocator()->raw_deallocate(ptr);
    }
};

/// Device memory of the core through PyTorch's CUDA caching allocator (the generic c10 interface, no
/// CUDA header). The caching allocator serves the current stream of the current device, so each
/// allocation runs with the core's stream made current: the block is then recycled in the order of
/// the stream that uses it, as with cudaMallocAsync. The DataPtrs stay here until the core frees.
class TorchCudaAllocator final : public sparsegrid::Allocator {
public:
    static TorchCudaAllocator& instance() {
        static auto* allocator = new TorchCudaAllocator();  // outlives every buffer, even at shutdown
        return *allocator;
    }
    void* allocate(std::size_t bytes, sparsegrid::Device device, void* stream) override {
        if (bytes == 0) return nullptr;
        const c10::StreamGuard guard(StreamRegistry::instance().find(device, stream));
        c10::DataPtr block = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(bytes);
        void* ptr = block.get();
        if (!ptr) fail("sparsegrid: the CUDA caching allocator returned null for ", bytes, " bytes on ", device.str());
        std::lock_guard<std::mutex> lock(m_mutex);
        m_blocks.emplace(ptr, std::move(block));
        return ptr;
    }
    void deallocate(void* ptr, std::size_t, sparsegrid::Device, void*) noexcept override {
        if (!ptr) return;
        c10::DataPtr block;
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            const auto it = m_blocks.find(ptr);
            if (it == m_blocks.end()) return;
            block = std::move(it->second);
            m_blocks.erase(it);
        }
        try {
            block.clear();  // back to the cache, outside the lock
        } catch (...) {}
    }

private:
    std::mutex m_mutex;
    std::unordered_map<void*, c10::DataPtr> m_blocks;
};

/// Nanoseconds spent in convolution calls (see convolution_seconds()).
std::atomic<int64_t> g_convolution_nanoseconds{0};

}  // namespace

// ---- devices, contexts, streams ----------------------------------------------------------------------

c10::Device torch_device(const sparsegrid::Device& device) {
    return device.is_cpu() ? c10::Device(c10::DeviceType::CPU)
                           : c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device.index));
}

c10::Device concrete_device(c10::Device device) {
    if (device.is_cuda() && !device.has_index()) return c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getDevice();
    return device;
}

sparsegrid::Context context_of(const torch::Tensor& tensor, const char* op, const char* name) {
    static TorchCpuAllocator cpu_allocator;
    sparsegrid::Context ctx;
    if (tensor.device().is_cpu()) {
        ctx.allocator = &cpu_allocator;
        return ctx;
    }
    if (!tensor.device().is_cuda())
        fail(op, ": ", name, " is on ", tensor.device().str(), "; sparsegrid runs on CPU and CUDA tensors");
    if (!sparsegrid::cuda_backend_available())
        fail(op, ": ", name, " is on ", tensor.device().str(),
             " but this build of sparsegrid has no CUDA backend (configure with -DSPARSEGRID_WITH_CUDA=ON)");
    ctx.device = sparsegrid::Device::cuda(tensor.device().index());
    ctx.stream = current_stream(tensor.device(), op).second;
    ctx.allocator = &TorchCudaAllocator::instance();
    return ctx;
}

CoreScope::CoreScope(const sparsegrid::Context& ctx) {
    if (!ctx.device.is_cuda()) return;
    const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(ctx.device.index));
    m_device_guard.reset_device(device);
    const auto [caller, handle] = current_stream(device, "sparsegrid");
    if (handle == ctx.stream) return;
    const c10::Stream core = StreamRegistry::instance().find(ctx.device, ctx.stream);
    c10::Event inputs_ready(c10::DeviceType::CUDA);
    inputs_ready.record(caller);
    inputs_ready.block(core);
    m_core.emplace(core);
    m_caller.emplace(caller);
}

CoreScope::~CoreScope() {
    if (!m_core) return;
    try {
        c10::Event outputs_ready(c10::DeviceType::CUDA);
        outputs_ready.record(*m_core);
        outputs_ready.block(*m_caller);
    } catch (...) {}
}

// ---- argument checks and conversions ----------------------------------------------------------------

void check_tensor(const torch::Tensor& t, const char* op, const char* name, torch::ScalarType dtype, int64_t dim) {
    if (t.scalar_type() != dtype)
        fail(op, ": ", name, " must have dtype ", c10::toString(dtype), ", got ", c10::toString(t.scalar_type()));
    if (t.dim() != dim) fail(op, ": ", name, " must have ", dim, " dimensions, got ", t.dim());
}

void check_device(const torch::Tensor& t, const sparsegrid::Device& device, const char* op, const char* name) {
    if (t.device() != torch_device(device))
        fail(op, ": ", name, " is on ", t.device().str(), " but the grid is on ", device.str(),
             "; move it there first (.to(\"", device.str(), "\"))");
}

Vec3i triple(const std::vector<int64_t>& values, const char* op, const char* name) {
    if (values.size() != 1 && values.size() != 3)
        fail(op, ": ", name, " must have 1 or 3 entries, got ", values.size());
    for (int64_t v : values)
        if (v < INT32_MIN || v > INT32_MAX) fail(op, ": ", name, " entries must fit int32, got ", v);
    const auto at = [&](size_t a) { return static_cast<int32_t>(values[values.size() == 1 ? 0 : a]); };
    return {at(0), at(1), at(2)};
}

torch::Tensor host_metadata(const torch::Tensor& t, const torch::Tensor& data, const char* op, const char* name) {
    if (!t.device().is_cpu() && t.device() != data.device())
        fail(op, ": ", name, " is on ", t.device().str(), "; give it on the CPU (or on ", data.device().str(),
             ", the device of the data)");
    return t.to(torch::kCPU).contiguous();
}

std::vector<Vec3i> host_coordinates(const torch::Tensor& t, const char* op, const char* name) {
    if (!c10::isIntegralType(t.scalar_type(), /*includeBool=*/false))
        fail(op, ": ", name, " must have an integer dtype, got ", c10::toString(t.scalar_type()));
    if (!(t.dim() == 1 && t.size(0) == 3) && !(t.dim() == 2 && t.size(1) == 3))
        fail(op, ": ", name, " must have shape [3] or [B, 3], got ", t.sizes());
    if (!t.device().is_cpu() && !t.device().is_cuda())
        fail(op, ": ", name, " is on ", t.device().str(), "; give it on the CPU (or a CUDA device)");
    const torch::Tensor host = t.to(torch::kCPU, torch::kInt64).contiguous().reshape({-1, 3});
    const int64_t* values = host.data_ptr<int64_t>();
    std::vector<Vec3i> out(static_cast<size_t>(host.size(0)));
    for (int64_t row = 0; row < host.size(0); ++row)
        for (int a = 0; a < 3; ++a) {
            const int64_t v = values[3 * row + a];
            if (v < INT32_MIN || v > INT32_MAX) fail(op, ": ", name, " entries must fit int32, got ", v);
            out[row][a] = static_cast<int32_t>(v);
        }
    return out;
}

sparsegrid::DType dtype_of(const torch::Tensor& t, const char* op, const char* name) {
    switch (t.scalar_type()) {
    case torch::kFloat32:
        return sparsegrid::DType::Float32;
    case torch::kFloat64:
        return sparsegrid::DType::Float64;
    case torch::kFloat16:
    case torch::kBFloat16:
        if (!t.device().is_cuda())
            fail(op, ": ", name, " is ", c10::toString(t.scalar_type()), " on ", t.device().str(),
                 "; float16 and bfloat16 run on CUDA only, use float32 or float64 on the CPU");
        return t.scalar_type() == torch::kFloat16 ? sparsegrid::DType::Float16 : sparsegrid::DType::BFloat16;
    default:
        fail(op, ": ", name, " must be float32 or float64 (or float16 / bfloat16 on CUDA), got ",
             c10::toString(t.scalar_type()));
    }
}

// ---- the convolution timer --------------------------------------------------------------------------

ConvolutionTimer::~ConvolutionTimer() {
    g_convolution_nanoseconds +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - m_start).count();
}

double convolution_seconds() { return static_cast<double>(g_convolution_nanoseconds.load()) * 1e-9; }

void refuse_second_backward(const std::vector<torch::Tensor>& depends_on, std::vector<torch::Tensor*> gradients,
                            const char* message) {
    if (!at::GradMode::is_enabled()) return;
    torch::autograd::edge_list edges;
    edges.reserve(depends_on.size());
    for (const torch::Tensor& t : depends_on)
        edges.push_back(t.defined() ? torch::autograd::impl::gradient_edge(t) : torch::autograd::Edge());
    const auto error = std::make_shared<torch::autograd::Error>(message, std::move(edges));
    for (torch::Tensor* gradient : gradients) {
        if (!gradient->defined()) continue;
        torch::Tensor alias = gradient->detach();
        torch::autograd::create_gradient_edge(alias, error);
        *gradient = std::move(alias);
    }
}

}  // namespace sparsegrid_torch
