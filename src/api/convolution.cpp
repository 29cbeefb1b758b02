// ConvolutionPlan front end: construction from checked geometry, the shared maps, argument checks, and
// the choice of execution (row order, scatter, the weight gradient's map) before one backend call.
#include <sparsegrid/convolution.h>

#include "api/dispatch.h"
#include "api/front_end.h"
#include "api/validation.h"
#include "core/env.h"

#include <algorithm>
#include <climits>
#include <memory>
#include <mutex>
#include <optional>

namespace sparsegrid {

using detail::on_backend;
using detail::throw_error;

namespace detail {

/// Below this many rows a map is taken in voxel order on CUDA: its convolution is a few blocks whose
/// time is launch latency, and the order would add two launches and five allocations to every such
/// plan (the coarse levels of a network, small batches).
constexpr int64_t kRowOrderMinRows = 4096;

/// The smallest map that gets a row order: kRowOrderMinRows, or from SPARSEGRID_CONV_ORDER: "0" takes
/// every map in voxel order, "1" orders maps of any size (both for measurements and tests; results are
/// equal).
int64_t row_order_min_rows() {
    static const int64_t min_rows = [] {
        const std::string value = env_string("SPARSEGRID_CONV_ORDER");
        if (value == "0") return INT64_MAX;
        if (value == "1") return int64_t{1};
        return kRowOrderMinRows;
    }();
    return min_rows;
}

/// Whether the rows of a map are visited sorted by their sets of taps, so that the blocks of the CUDA
/// kernels skip the taps none of their rows has. The CPU takes rows in voxel order (each thread owns a
/// contiguous range, and an order would scatter its writes).
bool wants_row_order(Device device, int64_t rows, int32_t volume) {
    return !device.is_cpu() && rows >= row_order_min_rows() && volume > 1 && volume <= 64 && rows <= INT32_MAX;
}

/// Whether an execution whose output rows have at most one edge each runs over the other map, scattering
/// each product to its one output row: on CUDA unless SPARSEGRID_CONV_SCATTER is "0" (for measurements;
/// the results are the same). The CPU always gathers.
bool wants_scatter(Device device) {
    static const bool enabled = env_switch("SPARSEGRID_CONV_SCATTER", true);
    return !device.is_cpu() && enabled;
}

/// The two neighbour maps of a plan and its transpose: slot 0 has rows = the original plan's target,
/// slot 1 rows = its source. Slot 1 is derived from slot 0 on first use (no lookups).
struct PlanMaps {
    KernelMap rows_of_target;
    /// Every row of slot 1 (rows = the source's) has an edge at every tap: the generated target of a
    /// transposed plan with K = S, where each source voxel has all K^3 children. Its row order would be
    /// the voxel order (a stable sort of equal tap sets), so it is not built.
    bool complete_source_rows = false;
    mutable KernelMap rows_of_source;
    mutable std::once_flag source_built;
    mutable std::once_flag order_built[2];
    mutable Buffer<int32_t> order[2];
    mutable std::once_flag tap_major_built[2];
    mutable Buffer<int32_t> tap_major[2];

    const KernelMap& slot(int index) const {
        if (index == 0) return rows_of_target;
        std::call_once(source_built, [this] { rows_of_source = rows_of_target.transposed(); });
        return rows_of_source;
    }

    /// The row order of a slot's map (null: voxel order), built on first use on `ctx`'s stream.
    const int32_t* row_order(const char* op, int index, const Context& ctx) const {
        if (index == 1 && complete_source_rows) return nullptr;
        const KernelMap& map = slot(index);
        if (!wants_row_order(ctx.device, map.num_target(), map.kernel_volume())) return nullptr;
        std::call_once(order_built[index], [&] {
            order[index] = on_backend(op, ctx.device, [&](auto backend) {
                return backend.row_order(map.neighbour_map().data(), map.num_target(), map.kernel_volume(), ctx);
            });
        });
        return order[index].data();
    }

