// The PyTorch layer: TorchScript classes wrapping GridBatch and ConvolutionPlan, registered with
// TORCH_LIBRARY so that they are usable from C++ (LibTorch) and Python (torch.classes.sparsegrid).
// Thin by design: check tensors, guard the device, take PyTorch's current stream, route memory
// through PyTorch's allocators, call the core.
//
// Devices. Grids live on the device of the tensors they were built from (CPU or cuda:N); every tensor
// the layer returns lives there too, and every tensor argument must already be there (the error names
// the argument and both devices; nothing is moved silently). Host metadata (member offsets, voxel
// sizes, origins) may be given on the CPU, which costs no synchronisation.
//
// Streams. A grid's context records the stream that was current when it was built, and the core runs
// everything derived from that grid (topology operations, kernel maps, convolutions) on that stream.
// When PyTorch's current stream is another one, the layer orders the two with events (no host
// synchronisation): the grid's stream first waits for the work queued so far on the current stream
// (the inputs), and the current stream then waits for the grid's (the outputs). With a single stream,
// the usual case, that costs nothing.
//
// Memory. Host buffers of the core come from PyTorch's CPU allocator, device buffers from its CUDA
// caching allocator, each block tied to the core stream that uses it. Tensors returned for grid data
// (ijk, offsets, neighbour maps) are zero-copy views that keep the core buffer alive.
//
// This file includes no CUDA header: it builds against a CPU-only LibTorch as well as a CUDA one; the
// CUDA stream handle comes from c10's device-generic stream interface.
#include <sparsegrid/convolution.h>
#include <sparsegrid/grid_batch.h>
#include <sparsegrid/kernel_map.h>
#include <sparsegrid/mesh_io.h>
#include <sparsegrid/shapes.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sparsegrid_torch {

using sparsegrid::Vec3i;

namespace {

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
    std::ostringstream message;
    (message << ... << parts);
    throw sparsegrid::Error(message.str());
}

// ---- devices ---------------------------------------------------------------------------------------

c10::Device torch_device(const sparsegrid::Device& device) {
    return device.is_cpu() ? c10::Device(c10::DeviceType::CPU)
                           : c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device.index));
}

/// A concrete device: "cuda" without an index means PyTorch's current CUDA device.
c10::Device concrete_device(c10::Device device) {
    if (device.is_cuda() && !device.has_index()) return c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getDevice();
    return device;
}

/// The native handle (cudaStream_t) of a c10::Stream, through the device-generic interface. The member
/// came with torch 2.x (native_handle(), named stream_handle() in some versions) and is absent from
/// 1.x: detected rather than assumed, so that this file builds against every LibTorch it meets.
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

/// The context of work on `tensor`'s device: PyTorch's allocators and, on CUDA, its current stream.
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

