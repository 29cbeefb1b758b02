// Sparse convolution plans: the kernel map between a source and a target grid, and the execution of
// the convolution over it (forward, and backward for features and weights) on raw buffers.
//
// Semantics (per axis pb = (K - 1) / 2; taps t = t0*K1*K2 + t1*K2 + t2; weights [Cout, Cin, K0, K1, K2]):
//   forward plan    (source fine F -> target coarse C):
//       out[c] = sum_t W[:, :, t] . x[S*c + tap(t) - pb]
//   transposed plan (source coarse C -> target fine F):
//       out[f] = sum over (c, t) with S*c + tap(t) - pb = f of W[:, :, t] . x[c]
//     equal to conv_transpose3d(x, W.transpose(0, 1), stride=S, padding=pb) on a dense canvas.
// In both cases out[r] = sum_t W[:, :, t] . x[map[r][t]] over the plan's neighbour map (rows = target
// voxels), so one execution path serves both. Features are row-major [num_voxels, channels] in the
// grids' voxel order.
//
// Determinism: every output row (forward), input row (input gradient) and weight entry (weight
// gradient) is a sum in a fixed order, independent of the number of threads: repeated runs are
// bitwise identical.
#pragma once

#include <sparsegrid/grid_batch.h>
#include <sparsegrid/kernel_map.h>
#include <sparsegrid/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sparsegrid {

namespace detail {
struct PlanMaps;
}

class ConvolutionPlan {
public:
    /// Forward plan from `source` to source.conv_grid(K, S) (generated target).
    static ConvolutionPlan make(const GridBatch& source, const Vec3i& kernel_size, const Vec3i& stride);
    /// Forward plan from `source` to an existing `target` (same batch size and device).
    static ConvolutionPlan make(const GridBatch& source, const GridBatch& target, const Vec3i& kernel_size,
                                const Vec3i& stride);
    /// Transposed plan from `source` to source.conv_transpose_grid(K, S) (generative transposed conv).
    static ConvolutionPlan make_transposed(const GridBatch& source, const Vec3i& kernel_size, const Vec3i& stride);
    /// Transposed plan from `source` to an existing `target`.
    static ConvolutionPlan make_transposed(const GridBatch& source, const GridBatch& target, const Vec3i& kernel_size,
                                           const Vec3i& stride);

    /// The plan with source and target swapped and the direction flipped, in O(1): it shares this
    /// plan's maps (the map it needs is derived from them on first use, without lookups).
    ConvolutionPlan transposed() const;

    const GridBatch& source_grid() const { return m_source; }
    const GridBatch& target_grid() const { return m_target; }
    const Vec3i& kernel_size() const { return m_kernel_size; }
    const Vec3i& stride() const { return m_stride; }
    MapDirection direction() const { return m_direction; }
    int32_t kernel_volume() const { return m_kernel_size[0] * m_kernel_size[1] * m_kernel_size[2]; }
    /// K = S = 1 between a grid and itself: no map at all, the convolution is a matrix product.
    bool is_identity() const { return !m_maps; }
    /// Neighbour map with rows = target voxels (throws for the identity plan, which has none).
    const KernelMap& target_map() const;
    /// Neighbour map with rows = source voxels (the transpose of target_map()).
    const KernelMap& source_map() const;

    /// Builds now what executions otherwise build on first use: the source-rows map (except for a plan on
    /// one grid with stride 1 and odd kernel sizes, whose executions read the target rows' map with the
    /// taps mirrored) and, on CUDA, the row orders the forward pass and the input gradient read (on the
    /// target grid's stream, or `ctx`'s). Optional.
    void prepare() const;
    void prepare(const Context& ctx) const;

    /// output[num_target, out_channels] = the convolution of input[num_source, in_channels] with
    /// weight[out_channels, in_channels, K0, K1, K2]. Buffers on the plan's device; output is overwritten.
    void forward(const void* input, const void* weight, void* output, int64_t in_channels, int64_t out_channels,
                 DType dtype) const;
    /// grad_input[num_source, in_channels] from grad_output[num_target, out_channels] (overwritten).
    void backward_input(const void* grad_output, const void* weight, void* grad_input, int64_t in_channels,
                        int64_t out_channels, DType dtype) const;
    /// grad_weight[out_channels, in_channels, K0, K1, K2] from input and grad_output (overwritten).
    void backward_weight(const void* input, const void* grad_output, void* grad_weight, int64_t in_channels,
                         int64_t out_channels, DType dtype) const;

    /// The same three executions ordered on `ctx.stream` with scratch memory from `ctx.allocator`
    /// (ctx.device must be the plan's device); the overloads above use the target grid's context.
    /// On CUDA they are asynchronous and never wait for the device.
    void forward(const void* input, const void* weight, void* output, int64_t in_channels, int64_t out_channels,
                 DType dtype, const Context& ctx) const;
    void backward_input(const void* grad_output, const void* weight, void* grad_input, int64_t in_channels,
                        int64_t out_channels, DType dtype, const Context& ctx) const;
    void backward_weight(const void* input, const void* grad_output, void* grad_weight, int64_t in_channels,
                         int64_t out_channels, DType dtype, const Context& ctx) const;