    /// A slot's map tap by tap (null where not wanted), built on first use on `ctx`'s stream: the CUDA
    /// weight gradient compacts each tap's edges from it with contiguous reads.
    /// Only for the dtypes that run on tensor cores (float16, bfloat16, float32 with TF32 allowed).
    const int32_t* tap_major_map(const char* op, int index, DType dtype, const Context& ctx) const {
        const KernelMap& map = slot(index);
        const bool tensor_cores = dtype == DType::Float16 || dtype == DType::BFloat16 ||
            (dtype == DType::Float32 && ctx.allow_tf32);
        if (ctx.device.is_cpu() || !tensor_cores || map.kernel_volume() < 2 || map.kernel_volume() > 374)
            return nullptr;
        std::call_once(tap_major_built[index], [&] {
            tap_major[index] = on_backend(op, ctx.device, [&](auto backend) {
                return backend.tap_major_map(map.neighbour_map().data(), map.num_target(), map.kernel_volume(), ctx);
            });
        });
        return tap_major[index].data();
    }
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

const char* dtype_name(DType dtype) {
    switch (dtype) {
    case DType::Float32:
        return "float32";
    case DType::Float64:
        return "float64";
    case DType::Float16:
        return "float16";
    case DType::BFloat16:
        return "bfloat16";
    }
    return "an invalid dtype";
}

void check_dtype(const char* op, DType dtype, Device device) {
    const int value = static_cast<int>(dtype);
    if (value < 0 || value > 3) throw_error(op, ": dtype has the invalid value ", value);
    if (device.is_cpu() && (dtype == DType::Float16 || dtype == DType::BFloat16))
        throw_error(op, ": float16 and bfloat16 run on CUDA only; on the CPU use float32 or float64");
}

void check_execution(const char* op, int64_t in_channels, int64_t out_channels, DType dtype, DType weight_dtype,
                     const Context& ctx, Device plan_device) {
    check_channels(op, in_channels, out_channels);
    if (ctx.device != plan_device)
        throw_error(op, ": the context's device ", ctx.device.str(), " differs from the plan's device ",
                    plan_device.str());
    check_dtype(op, dtype, plan_device);
    if (weight_dtype == dtype) return;
    const int value = static_cast<int>(weight_dtype);
    if (value < 0 || value > 3) throw_error(op, ": weight_dtype has the invalid value ", value);
    if (weight_dtype != DType::Float32 || (dtype != DType::Float16 && dtype != DType::BFloat16))
        throw_error(op, ": weight_dtype must be dtype (", dtype_name(dtype),
                    ") or float32 with float16 / bfloat16 features, got ", dtype_name(weight_dtype));
}

std::shared_ptr<detail::PlanMaps> maps_of(KernelMap map) {
    auto maps = std::make_shared<detail::PlanMaps>();
    maps->rows_of_target = std::move(map);
    return maps;
}

using detail::CachedPlan;

/// The plan of (kernel size, stride, direction, target) kept on `source`, if any. Entries whose given
/// target grid is gone are dropped first.
std::optional<CachedPlan> find_plan(const GridBatch& source, const Vec3i& kernel_size, const Vec3i& stride,
                                    MapDirection direction, CachedPlan::Target kind, const GridBatch* target) {
    detail::GridCache& cache = source.storage().cache;
    const std::lock_guard<std::mutex> lock(cache.plan_mutex);
    auto& plans = cache.plans;
    plans.erase(
        std::remove_if(plans.begin(), plans.end(),
                       [](const CachedPlan& p) { return p.kind == CachedPlan::Target::Given && p.target.expired(); }),
        plans.end());
    const int code = direction == MapDirection::Forward ? 0 : 1;
    for (const CachedPlan& p : plans)
        if (p.kernel_size == kernel_size && p.stride == stride && p.direction == code && p.kind == kind &&
            (kind != CachedPlan::Target::Given || p.target.lock().get() == &target->storage()))
            return p;
    return std::nullopt;
}

/// Keeps a plan's maps (and generated target) on its source grid: the next make() of the same plan
/// returns them. Two threads building the same plan at once keep the first.
std::shared_ptr<detail::PlanMaps> keep_plan(const GridBatch& source, const Vec3i& kernel_size, const Vec3i& stride,
                                            MapDirection direction, CachedPlan::Target kind, const GridBatch* target,
                                            std::shared_ptr<detail::PlanMaps> maps) {
    if (auto kept = find_plan(source, kernel_size, stride, direction, kind, target)) return kept->maps;
    CachedPlan plan;
    plan.kernel_size = kernel_size;
    plan.stride = stride;
    plan.direction = direction == MapDirection::Forward ? 0 : 1;
    plan.kind = kind;
    if (kind == CachedPlan::Target::Given) plan.target = target->storage().weak_from_this();
    if (kind == CachedPlan::Target::Generated) plan.generated = target->storage().shared_from_this();
    plan.maps = maps;
    detail::GridCache& cache = source.storage().cache;
    const std::lock_guard<std::mutex> lock(cache.plan_mutex);
    cache.plans.push_back(std::move(plan));
    return maps;
}

/// Target kind of a plan from `source` to an existing `target`.
CachedPlan::Target kind_of(const GridBatch& source, const GridBatch& target) {
    return &source.storage() == &target.storage() ? CachedPlan::Target::Source : CachedPlan::Target::Given;
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

ConvolutionPlan ConvolutionPlan::make_generating(const char* op, const GridBatch& source, const Vec3i& kernel_size,
                                                 const Vec3i& stride, MapDirection direction) {
    const detail::ConvGeometry g = detail::make_conv_geometry(op, kernel_size, stride);
    // K = S = 1 generates the source itself: the identity plan, a plain matrix product without a map.
    if (g.is_uniform(1, 1)) return assemble(source, source, kernel_size, stride, direction, nullptr);
    constexpr auto kGenerated = CachedPlan::Target::Generated;
    if (auto kept = find_plan(source, kernel_size, stride, direction, kGenerated, nullptr))
        return assemble(source, GridBatch(kept->generated), kernel_size, stride, direction, kept->maps);
    GridAndMap built = direction == MapDirection::Forward ? detail::build_conv_grid_and_map(op, source, g)
                                                          : detail::build_conv_transpose_grid_and_map(op, source, g);
    std::shared_ptr<detail::PlanMaps> made = maps_of(std::move(built.map));
    // K = S transposed: output S*c + tap - pb is one-to-one in (c, tap), and the target holds every output.
    made->complete_source_rows = direction == MapDirection::Transposed && kernel_size == stride;
    auto maps = keep_plan(source, kernel_size, stride, direction, kGenerated, &built.grid, std::move(made));
    return assemble(source, std::move(built.grid), kernel_size, stride, direction, std::move(maps));
}

ConvolutionPlan ConvolutionPlan::make_to(const char* op, const GridBatch& source, const GridBatch& target,
                                         const Vec3i& kernel_size, const Vec3i& stride, MapDirection direction) {
    const detail::ConvGeometry g = detail::make_conv_geometry(op, kernel_size, stride);
    if (g.is_uniform(1, 1) && &source.storage() == &target.storage())
        return assemble(source, target, kernel_size, stride, direction, nullptr);
    const CachedPlan::Target kind = kind_of(source, target);
    if (auto kept = find_plan(source, kernel_size, stride, direction, kind, &target))
        return assemble(source, target, kernel_size, stride, direction, kept->maps);
    auto maps = keep_plan(source, kernel_size, stride, direction, kind, &target,
                          maps_of(detail::build_neighbour_map(op, source, target, g, direction)));
    return assemble(source, target, kernel_size, stride, direction, std::move(maps));
}

ConvolutionPlan ConvolutionPlan::make(const GridBatch& source, const Vec3i& kernel_size, const Vec3i& stride) {
    return make_generating("ConvolutionPlan::make", source, kernel_size, stride, MapDirection::Forward);
}

ConvolutionPlan ConvolutionPlan::make(const GridBatch& source, const GridBatch& target, const Vec3i& kernel_size,
                                      const Vec3i& stride) {
    return make_to("ConvolutionPlan::make", source, target, kernel_size, stride, MapDirection::Forward);
}

ConvolutionPlan ConvolutionPlan::make_transposed(const GridBatch& source, const Vec3i& kernel_size,
                                                 const Vec3i& stride) {
    return make_generating("ConvolutionPlan::make_transposed", source, kernel_size, stride, MapDirection::Transposed);
}

ConvolutionPlan ConvolutionPlan::make_transposed(const GridBatch& source, const GridBatch& target,
                                                 const Vec3i& kernel_size, const Vec3i& stride) {
    return make_to("ConvolutionPlan::make_transposed", source, target, kernel_size, stride, MapDirection::Transposed);
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
    constexpr const char* op = "ConvolutionPlan::prepare";
    if (ctx.device != m_target.device())
        throw_error(op, ": the context's device ", ctx.device.str(), " differs from the plan's device ",
                    m_target.device().str());
    if (!m_maps) return;
    if (!mirrored_maps()) m_maps->slot(1);  // else the second map is never needed
    // The row orders the forward pass and the input gradient read, as execute_map picks them (the order
    // of a map no execution reads, such as the fine rows of a generative K = S plan, whose forward pass
    // scatters over the coarse rows, is not built).
    for (const bool input_gradient : {false, true}) {
        const auto [slot, single_edge_rows] = pass_map(input_gradient);
        m_maps->row_order(op, read_slot(slot, single_edge_rows && detail::wants_scatter(ctx.device)), ctx);
    }
}

bool ConvolutionPlan::mirrored_maps() const {
    return m_maps && &m_source.storage() == &m_target.storage() && m_stride == Vec3i{1, 1, 1} &&
        m_kernel_size[0] % 2 == 1 && m_kernel_size[1] % 2 == 1 && m_kernel_size[2] % 2 == 1;
}

std::pair<int, bool> ConvolutionPlan::pass_map(bool input_gradient) const {
    // With K = S every fine voxel has at most one coarse neighbour: the target's rows when transposed
    // (forward pass), the source's when not (input gradient).
    const MapDirection fine_rows = input_gradient ? MapDirection::Forward : MapDirection::Transposed;
    return {m_flipped != input_gradient ? 1 : 0, m_kernel_size == m_stride && m_direction == fine_rows};
}

int ConvolutionPlan::read_slot(int slot, bool scatter) const {
    if (slot == 1 && mirrored_maps()) slot = 0;
    return scatter ? 1 - slot : slot;
}

void ConvolutionPlan::execute_map(const char* op, int slot, int64_t rows, int64_t x_rows, bool single_edge_rows,
                                  const void* x, const void* weight, bool transpose_weight, void* out,
                                  int64_t x_channels, int64_t out_channels, DType dtype, DType weight_dtype,
                                  const Context& ctx) const {
    detail::MapConvolution args;
    args.reverse_taps = slot == 1 && mirrored_maps();
    args.rows = rows;
    args.out_rows = rows;
    args.volume = m_maps ? kernel_volume() : 1;
    args.x = x;
    args.x_rows = x_rows;
    args.weight = weight;
    args.transpose_weight = transpose_weight;
    args.out = out;
    args.x_channels = x_channels;
    args.out_channels = out_channels;
    args.dtype = dtype;
    args.weight_dtype = weight_dtype;
    if (m_maps) {
        // Scattering: over the other map (rows = the input's), each product written to its one output row.
        args.scatter = single_edge_rows && detail::wants_scatter(ctx.device);
        const int read = read_slot(slot, args.scatter);
        const KernelMap& map = m_maps->slot(read);
        args.map = map.neighbour_map().data();
        args.order = m_maps->row_order(op, read, ctx);
        if (args.scatter) args.rows = map.num_target();
        args.covers_output = args.scatter && read == 1 && m_maps->complete_source_rows &&
            map.num_target() * int64_t{args.volume} == args.out_rows;
    }
    on_backend(op, ctx.device, [&](auto backend) { backend.map_convolution(args, ctx); });
}

void ConvolutionPlan::forward(const void* input, const void* weight, void* output, int64_t in_channels,
                              int64_t out_channels, DType dtype, const Context& ctx) const {
    forward(input, weight, output, in_channels, out_channels, dtype, dtype, ctx);
}

void ConvolutionPlan::forward(const void* input, const void* weight, void* output, int64_t in_channels,
                              int64_t out_channels, DType dtype, DType weight_dtype, const Context& ctx) const {
    constexpr const char* op = "ConvolutionPlan::forward";
    check_execution(op, in_channels, out_channels, dtype, weight_dtype, ctx, m_target.device());
    check_pointer(op, "input", input, m_source.num_voxels(), in_channels);
    check_pointer(op, "weight", weight, out_channels, in_channels * kernel_volume());
    check_pointer(op, "output", output, m_target.num_voxels(), out_channels);
    const auto [slot, single_edge_rows] = pass_map(false);
    execute_map(op, slot, m_target.num_voxels(), m_source.num_voxels(), single_edge_rows, input, weight, false, output,
                in_channels, out_channels, dtype, weight_dtype, ctx);
}

void ConvolutionPlan::backward_input(const void* grad_output, const void* weight, void* grad_input, int64_t in_channels,
                                     int64_t out_channels, DType dtype, const Context& ctx) const {
    backward_input(grad_output, weight, grad_input, in_channels, out_channels, dtype, dtype, ctx);
}

void ConvolutionPlan::backward_input(const void* grad_output, const void* weight, void* grad_input, int64_t in_channels,
                                     int64_t out_channels, DType dtype, DType weight_dtype, const Context& ctx) const {
    constexpr const char* op = "ConvolutionPlan::backward_input";
    check_execution(op, in_channels, out_channels, dtype, weight_dtype, ctx, m_target.device());
    check_pointer(op, "grad_output", grad_output, m_target.num_voxels(), out_channels);
    check_pointer(op, "weight", weight, out_channels, in_channels * kernel_volume());
    check_pointer(op, "grad_input", grad_input, m_source.num_voxels(), in_channels);
    const auto [slot, single_edge_rows] = pass_map(true);
    execute_map(op, slot, m_source.num_voxels(), m_target.num_voxels(), single_edge_rows, grad_output, weight, true,
                grad_input, out_channels, in_channels, dtype, weight_dtype, ctx);
}

void ConvolutionPlan::backward_weight(const void* input, const void* grad_output, void* grad_weight,
                                      int64_t in_channels, int64_t out_channels, DType dtype,
                                      const Context& ctx) const {
    backward_weight(input, grad_output, grad_weight, in_channels, out_channels, dtype, dtype, ctx);
}

void ConvolutionPlan::backward_weight(const void* input, const void* grad_output, void* grad_weight,
                                      int64_t in_channels, int64_t out_channels, DType dtype, DType weight_dtype,
                                      const Context& ctx) const {
    constexpr const char* op = "ConvolutionPlan::backward_weight";
    check_execution(op, in_channels, out_channels, dtype, weight_dtype, ctx, m_target.device());
    check_pointer(op, "input", input, m_source.num_voxels(), in_channels);
    check_pointer(op, "grad_output", grad_output, m_target.num_voxels(), out_channels);
    check_pointer(op, "grad_weight", grad_weight, out_channels, in_channels * kernel_volume());
    detail::MapWeightGradient args;
    args.rows = m_target.num_voxels();
    args.gathered_rows = m_source.num_voxels();
    args.volume = m_maps ? kernel_volume() : 1;
    args.x = input;
    args.grad = grad_output;
    args.grad_weight = grad_weight;
    args.in_channels = in_channels;
    args.out_channels = out_channels;
    args.dtype = dtype;
    args.grad_weight_dtype = weight_dtype;
    if (m_maps && !ctx.device.is_cpu() && m_source.num_voxels() < m_target.num_voxels()) {
        // CUDA runs over whichever map has fewer rows: every edge is in both, but its kernels scan each
        // row once per tap, so e.g. the generative k2s2 (8 fine rows of one edge per coarse row of 8)
        // takes the coarse rows. The source map is derived when missing (the input gradient needs it
        // anyway). The CPU sums over target rows in order.
        args.map = source_map().neighbour_map().data();
        args.tap_major = m_maps->tap_major_map(op, m_flipped ? 0 : 1, dtype, ctx);
        args.rows = m_source.num_voxels();
        args.gathered_rows = m_target.num_voxels();
        args.rows_are_source = true;
    } else if (m_maps) {
        args.map = target_map().neighbour_map().data();
        args.tap_major = m_maps->tap_major_map(op, m_flipped ? 1 : 0, dtype, ctx);
    }
    on_backend(op, ctx.device, [&](auto backend) { backend.map_weight_gradient(args, ctx); });
}

namespace {

/// The device whose backend owns the tensor-core engine: CUDA where the build has it.
Device engine_device() {
#if defined(SPARSEGRID_WITH_CUDA)
    return Device::cuda(0);
#else
    return Device::cpu();
#endif
}

}  // namespace

std::vector<std::string> convolution_engine_configurations() {
    return detail::on_backend("convolution_engine_configurations", engine_device(),
                              [](auto backend) { return backend.engine_configurations(); });
}

void set_convolution_engine_tuning(bool enabled, const std::string& file) {
    detail::on_backend("set_convolution_engine_tuning", engine_device(),
                       [&](auto backend) { backend.set_engine_tuning(enabled, file); });
}

void set_convolution_engine_configuration(const std::string& name) {
    detail::on_backend("set_convolution_engine_configuration", engine_device(),
                       [&](auto backend) { backend.force_engine_configuration(name); });
}

}  // namespace sparsegrid