/// Runs one core call on `ctx` (a grid's context) in order with PyTorch's current stream, on ctx's
/// device (see "Streams" at the top). Create it after the inputs are prepared on the current stream
/// and right before the core call; it ends the ordering when it goes out of scope. No host sync.
class CoreScope {
public:
    explicit CoreScope(const sparsegrid::Context& ctx) {
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
    ~CoreScope() {
        if (!m_core) return;
        try {
            c10::Event outputs_ready(c10::DeviceType::CUDA);
            outputs_ready.record(*m_core);
            outputs_ready.block(*m_caller);
        } catch (...) {}
    }
    CoreScope(const CoreScope&) = delete;
    CoreScope& operator=(const CoreScope&) = delete;

private:
    c10::OptionalDeviceGuard m_device_guard;
    std::optional<c10::Stream> m_core;
    std::optional<c10::Stream> m_caller;
};

// ---- argument checks -------------------------------------------------------------------------------

void check_tensor(const torch::Tensor& t, const char* op, const char* name, torch::ScalarType dtype, int64_t dim) {
    if (t.scalar_type() != dtype)
        fail(op, ": ", name, " must have dtype ", c10::toString(dtype), ", got ", c10::toString(t.scalar_type()));
    if (t.dim() != dim) fail(op, ": ", name, " must have ", dim, " dimensions, got ", t.dim());
}

/// `t` must live on `device` (the grid's).
void check_device(const torch::Tensor& t, const sparsegrid::Device& device, const char* op, const char* name) {
    if (t.device() != torch_device(device))
        fail(op, ": ", name, " is on ", t.device().str(), " but the grid is on ", device.str(),
             "; move it there first (.to(\"", device.str(), "\"))");
}

Vec3i triple(const std::vector<int64_t>& values, const char* op, const char* name) {
    if (values.size() == 1)
        return {static_cast<int32_t>(values[0]), static_cast<int32_t>(values[0]), static_cast<int32_t>(values[0])};
    if (values.size() != 3) fail(op, ": ", name, " must have 1 or 3 entries, got ", values.size());
    for (int64_t v : values)
        if (v < INT32_MIN || v > INT32_MAX) fail(op, ": ", name, " entries must fit int32, got ", v);
    return {static_cast<int32_t>(values[0]), static_cast<int32_t>(values[1]), static_cast<int32_t>(values[2])};
}

/// A tensor view of a core buffer, on the buffer's device; the tensor keeps the buffer alive.
template <typename T>
torch::Tensor tensor_of(const sparsegrid::Buffer<T>& buffer, std::vector<int64_t> shape, torch::ScalarType dtype) {
    const torch::TensorOptions options = torch::dtype(dtype).device(torch_device(buffer.device()));
    if (buffer.size() == 0) return torch::empty(shape, options);
    auto keep = std::make_shared<sparsegrid::Buffer<T>>(buffer);
    return torch::from_blob(
        buffer.data(), shape, [keep](void*) mutable { keep.reset(); }, options);
}

/// The element type of a convolution operand: float32 and float64 everywhere, float16 and bfloat16 on
/// CUDA (accumulated in float32 by the core).
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

/// Nanoseconds spent in convolution calls (forward and both backward passes), process-wide: lets a
/// training loop split its step time without a profiler. Host time: on CUDA the calls only queue
/// work, so this measures the launch side; synchronise around a step (or use the profiler) for the
/// device time.
std::atomic<int64_t> g_convolution_nanoseconds{0};

class ConvolutionTimer {
public:
    ConvolutionTimer() : m_start(std::chrono::steady_clock::now()) {}
    ~ConvolutionTimer() {
        g_convolution_nanoseconds +=
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - m_start).count();
    }

private:
    std::chrono::steady_clock::time_point m_start;
};

/// Host metadata (offsets, transforms) given as tensors: CPU (free) or the data's device (a copy to
/// the host, which synchronises).
torch::Tensor host_metadata(const torch::Tensor& t, const torch::Tensor& data, const char* op, const char* name) {
    if (!t.device().is_cpu() && t.device() != data.device())
        fail(op, ": ", name, " is on ", t.device().str(), "; give it on the CPU (or on ", data.device().str(),
             ", the device of the data)");
    return t.to(torch::kCPU).contiguous();
}

}  // namespace

/// torch.classes.sparsegrid.GridBatch
struct GridBatchHolder : torch::CustomClassHolder {
    sparsegrid::GridBatch grid;
    explicit GridBatchHolder(sparsegrid::GridBatch g) : grid(std::move(g)) {}

    using Ptr = c10::intrusive_ptr<GridBatchHolder>;
    static Ptr wrap(sparsegrid::GridBatch g) { return c10::make_intrusive<GridBatchHolder>(std::move(g)); }

    /// From ijk [N, 3] int32 on the grid's device (CPU or CUDA), member offsets [B+1] int64 and voxel
    /// sizes and origins [B, 3] float64 (CPU, or ijk's device at the cost of a sync). The grid lives
    /// on ijk's device and runs on its current stream.
    static Ptr from_ijk(torch::Tensor ijk, torch::Tensor offsets, torch::Tensor voxel_sizes, torch::Tensor origins) {
        constexpr const char* op = "GridBatch.from_ijk";
        check_tensor(ijk, op, "ijk", torch::kInt32, 2);
        if (ijk.size(1) != 3) fail(op, ": ijk must have shape [N, 3], got [", ijk.size(0), ", ", ijk.size(1), "]");
        const std::vector<int64_t> offsets_host = offsets_vector(offsets, ijk, op);
        const std::vector<sparsegrid::MemberTransform> transforms = transforms_of(
            voxel_sizes, origins, ijk, static_cast<int64_t>(offsets_host.size()) - 1, op);
        const torch::Tensor contiguous = ijk.contiguous();
        const sparsegrid::Context ctx = context_of(ijk, op, "ijk");
        const CoreScope scope(ctx);
        return wrap(sparsegrid::GridBatch::from_ijk(
            sparsegrid::Span<const int32_t>(contiguous.data_ptr<int32_t>(), contiguous.numel()), offsets_host,
            transforms, ctx));
    }

