// CUDA execution of convolutions over a neighbour map: the same contracts as cpu/convolution_cpu.h,
// ordered on the context's stream, with scratch memory from its allocator and no host sync.
#pragma once

#include <sparsegrid/convolution.h>

#include <cstdint>

namespace sparsegrid::detail::cuda {

/// A permutation of the map's rows, stably sorted by the set of taps at which they have an edge, for
/// map_convolution's `order`. Empty (rows taken in order) for a null map, one tap or more than 64,
/// and for maps of fewer than 4096 rows.
Buffer<int32_t> row_order(const int32_t* map, int64_t rows, int32_t volume, const Context& ctx);

/// out[r, :] = sum_t A_t . x[map[r][t], :] (see cpu::map_convolution), rows visited in `order` when
/// it is not null (a permutation of [0, rows)). Output stationary: each output row is summed by one
/// thread in the order (tap, channel) whatever the row order, so results are bitwise reproducible.
/// With `scatter`, `map` has rows = the input's (`rows` of them) and each of the `out_rows` output rows
/// has at most one edge (a K = S plan's fine side): out[map[r][t], :] = A_t . x[r, :], every other
/// output row zero. Each output is then a single product summed in channel order, equal to what the
/// gathering kernel computes for a row of one edge; x is read once per block instead of gathered per
/// output row.
void map_convolution(const int32_t* map, const int32_t* order, int64_t rows, int32_t volume, const void* x,
                     const void* weight, bool transpose_weight, void* out, int64_t x_channels, int64_t out_channels,
                     DType dtype, bool scatter, int64_t out_rows, const Context& ctx);

/// Whether executions whose output rows have at most one edge each run in map_convolution's scatter
/// mode: yes, unless SPARSEGRID_CONV_SCATTER is "0" (for measurements; the results are the same).
bool scatter_enabled();

/// grad_weight[co, ci, t] = sum_r grad[r, co] * x[map[r][t], ci] over a map with rows = target voxels,
/// or with `rows_are_source` over the transposed map (rows = source voxels): sum_s x[s, ci] *
/// grad[map[s][t], co]. Rows are split into a number of chunks that depends only on the problem's
/// shape; partial sums are added in chunk order, so results are bitwise reproducible.
void map_weight_gradient(const int32_t* map, int64_t rows, int32_t volume, bool rows_are_source, const void* x,
                         const void* grad, void* grad_weight, int64_t in_channels, int64_t out_channels, DType dtype,
                         const Context& ctx);

}  // namespace sparsegrid::detail::cuda