    /// Mixed precision, as autocast runs a layer whose parameters stay float32: float16 / bfloat16
    /// features (`dtype`, CUDA) with float32 weights (`weight_dtype` DType::Float32). The weights are
    /// rounded to `dtype` as the execution packs them, so forward and backward_input give bitwise the
    /// results of converting the weights first; backward_weight writes a float32 grad_weight, its float32
    /// sums as they are (rounded to `dtype` they are the 16-bit weight gradient). weight_dtype == dtype
    /// is the plain execution; other pairs raise.
    void forward(const void* input, const void* weight, void* output, int64_t in_channels, int64_t out_channels,
                 DType dtype, DType weight_dtype, const Context& ctx) const;
    void backward_input(const void* grad_output, const void* weight, void* grad_input, int64_t in_channels,
                        int64_t out_channels, DType dtype, DType weight_dtype, const Context& ctx) const;
    void backward_weight(const void* input, const void* grad_output, void* grad_weight, int64_t in_channels,
                         int64_t out_channels, DType dtype, DType weight_dtype, const Context& ctx) const;

private:
    ConvolutionPlan() = default;
    /// Output-stationary execution over the map of slot `slot` of the shared maps (rows = `rows`, the
    /// output's; x has `x_rows`). `single_edge_rows`: every output row has at most one edge (the fine side
    /// of a K = S plan), so CUDA may run it over the other map, scattering each product to its one output
    /// row.
    void execute_map(const char* op, int slot, int64_t rows, int64_t x_rows, bool single_edge_rows, const void* x,
                     const void* weight, bool transpose_weight, void* out, int64_t x_channels, int64_t out_channels,
                     DType dtype, DType weight_dtype, const Context& ctx) const;
    static ConvolutionPlan assemble(GridBatch source, GridBatch target, const Vec3i& kernel_size, const Vec3i& stride,
                                    MapDirection direction, std::shared_ptr<detail::PlanMaps> maps);
    /// make / make_transposed to the generated target, and to a given one (plans kept on the source).
    static ConvolutionPlan make_generating(const char* op, const GridBatch& source, const Vec3i& kernel_size,
                                           const Vec3i& stride, MapDirection direction);
    static ConvolutionPlan make_to(const char* op, const GridBatch& source, const GridBatch& target,
                                   const Vec3i& kernel_size, const Vec3i& stride, MapDirection direction);
    /// Source and target are one grid, the stride is 1 and every kernel size odd: the map with rows =
    /// source voxels is the target rows' map with the taps mirrored (t -> volume - 1 - t), so it is never
    /// built; the passes that need it read the other map with the weight's taps mirrored.
    bool mirrored_maps() const;
    /// The forward pass (input_gradient false) or the input gradient: the slot of the map whose rows are
    /// its output rows, and whether each of those rows has at most one edge (the fine side of a K = S plan).
    std::pair<int, bool> pass_map(bool input_gradient) const;
    /// The slot whose map and row order an execution over slot `slot` reads: the first when the maps are
    /// mirrored, and the other one when it scatters.
    int read_slot(int slot, bool scatter) const;

    GridBatch m_source;
    GridBatch m_target;
    Vec3i m_kernel_size{1, 1, 1};
    Vec3i m_stride{1, 1, 1};
    MapDirection m_direction = MapDirection::Forward;
    std::shared_ptr<detail::PlanMaps> m_maps;  ///< null for the identity plan
    bool m_flipped = false;                    ///< target rows are the shared maps' second slot
};

/// The tile configurations of the CUDA tensor-core convolution engine, which runs the forward pass, the
/// input gradient and the weight gradient in float16, bfloat16 and float with TF32 (empty in a build
/// without CUDA): the forward ones (also used for the input gradient) first, then the weight gradient's,
/// whose names start with "w". Those whose names start with "g" (forward) or "wg" (weight gradient) use
/// Hopper's warpgroup products (wgmma): the forward ones run float16, bfloat16 and TF32 (gathering only),
/// the weight-gradient ones float16 and bfloat16, on devices of compute capability 9.0 in builds with
/// sm_90a code (CUDA architecture 90a, as by default), and give way to the automatic choice elsewhere;
/// there the automatic choice takes them from 64 channels (the forward ones in TF32 from 32). Every
/// configuration sums each output over the same groups in the same order: results are bitwise equal
/// whichever configuration runs, so the choice only changes speed.
std::vector<std::string> convolution_engine_configurations();

/// For measurements and tests: every following CUDA tensor-core execution of the process that the named
/// configuration covers (forward and input gradient, or weight gradient) runs on it, the others on their
/// automatic choice; "auto" (the default) restores the automatic choice, "off" runs the tiled
/// kernels the engine replaced. The environment variable SPARSEGRID_CONV_CONFIG takes the same values
/// and applies while the process has set none here. Raises for any other name, listing the valid ones.
void set_convolution_engine_configuration(const std::string& name);

/// Tuning of the CUDA engine. With `enabled`, the first execution of each shape (forward or weight
/// gradient, dtype, channel counts, taps, rows within a factor of 2, device name) times every
/// configuration (it waits for the device: let it happen in a warm-up step) and keeps the fastest;
/// later executions of that shape take it without waiting. `file`, when not empty, is read now and
/// rewritten with every new choice, so that later processes start tuned (recorded choices apply with
/// tuning off too). Tuning changes speed only: every configuration gives bitwise the same result.
/// SPARSEGRID_CONV_TUNE=1 and SPARSEGRID_CONV_TUNE_FILE=path do the same for a process that calls
/// nothing here. No effect on the CPU.
void set_convolution_engine_tuning(bool enabled, const std::string& file = "");

}  // namespace sparsegrid