    /// From world points [N, 3] float64: the voxels containing at least one point (see
    /// GridBatch::from_points), on the points' device.
    static Ptr from_points(torch::Tensor xyz, torch::Tensor offsets, torch::Tensor voxel_sizes, torch::Tensor origins) {
        constexpr const char* op = "GridBatch.from_points";
        check_tensor(xyz, op, "xyz", torch::kFloat64, 2);
        if (xyz.size(1) != 3) fail(op, ": xyz must have shape [N, 3], got [", xyz.size(0), ", ", xyz.size(1), "]");
        const std::vector<int64_t> offsets_host = offsets_vector(offsets, xyz, op);
        const std::vector<sparsegrid::MemberTransform> transforms = transforms_of(
            voxel_sizes, origins, xyz, static_cast<int64_t>(offsets_host.size()) - 1, op);
        const torch::Tensor contiguous = xyz.contiguous();
        const sparsegrid::Context ctx = context_of(xyz, op, "xyz");
        const CoreScope scope(ctx);
        return wrap(sparsegrid::GridBatch::from_points(
            sparsegrid::Span<const double>(contiguous.data_ptr<double>(), contiguous.numel()), offsets_host, transforms,
            ctx));
    }

    /// From triangle meshes: vertices [V, 3] float64 and faces [F, 3] int32 (member-local indices, on
    /// the vertices' device) with their member offsets (see GridBatch::from_mesh for the devices the
    /// core voxelises on).
    static Ptr from_mesh(torch::Tensor vertices, torch::Tensor vertex_offsets, torch::Tensor faces,
                         torch::Tensor face_offsets, torch::Tensor voxel_sizes, torch::Tensor origins) {
        constexpr const char* op = "GridBatch.from_mesh";
        check_tensor(vertices, op, "vertices", torch::kFloat64, 2);
        check_tensor(faces, op, "faces", torch::kInt32, 2);
        if (vertices.size(1) != 3 || faces.size(1) != 3) fail(op, ": vertices and faces must have shape [N, 3]");
        if (faces.device() != vertices.device())
            fail(op, ": faces is on ", faces.device().str(), " but vertices is on ", vertices.device().str(),
                 "; give both on the same device");
        const std::vector<int64_t> vertex_offsets_host = offsets_vector(vertex_offsets, vertices, op, "vertex_offsets");
        const std::vector<int64_t> face_offsets_host = offsets_vector(face_offsets, vertices, op, "face_offsets");
        const std::vector<sparsegrid::MemberTransform> transforms = transforms_of(
            voxel_sizes, origins, vertices, static_cast<int64_t>(face_offsets_host.size()) - 1, op);
        const torch::Tensor v = vertices.contiguous(), f = faces.contiguous();
        const sparsegrid::Context ctx = context_of(vertices, op, "vertices");
        const CoreScope scope(ctx);
        return wrap(sparsegrid::GridBatch::from_mesh(
            sparsegrid::Span<const double>(v.data_ptr<double>(), v.numel()), vertex_offsets_host,
            sparsegrid::Span<const int32_t>(f.data_ptr<int32_t>(), f.numel()), face_offsets_host, transforms, ctx));
    }

    static std::vector<int64_t> offsets_vector(const torch::Tensor& offsets, const torch::Tensor& data, const char* op,
                                               const char* name = "offsets") {
        check_tensor(offsets, op, name, torch::kInt64, 1);
        const torch::Tensor host = host_metadata(offsets, data, op, name);
        return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
    }

    static std::vector<sparsegrid::MemberTransform> transforms_of(const torch::Tensor& voxel_sizes,
                                                                  const torch::Tensor& origins,
                                                                  const torch::Tensor& data, int64_t batch_size,
                                                                  const char* op) {
        check_tensor(voxel_sizes, op, "voxel_sizes", torch::kFloat64, 2);
        check_tensor(origins, op, "origins", torch::kFloat64, 2);
        for (const auto& [t, name] : {std::pair{voxel_sizes, "voxel_sizes"}, std::pair{origins, "origins"}})
            if (t.size(0) != batch_size || t.size(1) != 3)
                fail(op, ": ", name, " must have shape [", batch_size, ", 3], got [", t.size(0), ", ", t.size(1), "]");
        const torch::Tensor h = host_metadata(voxel_sizes, data, op, "voxel_sizes");
        const torch::Tensor o = host_metadata(origins, data, op, "origins");
        std::vector<sparsegrid::MemberTransform> out(static_cast<size_t>(batch_size));
        for (int64_t m = 0; m < batch_size; ++m)
            for (int a = 0; a < 3; ++a) {
                out[m].voxel_size[a] = h.data_ptr<double>()[3 * m + a];
                out[m].origin[a] = o.data_ptr<double>()[3 * m + a];
            }
        return out;
    }

