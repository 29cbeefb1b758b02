// CUDA execution of convolutions over a neighbour map: the same contracts as cpu/convolution_cpu.h,
// ordered on the context's stream, with scratch memory from its allocator and no host sync.
#pragma once

#include <sparsegrid/convolution.h>

#include <cstdint>

namespace sparsegrid::detail::cuda {

/// out[r, :] = sum_t A_t . x[map[r][t], :] (see cpu::map_convolution). Output stationary: each output
/// row is summed by one thread in the order (tap, channel), so results are bitwise reproducible.
void map_convolution(const int32_t* map, int64_t rows, int32_t volume, const void* x, const void* weight,
                     bool transpose_weight, void* out, int64_t x_channels, int64_t out_channels, DType dtype,
                     const Context& ctx);

/// grad_weight[co, ci, t] = sum_r grad[r, co] * x[map[r][t], ci]. Rows are split into a number of
/// chunks that depends only on the problem's shape; partial sums are added in chunk order, so results
/// are bitwise reproducible.
void map_weight_gradient(const int32_t* map, int64_t rows, int32_t volume, const void* x, const void* grad,
                         void* grad_weight, int64_t in_channels, int64_t out_channels, DType dtype,
                         const Context& ctx);

}  // namespace sparsegrid::detail::cuda
