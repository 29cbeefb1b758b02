// KernelMap front end: validation and dispatch.
#include <sparsegrid/kernel_map.h>

#include "core/backend.h"
#include "core/checks.h"

#include <climits>

namespace sparsegrid {

using detail::throw_error;

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
    return SPARSEGRID_DISPATCH("KernelMap::pairs_by_tap", ctx,
                               pairs_by_tap(m_neighbour_map, m_num_target, kernel_volume(), ctx));
}

PairLists KernelMap::pairs_by_tap() const { return pairs_by_tap(m_context); }

KernelMap KernelMap::transposed(const Context& ctx) const {
    if (m_num_target > INT32_MAX)
        throw_error("KernelMap::transposed: the map has ", m_num_target,
                    " targets; int32 neighbour maps need fewer than 2^31 source voxels");
    Buffer<int32_t> map = SPARSEGRID_DISPATCH(
        "KernelMap::transposed", ctx, transpose_map(m_neighbour_map, m_num_target, m_num_source, kernel_volume(), ctx));
    const MapDirection flipped = m_direction == MapDirection::Forward ? MapDirection::Transposed
                                                                      : MapDirection::Forward;
    return KernelMap(std::move(map), m_num_target, m_num_source, m_kernel_size, m_stride, flipped, ctx);
}

KernelMap KernelMap::transposed() const { return transposed(m_context); }

int64_t KernelMap::num_edges() const {
    return SPARSEGRID_DISPATCH("KernelMap::num_edges", m_context, count_edges(m_neighbour_map, m_context));
}

KernelMap neighbour_map(const GridBatch& source, const GridBatch& target, const Vec3i& kernel_size, const Vec3i& stride,
                        MapDirection direction) {
    constexpr const char* op = "neighbour_map";
    const detail::ConvGeometry g = detail::make_conv_geometry(op, kernel_size, stride);
    if (source.batch_size() != target.batch_size())
        throw_error(op, ": source and target must have the same batch size, got ", source.batch_size(), " and ",
                    target.batch_size());
    if (source.device() != target.device())
        throw_error(op, ": source and target must be on the same device, got ", source.device().str(), " and ",
                    target.device().str());
    if (source.num_voxels() > INT32_MAX)
        throw_error(op, ": source has ", source.num_voxels(),
                    " voxels; int32 neighbour maps need fewer than 2^31 source voxels");
    detail::checked_mul(op, "neighbour map size", target.num_voxels(), g.kernel_volume());
    const Context& ctx = target.context();
    Buffer<int32_t> map = SPARSEGRID_DISPATCH(op, ctx, neighbour_map(source.storage(), target.storage(), g, direction));
    return KernelMap(std::move(map), source.num_voxels(), target.num_voxels(), kernel_size, stride, direction, ctx);
}

GridAndMap conv_transpose_grid_and_map(const GridBatch& source, const Vec3i& kernel_size, const Vec3i& stride) {
    constexpr const char* op = "conv_transpose_grid_and_map";
    detail::make_conv_geometry(op, kernel_size, stride);
    GridBatch grid = source.conv_transpose_grid(kernel_size, stride);
    if (kernel_size == Vec3i{2, 2, 2} && stride == Vec3i{2, 2, 2}) {
        if (grid.num_voxels() > INT32_MAX)
            throw_error(op, ": the generated grid has ", grid.num_voxels(),
                        " voxels; int32 neighbour maps need fewer than 2^31 voxels");
        const Context& ctx = source.context();
        Buffer<int32_t> map = SPARSEGRID_DISPATCH(op, ctx, subdivision_map(source.storage()));
        KernelMap kernel_map(std::move(map), source.num_voxels(), grid.num_voxels(), kernel_size, stride,
                             MapDirection::Transposed, ctx);
        return GridAndMap{std::move(grid), std::move(kernel_map)};
    }
    KernelMap map = neighbour_map(source, grid, kernel_size, stride, MapDirection::Transposed);
    return GridAndMap{std::move(grid), std::move(map)};
}

GridAndMap conv_grid_and_map(const GridBatch& source, const Vec3i& kernel_size, const Vec3i& stride) {
    GridBatch grid = source.conv_grid(kernel_size, stride);
    KernelMap map = neighbour_map(source, grid, kernel_size, stride, MapDirection::Forward);
    return GridAndMap{std::move(grid), std::move(map)};
}

}  // namespace sparsegrid