    int64_t batch_size() const { return grid.batch_size(); }
    int64_t num_voxels() const { return grid.num_voxels(); }
    c10::Device device() const { return torch_device(grid.device()); }
    /// Coordinates [N, 3] int32 on the grid's device (a view of the grid's memory: do not write).
    torch::Tensor ijk() const { return tensor_of(grid.ijk(), {grid.num_voxels(), 3}, torch::kInt32); }
    /// Member offsets [B+1] int64 on the grid's device (a view of the grid's memory).
    torch::Tensor offsets() const {
        return tensor_of(grid.voxel_offsets_buffer(), {grid.batch_size() + 1}, torch::kInt64);
    }
    torch::Tensor voxel_sizes() const { return transform_tensor(true); }
    torch::Tensor origins() const { return transform_tensor(false); }
    /// [B, 3] float64 on the grid's device (built from host metadata: an upload on CUDA, no sync).
    torch::Tensor transform_tensor(bool sizes) const {
        torch::Tensor out = torch::empty({grid.batch_size(), 3}, torch::dtype(torch::kFloat64));
        for (int64_t m = 0; m < grid.batch_size(); ++m)
            for (int a = 0; a < 3; ++a)
                out.data_ptr<double>()[3 * m + a] = sizes ? grid.voxel_size(m)[a] : grid.origin(m)[a];
        return out.to(device());
    }

    /// The same grid on `target` ("cuda" = the current CUDA device): the voxels are copied and the
    /// grid rebuilt there (same voxels, same order, same transforms). Cost: one copy, plus
    /// from_ijk's sort and syncs on a CUDA target.
    Ptr to(c10::Device target) const {
        constexpr const char* op = "GridBatch.to";
        target = concrete_device(target);
        if (target == device()) return wrap(grid);
        const torch::Tensor moved = ijk().to(target).contiguous();
        const sparsegrid::Context ctx = context_of(moved, op, "device");
        const CoreScope scope(ctx);
        return wrap(
            sparsegrid::GridBatch::from_ijk(sparsegrid::Span<const int32_t>(moved.data_ptr<int32_t>(), moved.numel()),
                                            grid.voxel_offsets(), grid.transforms(), ctx));
    }

    Ptr conv_grid(std::vector<int64_t> k, std::vector<int64_t> s) const {
        const Vec3i kernel = triple(k, "conv_grid", "kernel_size"), stride = triple(s, "conv_grid", "stride");
        const CoreScope scope(grid.context());
        return wrap(grid.conv_grid(kernel, stride));
    }
    Ptr conv_transpose_grid(std::vector<int64_t> k, std::vector<int64_t> s) const {
        const Vec3i kernel = triple(k, "conv_transpose_grid", "kernel_size");
        const Vec3i stride = triple(s, "conv_transpose_grid", "stride");
        const CoreScope scope(grid.context());
        return wrap(grid.conv_transpose_grid(kernel, stride));
    }
    Ptr coarsened_grid(std::vector<int64_t> f) const {
        const Vec3i factor = triple(f, "coarsened_grid", "factor");
        const CoreScope scope(grid.context());
        return wrap(grid.coarsened_grid(factor));
    }
    Ptr refined_grid(std::vector<int64_t> f, c10::optional<torch::Tensor> mask) const {
        const Vec3i factor = triple(f, "refined_grid", "factor");
        if (!mask) {
            const CoreScope scope(grid.context());
            return wrap(grid.refined_grid(factor));
        }
        const torch::Tensor m = mask_bytes(*mask, "refined_grid");
        const CoreScope scope(grid.context());
        return wrap(grid.refined_grid(factor, sparsegrid::Span<const uint8_t>(m.data_ptr<uint8_t>(), m.numel())));
    }
    Ptr dilated_grid(int64_t distance) const {
        if (distance < 0 || distance > INT32_MAX) fail("dilated_grid: distance must be in [0, 645], got ", distance);
        const CoreScope scope(grid.context());
        return wrap(grid.dilated_grid(static_cast<int32_t>(distance)));
    }
    Ptr pruned_grid(torch::Tensor mask) const {
        const torch::Tensor m = mask_bytes(mask, "pruned_grid");
        const CoreScope scope(grid.context());
        return wrap(grid.pruned_grid(sparsegrid::Span<const uint8_t>(m.data_ptr<uint8_t>(), m.numel())));
    }
    Ptr merged_grid(Ptr other) const {
        if (other->grid.device() != grid.device())
            fail("merged_grid: other is on ", other->grid.device().str(), " but the grid is on ", grid.device().str(),
                 "; move it there first (.to(\"", grid.device().str(), "\"))");
        const CoreScope scope(grid.context()), other_scope(other->grid.context());
        return wrap(grid.merged_grid(other->grid));
    }

