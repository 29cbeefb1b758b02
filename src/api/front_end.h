// Internals shared by the front ends of GridBatch, KernelMap and ConvolutionPlan: each takes arguments
// its caller has validated, and `op`, the operation the user called, for the errors it raises.
#pragma once

#include <sparsegrid/grid_batch.h>
#include <sparsegrid/kernel_map.h>

#include "core/storage.h"
#include "core/taps.h"

namespace sparsegrid::detail {

/// A GridBatch holding `topology` with `transforms`, on ctx.
GridBatch make_grid(GridTopology topology, std::vector<MemberTransform> transforms, const Context& ctx);

/// grid.conv_grid / conv_transpose_grid for a checked geometry (the identity geometry returns grid).
GridBatch generate_conv_grid(const char* op, const GridBatch& grid, const ConvGeometry& g);
GridBatch generate_conv_transpose_grid(const char* op, const GridBatch& grid, const ConvGeometry& g);

/// The kernel map between two grids for a checked geometry (checks the grids against each other).
KernelMap build_neighbour_map(const char* op, const GridBatch& source, const GridBatch& target, const ConvGeometry& g,
                              MapDirection direction);

/// The generated grid and its map (conv_grid_and_map / conv_transpose_grid_and_map) for a checked geometry.
GridAndMap build_conv_grid_and_map(const char* op, const GridBatch& source, const ConvGeometry& g);
GridAndMap build_conv_transpose_grid_and_map(const char* op, const GridBatch& source, const ConvGeometry& g);

/// The per-axis kernel size and stride of a geometry.
Vec3i kernel_size_of(const ConvGeometry& g);
Vec3i stride_of(const ConvGeometry& g);

}  // namespace sparsegrid::detail
