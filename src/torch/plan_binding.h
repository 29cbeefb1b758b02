// torch.classes.sparsegrid.ConvolutionPlan and the differentiable operator sparse_conv over it.
// Convolution calls allocate their output through PyTorch on its current stream and never
// synchronise with the host (forward and both backward passes).
#pragma once

#include "grid_binding.h"

#include <sparsegrid/convolution.h>

#include <torch/custom_class.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace sparsegrid_torch {

struct ConvolutionPlanHolder : torch::CustomClassHolder {
    sparsegrid::ConvolutionPlan plan;
    explicit ConvolutionPlanHolder(sparsegrid::ConvolutionPlan p) : plan(std::move(p)) {}
    using Ptr = c10::intrusive_ptr<ConvolutionPlanHolder>;

    /// transposed = false: forward (strided) convolution; true: transposed convolution. Without a
    /// target the generated grid (conv_grid or conv_transpose_grid) is the target. The plan lives on
    /// the source grid's device; a target must be there too. Kernel size and stride: 1 or 3 entries.
    static Ptr make(GridBatchHolder::Ptr source, std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                    c10::optional<GridBatchHolder::Ptr> target, bool transposed);

    /// The plan with source and target swapped (shares the maps, O(1)).
    Ptr transposed() const { return c10::make_intrusive<ConvolutionPlanHolder>(plan.transposed()); }
    GridBatchHolder::Ptr source_grid() const { return GridBatchHolder::wrap(plan.source_grid()); }
    GridBatchHolder::Ptr target_grid() const { return GridBatchHolder::wrap(plan.target_grid()); }
    bool is_identity() const { return plan.is_identity(); }
    c10::Device device() const;
    /// Neighbour map [num_target, kernel_volume] int32 on the plan's device (a view of the plan's memory).
    torch::Tensor target_map() const;

    /// input [N_source, Cin], weight [Cout, Cin, K0, K1, K2] -> [N_target, Cout] on the plan's device,
    /// in input's dtype. The weight has input's dtype, or is float32 with float16 / bfloat16 input
    /// (autocast's layers: rounded to input's dtype as it is packed, bitwise as if converted first).
    torch::Tensor forward(torch::Tensor input, torch::Tensor weight) const;
    /// grad_output [N_target, Cout], weight -> grad_input [N_source, Cin]; weight dtypes as forward.
    torch::Tensor backward_input(torch::Tensor grad_output, torch::Tensor weight) const;
    /// input, grad_output -> grad_weight [Cout, Cin, K0, K1, K2] in `dtype`: input's (None), or float32
    /// with float16 / bfloat16 input (the gradient of a float32 weight: the float32 sums, unrounded).
    torch::Tensor backward_weight(torch::Tensor input, torch::Tensor grad_output,
                                  c10::optional<c10::ScalarType> dtype) const;

private:
    void check_weight(const torch::Tensor& weight, int64_t in_channels, const char* op) const;
    /// The weight's dtype for features of `features` dtype: the same, or float32 with 16-bit features.
    sparsegrid::DType weight_dtype_of(const torch::Tensor& weight, const torch::Tensor& features, const char* op,
                                      const char* name) const;
    void check_features(const torch::Tensor& x, int64_t rows, const char* op, const char* name) const;
    sparsegrid::Context execution_context(sparsegrid::DType dtype) const;
};

/// torch.ops.sparsegrid.sparse_conv(features [N_source, Cin], weight [Cout, Cin, K0, K1, K2], plan)
/// -> [N_target, Cout], differentiable in features and weight. Features and weight on the plan's
/// device, same dtype: float32 / float64, or float16 / bfloat16 on CUDA, where a float32 weight may go
/// with 16-bit features (its gradient is float32, the output has the features' dtype). When no gradient can be
/// asked for (grad mode off, or neither features nor weight requires one) it runs the forward pass
/// without an autograd node, as PyTorch's own operators do (saves the node's host cost at inference).
/// Differentiable once: under create_graph the gradients carry a node that raises when a second backward
/// pass reaches it. Python's ConvolutionPlan.execute calls it as the plan's method `execute`.
torch::Tensor sparse_conv(torch::Tensor features, torch::Tensor weight, c10::intrusive_ptr<ConvolutionPlanHolder> plan);

}  // namespace sparsegrid_torch