    /// Global voxel index [Q] int64 of each query [Q, 3] int32 (on the grid's device) in member q_member[q]
    /// (given by offsets [B+1]), or -1.
    torch::Tensor ijk_to_index(torch::Tensor query, torch::Tensor query_offsets) const {
        constexpr const char* op = "GridBatch.ijk_to_index";
        check_tensor(query, op, "query", torch::kInt32, 2);
        if (query.size(1) != 3)
            fail(op, ": query must have shape [Q, 3], got [", query.size(0), ", ", query.size(1), "]");
        check_device(query, grid.device(), op, "query");
        const std::vector<int64_t> offsets_host = offsets_vector(query_offsets, query, op, "query_offsets");
        const torch::Tensor q = query.contiguous();
        const CoreScope scope(grid.context());
        const sparsegrid::Buffer<int64_t> result = grid.ijk_to_index(
            sparsegrid::Span<const int32_t>(q.data_ptr<int32_t>(), q.numel()), offsets_host);
        return tensor_of(result, {q.size(0)}, torch::kInt64);
    }

    torch::Tensor mask_bytes(const torch::Tensor& mask, const char* op) const {
        if (mask.dim() != 1) fail(op, ": mask must have 1 dimension, got ", mask.dim());
        check_device(mask, grid.device(), op, "mask");
        return mask.to(torch::kUInt8).contiguous();  // nonzero = keep, whatever the input dtype
    }
};

/// torch.classes.sparsegrid.ConvolutionPlan
struct ConvolutionPlanHolder : torch::CustomClassHolder {
    sparsegrid::ConvolutionPlan plan;
    explicit ConvolutionPlanHolder(sparsegrid::ConvolutionPlan p) : plan(std::move(p)) {}
    using Ptr = c10::intrusive_ptr<ConvolutionPlanHolder>;

    /// transposed = false: forward (strided) convolution; true: transposed convolution. Without a
    /// target the generated grid (conv_grid or conv_transpose_grid) is the target. The plan lives on
    /// the source grid's device; a target must be there too.
    static Ptr make(GridBatchHolder::Ptr source, std::vector<int64_t> k, std::vector<int64_t> s,
                    c10::optional<GridBatchHolder::Ptr> target, bool transposed) {
        const Vec3i kernel = triple(k, "ConvolutionPlan", "kernel_size"),
                    stride = triple(s, "ConvolutionPlan", "stride");
        if (target && (*target)->grid.device() != source->grid.device())
            fail("ConvolutionPlan: target is on ", (*target)->grid.device().str(), " but the source grid is on ",
                 source->grid.device().str(), "; move it there first (.to(\"", source->grid.device().str(), "\"))");
        using sparsegrid::ConvolutionPlan;
        const CoreScope scope(source->grid.context());
        const CoreScope target_scope(target ? (*target)->grid.context() : source->grid.context());
        if (transposed)
            return c10::make_intrusive<ConvolutionPlanHolder>(
                target ? ConvolutionPlan::make_transposed(source->grid, (*target)->grid, kernel, stride)
                       : ConvolutionPlan::make_transposed(source->grid, kernel, stride));
        return c10::make_intrusive<ConvolutionPlanHolder>(
            target ? ConvolutionPlan::make(source->grid, (*target)->grid, kernel, stride)
                   : ConvolutionPlan::make(source->grid, kernel, stride));
    }

