// ConvolutionPlan: construction, the shared maps, argument checks and dispatch.
#include <sparsegrid/convolution.h>

#include "core/backend.h"
#include "core/checks.h"
#include "cpu/convolution_cpu.h"
#if defined(SPARSEGRID_WITH_CUDA)
#include "cuda/convolution_cuda.h"
#endif

#include <mutex>

namespace sparsegrid {

using detail::throw_error;

namespace detail {

/// The two neighbour maps of a plan and its transpose: slot 0 has rows = the original plan's target,
/// slot 1 rows = its source. Slot 1 is derived from slot 0 on first use (no lookups).
struct PlanMaps {
    KernelMap rows_of_target;
    mutable KernelMap rows_of_source;
    mutable std::once_flag source_built;

    const KernelMap& slot(int index) const {
        if (index == 0) return rows_of_target;
        std::call_once(source_built, [this] { rows_of_source = rows_of_target.transposed(); });
        return rows_of_source;
    }

#if defined(SPARSEGRID_WITH_CUDA)
    /// The CUDA row order of a slot's map (see cuda::row_order), built on first use on `ctx`'s stream.
    const int32_t* row_order(int index, const Context& ctx) const {
        std::call_once(order_built[index], [&] {
            const KernelMap& map = slot(index);
            order[index] = cuda::row_order(map.neighbour_map().data(), map.num_target(), map.kernel_volume(), ctx);
        });
        return order[index].data();
    }
    mutable std::once_flag order_built[2];
    mutable Buffer<int32_t> order[2];
#endif
};

}  // namespace detail

namespace {

void check_channels(const char* op, int64_t in_channels, int64_t out_channels) {
    if (in_channels < 1) throw_error(op, ": in_channels must be >= 1, got ", in_channels);
    if (out_channels < 1) throw_error(op, ": out_channels must be >= 1, got ", out_channels);
}

void check_pointer(const char* op, const char* name, const void* data, int64_t rows, int64_t columns) {
    if (data == nullptr && rows > 0 && columns > 0)
        throw_error(op, ": ", name, " is null but must hold ", rows, " x ", columns, " values");
}

void check_dtype(const char* op, DType dtype, Device device) {
    const int value = static_cast<int>(dtype);
    if (value < 0 || value > 3) throw_error(op, ": dtype has the invalid value ", value);
    if (device.is_cpu() && (dtype == DType::Float16 || dtype == DType::BFloat16))
        throw_error(op, ": float16 and bfloat16 run on CUDA only; on the CPU use float32 or float64");
}

void check_execution(const char* op, int64_t in_channels, int64_t out_channels, DType dtype, const Context& ctx,
                     Device plan_device) {
    check_channels(op, in_channels, out_channels);
    if (ctx.device != plan_device)
        throw_error(op, ": the context's device ", ctx.device.str(), " differs from the plan's device ",
                    plan_device.str());
    check_dtype(op, dtype, plan_device);
}

}  // namespace

namespace {

std::shared_ptr<detail::PlanMaps> maps_of(KernelMap map) {
    auto maps = std::make_shared<detail::PlanMaps>();
    maps->rows_of_target = std::move(map);
    return maps;
}

}  // namespace

ConvolutionPlan ConvolutionPlan::assemble(GridBatch source, GridBatch target, const Vec3i& kernel_size,
                                          const Vec3i& stride, MapDirection direction,
                                          std::shared_ptr<detail::PlanMaps> maps) {
    ConvolutionPlan plan;
    plan.m_source = std::move(source);
    plan.m_target = std::move(target);
    plan.m_kernel_size = kernel_size;
    plan.m_stride = stride;
    plan.m_direction = direction;
    plan.m_maps = std::move(maps);
    return plan;
}

ConvolutionPlan ConvolutionPlan::make(const GridBatch& source, const Vec3i& kernel_size, const Vec3i& stride) {
    if (detail::make_conv_geometry("ConvolutionPlan::make", kernel_size, stride).is_uniform(1, 1))
        return make(source, source, kernel_size, stride);
    GridAndMap built = conv_grid_and_map(source, kernel_size, stride);
    return assemble(source, std::move(built.grid), kernel_size, stride, MapDirection::Forward,
                    maps_of(std::move(built.map)));
}

ConvolutionPlan ConvolutionPlan::make(const GridBatch& source, const GridBatch& target, const Vec3i& kernel_size,
                                      const Vec3i& stride) {
    const detail::ConvGeometry geometry = detail::make_conv_geometry("ConvolutionPlan::make", kernel_size, stride);
    // A grid onto itself with K = S = 1 is a plain matrix product: no map.
    if (geometry.is_uniform(1, 1) && &source.storage() == &target.storage())
        return assemble(source, target, kernel_size, stride, MapDirection::Forward, nullptr);
    return assemble(source, target, kernel_size, stride, MapDirection::Forward,
                    maps_of(neighbour_map(source, target, kernel_size, stride, MapDirection::Forward)));
}

ConvolutionPlan ConvolutionPlan::make_transposed(const GridBatch& source, const Vec3i& kernel_size,
                                                 const Vec3i& stride) {
    if (detail::make_conv_geometry("ConvolutionPlan::make_transposed", kernel_size, stride).is_uniform(1, 1))
        return make_transposed(source, source, kernel_size, stride);
    GridAndMap built = conv_transpose_grid_and_map(source, kernel_size, stride);
    return assemble(source, std::move(built.grid), kernel_size, stride, MapDirection::Transposed,
                    maps_of(std::move(built.map)));
}

ConvolutionPlan ConvolutionPlan::make_transposed(const GridBatch& source, const GridBatch& target,
                                                 const Vec3i& kernel_size, const Vec3i& stride) {
    const detail::ConvGeometry geometry = detail::make_conv_geometry("ConvolutionPlan::make_transposed", kernel_size,
                                                                     stride);
    if (geometry.is_uniform(1, 1) && &source.storage() == &target.storage())
        return assemble(source, target, kernel_size, stride, MapDirection::Transposed, nullptr);
    return assemble(source, target, kernel_size, stride, MapDirection::Transposed,
                    maps_of(neighbour_map(source, target, kernel_size, stride, MapDirection::Transposed)));
}

ConvolutionPlan ConvolutionPlan::transposed() const {
    ConvolutionPlan plan = *this;
    std::swap(plan.m_source, plan.m_target);
    plan.m_direction = m_direction == MapDirection::Forward ? MapDirection::Transposed : MapDirection::Forward;
    plan.m_flipped = !m_flipped;
    return plan;
}

const KernelMap& ConvolutionPlan::target_map() const {
    if (!m_maps) throw_error("ConvolutionPlan::target_map: the identity plan (K = S = 1, same grid) has no map");
    return m_maps->slot(m_flipped ? 1 : 0);
}

const KernelMap& ConvolutionPlan::source_map() const {
    if (!m_maps) throw_error("ConvolutionPlan::source_map: the identity plan (K = S = 1, same grid) has no map");
    return m_maps->slot(m_flipped ? 0 : 1);
}

void ConvolutionPlan::forward(const void* input, const void* weight, void* output, int64_t in_channels,
                              int64_t out_channels, DType dtype) const {
    forward(input, weight, output, in_channels, out_channels, dtype, m_target.context());
}

void ConvolutionPlan::backward_input(const void* grad_output, const void* weight, void* grad_input, int64_t in_channels,
                                     int64_t out_channels, DType dtype) const {
    backward_input(grad_output, weight, grad_input, in_channels, out_channels, dtype, m_target.context());
}

void ConvolutionPlan::backward_weight(const void* input, const void* grad_output, void* grad_weight,
                                      int64_t in_channels, int64_t out_channels, DType dtype) const {
    backward_weight(input, grad_output, grad_weight, in_channels, out_channels, dtype, m_target.context());
}

void ConvolutionPlan::prepare() const { prepare(m_target.context()); }

void ConvolutionPlan::prepare(const Context& ctx) const {
    if (ctx.device != m_target.device())
        throw_error("ConvolutionPlan::prepare: the context's device ", ctx.device.str(),
                    " differs from the plan's device ", m_target.device().str());
    if (!m_maps) return;
    m_maps->slot(1);
#if defined(SPARSEGRID_WITH_CUDA)
    if (!ctx.device.is_cpu()) {
        m_maps->row_order(0, ctx);
        m_maps->row_order(1, ctx);
    }
#endif
}

void ConvolutionPlan::execute_map(const char* op, int slot, int64_t rows, bool single_edge_rows, const void* x,
                                  const void* weight, bool transpose_weight, void* out, int64_t x_channels,
                                  int64_t out_channels, DType dtype, const Context& ctx) const {
    const int32_t* map = m_maps ? m_maps->slot(slot).neighbour_map().data() : nullptr;
    const int32_t volume = m_maps ? kernel_volume() : 1;
    if (ctx.device.is_cpu()) {
        detail::cpu::map_convolution(map, rows, volume, x, weight, transpose_weight, out, x_channels, out_channels,
                                     dtype, ctx);
        return;
    }
#if defined(SPARSEGRID_WITH_CUDA)
    (void)op;
    if (m_maps && single_edge_rows && detail::cuda::scatter_enabled()) {
        // Over the other map (rows = the input's), each product written to its one output row.
        const KernelMap& input_rows = m_maps->slot(1 - slot);
        detail::cuda::map_convolution(input_rows.neighbour_map().data(), m_maps->row_order(1 - slot, ctx),
                                      input_rows.num_target(), volume, x, weight, transpose_weight, out, x_channels,
                                      out_channels, dtype, true, rows, ctx);
        return;
    }
    const int32_t* order = m_maps ? m_maps->row_order(slot, ctx) : nullptr;
    detail::cuda::map_convolution(map, order, rows, volume, x, weight, transpose_weight, out, x_channels, out_channels,
                                  dtype, false, rows, ctx);
#else
    detail::throw_backend_unavailable(op, ctx.device);
#endif
}

void ConvolutionPlan::forward(const void* input, const void* weight, void* output, int64_t in_channels,
                              int64_t out_channels, DType dtype, const Context& ctx) const {
    constexpr const char* op = "ConvolutionPlan::forward";
    check_execution(op, in_channels, out_channels, dtype, ctx, m_target.device());
    check_pointer(op, "input", input, m_source.num_voxels(), in_channels);
    check_pointer(op, "weight", weight, out_channels, in_channels * kernel_volume());
    check_pointer(op, "output", output, m_target.num_voxels(), out_channels);
    // With K = S every fine voxel has at most one coarse neighbour: the target's rows when transposed.
    const bool single_edge_rows = m_kernel_size == m_stride && m_direction == MapDirection::Transposed;
    execute_map(op, m_flipped ? 1 : 0, m_target.num_voxels(), single_edge_rows, input, weight, false, output,
                in_channels, out_channels, dtype, ctx);
}

void ConvolutionPlan::backward_input(const void* grad_output, const void* weight, void* grad_input, int64_t in_channels,
                                     int64_t out_channels, DType dtype, const Context& ctx) const {
    constexpr const char* op = "ConvolutionPlan::backward_input";
    check_execution(op, in_channels, out_channels, dtype, ctx, m_target.device());
    check_pointer(op, "grad_output", grad_output, m_target.num_voxels(), out_channels);
    check_pointer(op, "weight", weight, out_channels, in_channels * kernel_volume());
    check_pointer(op, "grad_input", grad_input, m_source.num_voxels(), in_channels);
    const bool single_edge_rows = m_kernel_size == m_stride && m_direction == MapDirection::Forward;
    execute_map(op, m_flipped ? 0 : 1, m_source.num_voxels(), single_edge_rows, grad_output, weight, true, grad_input,
                out_channels, in_channels, dtype, ctx);
}

void ConvolutionPlan::backward_weight(const void* input, const void* grad_output, void* grad_weight,
                                      int64_t in_channels, int64_t out_channels, DType dtype,
                                      const Context& ctx) const {
    constexpr const char* op = "ConvolutionPlan::backward_weight";
    check_execution(op, in_channels, out_channels, dtype, ctx, m_target.device());
    check_pointer(op, "input", input, m_source.num_voxels(), in_channels);
    check_pointer(op, "grad_output", grad_output, m_target.num_voxels(), out_channels);
    check_pointer(op, "grad_weight", grad_weight, out_channels, in_channels * kernel_volume());
    const int32_t* map = m_maps ? target_map().neighbour_map().data() : nullptr;
    const int32_t volume = m_maps ? kernel_volume() : 1;
    if (ctx.device.is_cpu()) {
        detail::cpu::map_weight_gradient(map, m_target.num_voxels(), volume, input, grad_output, grad_weight,
                                         in_channels, out_channels, dtype, ctx);
        return;
    }
#if defined(SPARSEGRID_WITH_CUDA)
    // Over whichever map has fewer rows: every edge is in both, but the CUDA kernels scan each row once
    // per tap, so e.g. the generative k2s2 (8 fine rows of one edge per coarse row of 8) takes the coarse
    // rows. The source map is derived when missing (the input gradient needs it anyway).
    if (m_maps && m_source.num_voxels() < m_target.num_voxels()) {
        detail::cuda::map_weight_gradient(source_map().neighbour_map().data(), m_source.num_voxels(), volume, true,
                                          input, grad_output, grad_weight, in_channels, out_channels, dtype, ctx);
        return;
    }
    detail::cuda::map_weight_gradient(map, m_target.num_voxels(), volume, false, input, grad_output, grad_weight,
                                      in_channels, out_channels, dtype, ctx);
#else
    detail::throw_backend_unavailable(op, ctx.device);
#endif
}

}  // namespace sparsegrid
