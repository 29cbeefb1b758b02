// KernelMap front end: validation, the choice of algorithm (the symmetric stride-1 map, the subdivision
// map of K = S = 2), then one backend call.
#include <sparsegrid/kernel_map.h>

#include "api/dispatch.h"
#include "api/front_end.h"
#include "api/validation.h"
#include "core/env.h"

#include <climits>

namespace sparsegrid {

using detail::on_backend;
using detail::throw_error;

namespace {

/// SPARSEGRID_SYMMETRIC_MAPS=0 turns the symmetric shortcut off (for measurements; results are equal).
bool symmetry_enabled() {
    static const bool enabled = detail::env_switch("SPARSEGRID_SYMMETRIC_MAPS", true);
    return enabled;
}

/// A stride-1 map of a grid onto itself with odd kernel sizes is symmetric: the offset of tap t is minus
/// the offset of tap V-1-t, so map[n][t] = m exactly when map[m][V-1-t] = n.
bool is_symmetric(const GridBatch& source, const GridBatch& target, const detail::ConvGeometry& g) {
    if (&source.storage() != &target.storage() || !symmetry_enabled()) return false;
    for (int a = 0; a < 3; ++a)
        if (g.stride[a] != 1 || g.kernel[a] % 2 == 0) return false;
    return true;
}

}  // namespace

KernelMap::KernelMap(Buffer<int32_t> neighbour_map, int64_t num_source, int64_t num_target, Vec3i kernel_size,
                     Vec3i stride, MapDirection direction, Context ctx)
    : m_neighbour_map(std::move(neighbour_map)),
      m_num_source(num_source),
      m_num_target(num_target),
      m_kernel_size(kernel_size),
      m_stride(stride),
      m_direction(direction),
      m_context(ctx) {}

PairLists KernelMap::pairs_by_tap(const Context& ctx) const {
    return on_backend("KernelMap::pairs_by_tap", ctx.device, [&](auto backend) {
        return backend.pairs_by_tap(m_neighbour_map, m_num_target, kernel_volume(), ctx);
    });
}

PairLists KernelMap::pairs_by_tap() const { return pairs_by_tap(m_context); }

KernelMap KernelMap::transposed(const Context& ctx) const {
    constexpr const char* op = "KernelMap::transposed";
    if (m_num_target > INT32_MAX)
        throw_error(op, ": the map has ", m_num_target,
                    " targets; int32 neighbour maps need fewer than 2^31 source voxels");
    Buffer<int32_t> map = on_backend(op, ctx.device, [&](auto backend) {
        return backend.transpose_map(m_neighbour_map, m_num_target, m_num_source, kernel_volume(), ctx);
    });
    const MapDirection flipped = m_direction == MapDirection::Forward ? MapDirection::Transposed
                                                                      : MapDirection::Forward;
    return KernelMap(std::move(map), m_num_target, m_num_source, m_kernel_size, m_stride, flipped, ctx);
}

KernelMap KernelMap::transposed() const { return transposed(m_context); }

int64_t KernelMap::num_edges() const {
    return on_backend("KernelMap::num_edges", m_context.device,
                      [&](auto backend) { return backend.count_edges(m_neighbour_map, m_context); });
}

namespace detail {

KernelMap build_neighbour_map(const char* op, const GridBatch& source, const GridBatch& target, const ConvGeometry& g,
                              MapDirection direction) {
    if (source.batch_size() != target.batch_size())
        throw_error(op, ": source and target must have the same batch size, got ", source.batch_size(), " and ",
                    target.batch_size());
    if (source.device() != target.device())
        throw_error(op, ": source and target must be on the same device, got ", source.device().str(), " and ",
                    target.device().str());
    if (source.num_voxels() > INT32_MAX)
        throw_error(op, ": source has ", source.num_voxels(),
                    " voxels; int32 neighbour maps need fewer than 2^31 source voxels");
    checked_mul(op, "neighbour map size", target.num_voxels(), g.kernel_volume());
    const bool symmetric = is_symmetric(source, target, g);
    Buffer<int32_t> map = on_backend(op, target.device(), [&](auto backend) {
        return backend.neighbour_map(source.storage(), target.storage(), g, direction, symmetric);
    });
    return KernelMap(std::move(map), source.num_voxels(), target.num_voxels(), kernel_size_of(g), stride_of(g),
                     direction, target.context());
}

GridAndMap build_conv_grid_and_map(const char* op, const GridBatch& source, const ConvGeometry& g) {
    GridBatch grid = generate_conv_grid(op, source, g);
    KernelMap map = build_neighbour_map(op, source, grid, g, MapDirection::Forward);
    return GridAndMap{std::move(grid), std::move(map)};
}

GridAndMap build_conv_transpose_grid_and_map(const char* op, const GridBatch& source, const ConvGeometry& g) {
    GridBatch grid = generate_conv_transpose_grid(op, source, g);
    if (!g.is_uniform(2, 2)) {
        KernelMap map = build_neighbour_map(op, source, grid, g, MapDirection::Transposed);
        return GridAndMap{std::move(grid), std::move(map)};
    }
    // Fine voxel 8n + t is reached from coarse voxel n through tap t: no lookups, no sync.
    if (grid.num_voxels() > INT32_MAX)
        throw_error(op, ": the generated grid has ", grid.num_voxels(),
                    " voxels; int32 neighbour maps need fewer than 2^31 voxels");
    Buffer<int32_t> map = on_backend(op, source.device(),
                                     [&](auto backend) { return backend.subdivision_map(source.storage()); });
    KernelMap kernel_map(std::move(map), source.num_voxels(), grid.num_voxels(), kernel_size_of(g), stride_of(g),
                         MapDirection::Transposed, source.context());
    return GridAndMap{std::move(grid), std::move(kernel_map)};
}

}  // namespace detail

KernelMap neighbour_map(const GridBatch& source, const GridBatch& target, const Vec3i& kernel_size, const Vec3i& stride,
                        MapDirection direction) {
    constexpr const char* op = "neighbour_map";
    return detail::build_neighbour_map(op, source, target, detail::make_conv_geometry(op, kernel_size, stride),
                                       direction);
}

GridAndMap conv_transpose_grid_and_map(const GridBatch& source, const Vec3i& kernel_size, const Vec3i& stride) {
    constexpr const char* op = "conv_transpose_grid_and_map";
    return detail::build_conv_transpose_grid_and_map(op, source, detail::make_conv_geometry(op, kernel_size, stride));
}

GridAndMap conv_grid_and_map(const GridBatch& source, const Vec3i& kernel_size, const Vec3i& stride) {
    constexpr const char* op = "conv_grid_and_map";
    return detail::build_conv_grid_and_map(op, source, detail::make_conv_geometry(op, kernel_size, stride));
}

}  // namespace sparsegrid