    Ptr transposed() const { return c10::make_intrusive<ConvolutionPlanHolder>(plan.transposed()); }
    GridBatchHolder::Ptr source_grid() const { return GridBatchHolder::wrap(plan.source_grid()); }
    GridBatchHolder::Ptr target_grid() const { return GridBatchHolder::wrap(plan.target_grid()); }
    bool is_identity() const { return plan.is_identity(); }
    c10::Device device() const { return torch_device(plan.source_grid().device()); }
    /// Neighbour map [num_target, kernel_volume] int32 on the plan's device (a view of the plan's memory).
    torch::Tensor target_map() const {
        const CoreScope scope(plan.source_grid().context()), target_scope(plan.target_grid().context());
        const sparsegrid::KernelMap& map = plan.target_map();  // a transposed plan derives it on first use
        return tensor_of(map.neighbour_map(), {map.num_target(), map.kernel_volume()}, torch::kInt32);
    }

    /// Weight [Cout, Cin, K0, K1, K2] against the plan's kernel size and the feature channels.
    void check_weight(const torch::Tensor& weight, int64_t in_channels, const char* op) const {
        if (weight.dim() != 5)
            fail(op, ": weight must have shape [Cout, Cin, K0, K1, K2], got ", weight.dim(), " dimensions");
        const Vec3i& k = plan.kernel_size();
        if (weight.size(1) != in_channels || weight.size(2) != k[0] || weight.size(3) != k[1] || weight.size(4) != k[2])
            fail(op, ": weight must have shape [Cout, ", in_channels, ", ", k[0], ", ", k[1], ", ", k[2], "], got [",
                 weight.size(0), ", ", weight.size(1), ", ", weight.size(2), ", ", weight.size(3), ", ", weight.size(4),
                 "]");
        check_device(weight, plan.source_grid().device(), op, "weight");
    }

    /// The context executions run on: the target grid's, allowing TF32 for float32 on CUDA exactly when
    /// PyTorch allows it for its own float32 matrix products (torch.backends.cuda.matmul.allow_tf32, or
    /// torch.set_float32_matmul_precision("high")).
    sparsegrid::Context execution_context(sparsegrid::DType dtype) const {
        sparsegrid::Context ctx = plan.target_grid().context();
        ctx.allow_tf32 = dtype == sparsegrid::DType::Float32 && ctx.device.is_cuda() &&
            at::globalContext().allowTF32CuBLAS();
        return ctx;
    }

    void check_features(const torch::Tensor& x, int64_t rows, const char* op, const char* name) const {
        if (x.dim() != 2) fail(op, ": ", name, " must have shape [N, C], got ", x.dim(), " dimensions");
        if (x.size(0) != rows) fail(op, ": ", name, " must have ", rows, " rows (one per voxel), got ", x.size(0));
        check_device(x, plan.source_grid().device(), op, name);
    }

    /// [N_target, Cout] on the plan's device. Output allocated by PyTorch on its current stream; no
    /// host sync (the same holds for both backward passes).
    torch::Tensor forward(torch::Tensor input, torch::Tensor weight) const {
        constexpr const char* op = "ConvolutionPlan.forward";
        const ConvolutionTimer timer;
        check_features(input, plan.source_grid().num_voxels(), op, "input");
        const sparsegrid::DType dtype = dtype_of(input, op, "input");
        if (weight.scalar_type() != input.scalar_type())
            fail(op, ": weight must have the dtype of input (", c10::toString(input.scalar_type()), "), got ",
                 c10::toString(weight.scalar_type()));
        check_weight(weight, input.size(1), op);
        const torch::Tensor x = input.contiguous(), w = weight.contiguous();
        torch::Tensor out = torch::empty({plan.target_grid().num_voxels(), w.size(0)}, x.options());
        const CoreScope scope(plan.source_grid().context()), target_scope(plan.target_grid().context());
        plan.forward(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.size(1), w.size(0), dtype, execution_context(dtype));
        return out;
    }

    torch::Tensor backward_input(torch::Tensor grad_output, torch::Tensor weight) const {
        constexpr const char* op = "ConvolutionPlan.backward_input";
        const ConvolutionTimer timer;
        check_features(grad_output, plan.target_grid().num_voxels(), op, "grad_output");
        const sparsegrid::DType dtype = dtype_of(grad_output, op, "grad_output");
        if (weight.scalar_type() != grad_output.scalar_type())
            fail(op, ": weight must have the dtype of grad_output (", c10::toString(grad_output.scalar_type()),
                 "), got ", c10::toString(weight.scalar_type()));
        check_weight(weight, weight.dim() == 5 ? weight.size(1) : 0, op);
        if (weight.size(0) != grad_output.size(1))
            fail(op, ": grad_output must have ", weight.size(0), " channels, got ", grad_output.size(1));
        const torch::Tensor g = grad_output.contiguous(), w = weight.contiguous();
        torch::Tensor out = torch::empty({plan.source_grid().num_voxels(), w.size(1)}, g.options());
        const CoreScope scope(plan.source_grid().context()), target_scope(plan.target_grid().context());
        plan.backward_input(g.data_ptr(), w.data_ptr(), out.data_ptr(), w.size(1), w.size(0), dtype,
                            execution_context(dtype));
        return out;
    }

