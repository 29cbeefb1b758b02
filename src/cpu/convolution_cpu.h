// CPU execution of convolutions over a neighbour map (output stationary: each output row is computed
// by one thread, in a fixed order, so results do not depend on the thread count).
#pragma once

#include <sparsegrid/convolution.h>

#include <cstdint>

namespace sparsegrid::detail::cpu {

/// out[r, :] = sum_t A_t . x[map[r][t], :] for r < rows, where A_t = W[:, :, t] (forward) or
/// W[:, :, t]^T (transpose_weight, for the input gradient). W is [Cout, Cin, volume]; x has
/// x_channels columns (Cin, or Cout when transposed) and out out_channels (the other). A null map
/// means the identity (volume 1, row r reads x[r]).
void map_convolution(const int32_t* map, int64_t rows, int32_t volume, const void* x, const void* weight,
                     bool transpose_weight, void* out, int64_t x_channels, int64_t out_channels, DType dtype,
                     const Context& ctx);  // ctx is unused on the CPU

/// grad_weight[co, ci, t] = sum_r grad[r, co] * x[map[r][t], ci], summed over r in increasing order.
void map_weight_gradient(const int32_t* map, int64_t rows, int32_t volume, const void* x, const void* grad,
                         void* grad_weight, int64_t in_channels, int64_t out_channels, DType dtype,
                         const Context& ctx);  // ctx is unused on the CPU

}  // namespace sparsegrid::detail::cpu
