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
void map_convolution(const int32_t* map, const int32_t* order, int64_t rows, int32_t volume, const void* x,
                     const void* weight, bool transpose_weight, void* out, int64_t x_channels, int64_t out_channels,
                     DType dtype, const Context& ctx);

/// grad_weight[co, ci, t] = sum_r grad[r, co] * x[map[r][t], ci]. Rows are split into a number of
/// chunks that depends only on the problem's shape; partial sums are added in chunk order, so results
/// are bitwise reproducible.
void map_weight_gradient(const int32_t* map, int64_t rows, int32_t volume, const void* x, const void* grad,
                         void* grad_weight, int64_t in_channels, int64_t out_channels, DType dtype,
                         const Context& ctx);

}  // namespace sparsegrid::detail::cuda