    torch::Tensor backward_weight(torch::Tensor input, torch::Tensor grad_output) const {
        constexpr const char* op = "ConvolutionPlan.backward_weight";
        const ConvolutionTimer timer;
        check_features(input, plan.source_grid().num_voxels(), op, "input");
        check_features(grad_output, plan.target_grid().num_voxels(), op, "grad_output");
        const sparsegrid::DType dtype = dtype_of(input, op, "input");
        if (grad_output.scalar_type() != input.scalar_type())
            fail(op, ": grad_output must have the dtype of input (", c10::toString(input.scalar_type()), "), got ",
                 c10::toString(grad_output.scalar_type()));
        const torch::Tensor x = input.contiguous(), g = grad_output.contiguous();
        const Vec3i& k = plan.kernel_size();
        torch::Tensor out = torch::empty({g.size(1), x.size(1), k[0], k[1], k[2]}, x.options());
        const CoreScope scope(plan.source_grid().context()), target_scope(plan.target_grid().context());
        plan.backward_weight(x.data_ptr(), g.data_ptr(), out.data_ptr(), x.size(1), g.size(1), dtype,
                             execution_context(dtype));
        return out;
    }
};

/// Surface voxels of `batch_size` procedural closed shapes at `resolution` (shapes.h): ijk [N, 3] int32
/// and member offsets [B+1] int64 on the CPU, member-major (each member in the generator's order).
std::tuple<torch::Tensor, torch::Tensor> synthetic_surface_batch(int64_t batch_size, int64_t resolution, int64_t seed) {
    if (resolution < 1 || resolution > INT32_MAX)
        fail("synthetic_surface_batch: resolution must be >= 1, got ", resolution);
    const auto members = sparsegrid::synthetic_surface_batch(batch_size, static_cast<int32_t>(resolution),
                                                             static_cast<uint64_t>(seed));
    std::vector<int64_t> offsets{0};
    for (const auto& member : members) offsets.push_back(offsets.back() + static_cast<int64_t>(member.size()));
    torch::Tensor ijk = torch::empty({offsets.back(), 3}, torch::dtype(torch::kInt32));
    int32_t* out = ijk.data_ptr<int32_t>();
    for (const auto& member : members)
        for (const Vec3i& v : member) {
            out[0] = v[0];
            out[1] = v[1];
            out[2] = v[2];
            out += 3;
        }
    return {ijk, torch::tensor(offsets, torch::dtype(torch::kInt64))};
}

/// Sparse convolution with autograd, for C++ (LibTorch) and Python alike: gradients for the features
/// and the weight come from the plan's backward passes (deterministic, like the forward).
class SparseConvFunction : public torch::autograd::Function<SparseConvFunction> {
public:
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor features, torch::Tensor weight,
                                 c10::intrusive_ptr<ConvolutionPlanHolder> plan) {
        ctx->save_for_backward({features, weight});
        ctx->saved_data["plan"] = plan;
        return plan->forward(features, weight);
    }

    static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::tensor_list grads) {
        if (!grads[0].defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
        const auto saved = ctx->get_saved_variables();
        const auto plan = ctx->saved_data["plan"].toCustomClass<ConvolutionPlanHolder>();
        const torch::Tensor grad_output = grads[0].contiguous();
        torch::Tensor grad_features, grad_weight;
        if (ctx->needs_input_grad(0)) grad_features = plan->backward_input(grad_output, saved[1]);
        if (ctx->needs_input_grad(1)) grad_weight = plan->backward_weight(saved[0], grad_output);
        return {grad_features, grad_weight, torch::Tensor()};
    }
};

