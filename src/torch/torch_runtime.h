// The runtime glue of the PyTorch layer, shared by its bindings: devices, streams, PyTorch's
// allocators behind the core's Allocator interface, the context of work on a tensor's device, the
// ordering of core calls with PyTorch's current stream, and the argument checks every binding uses.
//
// Devices. Grids live on the device of the tensors they were built from (CPU or cuda:N); every tensor
// the layer returns lives there too, and every tensor argument must already be there (the error names
// the argument and both devices; nothing is moved silently). Host metadata (member offsets, voxel
// sizes, origins, boxes) may be given on the CPU, which costs no synchronisation.
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
// No CUDA header anywhere in the layer: it builds against a CPU-only LibTorch as well as a CUDA one;
// the CUDA stream handle comes from c10's device-generic stream interface.
#pragma once

#include <sparsegrid/buffer.h>
#include <sparsegrid/context.h>
#include <sparsegrid/types.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/Stream.h>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

namespace sparsegrid_torch {

using sparsegrid::Vec3i;

/// Raises sparsegrid::Error (a RuntimeError in Python) with the parts streamed together.
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
    std::ostringstream message;
    (message << ... << parts);
    throw sparsegrid::Error(message.str());
}

// ---- devices, contexts, streams ----------------------------------------------------------------------

c10::Device torch_device(const sparsegrid::Device& device);

/// A concrete device: "cuda" without an index means PyTorch's current CUDA device.
c10::Device concrete_device(c10::Device device);

/// The context of work on `tensor`'s device: PyTorch's allocators and, on CUDA, its current stream.
/// Raises, naming `name`, for a device sparsegrid does not run on or a CUDA tensor without the CUDA
/// backend.
sparsegrid::Context context_of(const torch::Tensor& tensor, const char* op, const char* name);

/// Runs one core call on `ctx` (a grid's context) in order with PyTorch's current stream, on ctx's
/// device (see "Streams" at the top). Create it after the inputs are prepared on the current stream
/// and right before the core call; it ends the ordering when it goes out of scope. No host sync.
class CoreScope {
public:
    explicit CoreScope(const sparsegrid::Context& ctx);
    ~CoreScope();
    CoreScope(const CoreScope&) = delete;
    CoreScope& operator=(const CoreScope&) = delete;

private:
    c10::OptionalDeviceGuard m_device_guard;
    std::optional<c10::Stream> m_core;
    std::optional<c10::Stream> m_caller;
};

// ---- argument checks and conversions ----------------------------------------------------------------

/// `t` must have `dtype` and `dim` dimensions.
void check_tensor(const torch::Tensor& t, const char* op, const char* name, torch::ScalarType dtype, int64_t dim);

/// `t` must live on `device` (the grid's).
void check_device(const torch::Tensor& t, const sparsegrid::Device& device, const char* op, const char* name);

/// A per-axis value (kernel size, stride, factor) from 1 or 3 entries, each in int32 range. The range
/// of the values themselves (>= 1, ...) is the core's to check.
Vec3i triple(const std::vector<int64_t>& values, const char* op, const char* name);

/// Host metadata (offsets, transforms) given as tensors: CPU (free) or the data's device (a copy to
/// the host, which synchronises). Returns a contiguous CPU tensor.
torch::Tensor host_metadata(const torch::Tensor& t, const torch::Tensor& data, const char* op, const char* name);

/// Coordinates given as host metadata: an integer tensor of shape [3] (one coordinate) or [B, 3], on
/// the CPU or a CUDA device (copied to the host, which synchronises), every entry in int32 range.
std::vector<Vec3i> host_coordinates(const torch::Tensor& t, const char* op, const char* name);

/// The element type of a convolution operand: float32 and float64 everywhere, float16 and bfloat16 on
/// CUDA (accumulated in float32 by the core).
sparsegrid::DType dtype_of(const torch::Tensor& t, const char* op, const char* name);

/// A tensor view of a core buffer, on the buffer's device; the tensor keeps the buffer alive.
template <typename T>
torch::Tensor tensor_of(const sparsegrid::Buffer<T>& buffer, std::vector<int64_t> shape, torch::ScalarType dtype) {
    const torch::TensorOptions options = torch::dtype(dtype).device(torch_device(buffer.device()));
    if (buffer.size() == 0) return torch::empty(shape, options);
    auto keep = std::make_shared<sparsegrid::Buffer<T>>(buffer);
    return torch::from_blob(
        buffer.data(), shape, [keep](void*) mutable { keep.reset(); }, options);
}

// ---- the convolution timer --------------------------------------------------------------------------

/// Adds the host time of its lifetime to convolution_seconds(). Put one in every convolution call
/// (forward and both backward passes).
class ConvolutionTimer {
public:
    ConvolutionTimer() : m_start(std::chrono::steady_clock::now()) {}
    ~ConvolutionTimer();
    ConvolutionTimer(const ConvolutionTimer&) = delete;
    ConvolutionTimer& operator=(const ConvolutionTimer&) = delete;

private:
    std::chrono::steady_clock::time_point m_start;
};

/// Seconds spent in convolution calls so far, process-wide: lets a training loop split its step time
/// without a profiler. Host time: on CUDA the calls only queue work, so this measures the launch side;
/// synchronise around a step (or use the profiler) for the device time.
double convolution_seconds();

/// For the backward passes of the layer's autograd functions, which are not themselves differentiable:
/// under create_graph (grad mode on during a backward pass) each defined tensor in `gradients` becomes
/// an alias whose node raises `message` when a later backward pass reaches it, in place of a gradient
/// that would silently count as a constant there. The node leads to `depends_on` (the function's saved
/// inputs and incoming gradients), so any backward pass through the gradients towards them reaches it.
/// Does nothing outside create_graph.
void refuse_second_backward(const std::vector<torch::Tensor>& depends_on, std::vector<torch::Tensor*> gradients,
                            const char* message);

}  // namespace sparsegrid_torch