/// torch.ops.sparsegrid.sparse_conv(features [N_source, Cin], weight [Cout, Cin, K0, K1, K2], plan)
/// -> [N_target, Cout], differentiable in features and weight. Features and weight on the plan's
/// device, same dtype: float32 / float64, or float16 / bfloat16 on CUDA. When no gradient can be
/// asked for (grad mode off, or neither features nor weight requires one) it runs the forward pass
/// without an autograd node, as PyTorch's own operators do (saves the node's host cost at inference).
torch::Tensor sparse_conv(torch::Tensor features, torch::Tensor weight,
                          c10::intrusive_ptr<ConvolutionPlanHolder> plan) {
    if (!at::GradMode::is_enabled() || !(features.requires_grad() || weight.requires_grad()))
        return plan->forward(features, weight);
    return SparseConvFunction::apply(features, weight, plan);
}

/// A triangle mesh file (load_mesh): vertices [V, 3] float64 and faces [F, 3] int32, on the CPU.
std::tuple<torch::Tensor, torch::Tensor> load_mesh(std::string path) {
    const sparsegrid::TriangleMesh mesh = sparsegrid::load_mesh(path);
    torch::Tensor vertices = torch::empty({static_cast<int64_t>(mesh.vertices.size()), 3},
                                          torch::dtype(torch::kFloat64));
    torch::Tensor faces = torch::empty({static_cast<int64_t>(mesh.faces.size()), 3}, torch::dtype(torch::kInt32));
    for (size_t i = 0; i < mesh.vertices.size(); ++i)
        for (int a = 0; a < 3; ++a) vertices.data_ptr<double>()[3 * i + a] = mesh.vertices[i][a];
    for (size_t i = 0; i < mesh.faces.size(); ++i)
        for (int a = 0; a < 3; ++a) faces.data_ptr<int32_t>()[3 * i + a] = mesh.faces[i][a];
    return {vertices, faces};
}

TORCH_LIBRARY(sparsegrid, m) {
    m.def("synthetic_surface_batch", &synthetic_surface_batch);
    m.def("load_mesh", &load_mesh);

    m.class_<GridBatchHolder>("GridBatch")
        .def_static("from_ijk", &GridBatchHolder::from_ijk)
        .def_static("from_points", &GridBatchHolder::from_points)
        .def_static("from_mesh", &GridBatchHolder::from_mesh)
        .def("batch_size", &GridBatchHolder::batch_size)
        .def("num_voxels", &GridBatchHolder::num_voxels)
        .def("device", &GridBatchHolder::device)
        .def("to", &GridBatchHolder::to)
        .def("ijk", &GridBatchHolder::ijk)
        .def("offsets", &GridBatchHolder::offsets)
        .def("voxel_sizes", &GridBatchHolder::voxel_sizes)
        .def("origins", &GridBatchHolder::origins)
        .def("conv_grid", &GridBatchHolder::conv_grid)
        .def("conv_transpose_grid", &GridBatchHolder::conv_transpose_grid)
        .def("coarsened_grid", &GridBatchHolder::coarsened_grid)
        .def("refined_grid", &GridBatchHolder::refined_grid)
        .def("dilated_grid", &GridBatchHolder::dilated_grid)
        .def("pruned_grid", &GridBatchHolder::pruned_grid)
        .def("merged_grid", &GridBatchHolder::merged_grid)
        .def("ijk_to_index", &GridBatchHolder::ijk_to_index);
    m.class_<ConvolutionPlanHolder>("ConvolutionPlan")
        .def_static("make", &ConvolutionPlanHolder::make)
        .def("transposed", &ConvolutionPlanHolder::transposed)
        .def("source_grid", &ConvolutionPlanHolder::source_grid)
        .def("target_grid", &ConvolutionPlanHolder::target_grid)
        .def("is_identity", &ConvolutionPlanHolder::is_identity)
        .def("device", &ConvolutionPlanHolder::device)
        .def("target_map", &ConvolutionPlanHolder::target_map)
        .def("forward", &ConvolutionPlanHolder::forward)
        .def("backward_input", &ConvolutionPlanHolder::backward_input)
        .def("backward_weight", &ConvolutionPlanHolder::backward_weight);
    // After the classes: the schema of sparse_conv names ConvolutionPlan.
    m.def("sparse_conv", &sparse_conv);
    m.def("convolution_seconds", [] { return static_cast<double>(g_convolution_nanoseconds.load()) * 1e-9; });
    m.def("host_synchronizations", [] { return sparsegrid::host_synchronizations(); });
    m.def("cuda_backend_available", [] { return sparsegrid::cuda_backend_available(); });
    m.def("mesh_loading_available", [] { return sparsegrid::mesh_loading_available(); });
}

}  // namespace sparsegrid_torch
