"""Neural-network modules over sparse grids.

Layers take and return a SparseFeatures (a GridBatch with its features [num_voxels, channels] in voxel
order), so they compose in torch.nn.Sequential. Convolution plans are cached on the GridBatch object
for each (kernel size, stride, direction), so layers that share a grid within a step share its plans.

Devices as in torch.nn: grids and features on one device, module parameters moved there with
module.to(device); plans are built on the grid's device.

Autocast as torch's own convolutions: inside torch.autocast("cuda", dtype=D) the convolution layers run
in D (float16 or bfloat16) on CUDA features of float32, float16 or bfloat16, and return features of D;
the parameters stay float32 and receive float32 gradients. float64 features, and CPU autocast (16-bit
convolutions run on CUDA only), leave the features' dtype as it is. The float32 weights go to the 16-bit
convolution uncast (it rounds them as it packs them, bitwise the cast) and get their gradients in float32
straight from the float32 sums, which rounded to 16 bits are the gradients of a cast weight.
"""

import math

import torch
from torch import nn

from . import ConvolutionPlan, _compile, _triple

__all__ = [
    "SparseFeatures",
    "SparseConv3d",
    "SparseConvTranspose3d",
    "Prune",
    "SparseMaxPool3d",
    "SparseAvgPool3d",
    "GlobalPool",
    "Features",
    "BatchNorm",
]


class SparseFeatures:
    """A grid and its features: features[i] belongs to voxel i of grid."""

    def __init__(self, grid, features):
        if features.dim() != 2 or features.shape[0] != grid.num_voxels:
            raise ValueError(
                f"SparseFeatures: features must have shape [{grid.num_voxels}, C], got {tuple(features.shape)}"
            )
        if features.device != grid.device:
            raise ValueError(f"SparseFeatures: features are on {features.device} but the grid is on {grid.device}")
        self.grid = grid
        self.features = features

    @property
    def device(self):
        return self.grid.device

    def replace(self, features):
        return SparseFeatures(self.grid, features)

    def to(self, device):
        """The grid and the features on `device` (self when they are there already)."""
        grid = self.grid.to(device)
        return self if grid is self.grid else SparseFeatures(grid, self.features.to(grid.device))

    def __repr__(self):
        return f"SparseFeatures({self.grid!r}, channels={self.features.shape[1]})"


@_compile.eager
def _plan(grid, kernel_size, stride, transposed, target=None, same_grid=False):
    """The plan of (grid, K, S, direction) to its generated target (or to grid itself when same_grid),
    built once per grid object. Plans to other given targets are not cached."""
    make = ConvolutionPlan.from_grid_transposed if transposed else ConvolutionPlan.from_grid
    if target is not None:
        return make(grid, kernel_size, stride, target)
    cache = grid.__dict__.setdefault("_plans", {})
    key = (tuple(kernel_size), tuple(stride), transposed, same_grid)
    if key not in cache:
        cache[key] = make(grid, kernel_size, stride, grid if same_grid else None)
    return cache[key]


_AUTOCAST_INPUTS = (torch.float32, torch.float16, torch.bfloat16)
_HALF = (torch.float16, torch.bfloat16)


def _cuda_autocast_dtype():
    """The dtype of an enclosing torch.autocast("cuda"), or None outside one."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        return torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


class _SparseConvBase(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, bias, transposed):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _triple(kernel_size)
        self.stride = _triple(stride, "stride")
        self.transposed = transposed
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, *self.kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        # The initialisation of torch.nn.Conv3d: kaiming-uniform weights, bias from the fan-in.
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.in_channels * math.prod(self.kernel_size)
            bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x, target=None):
        if x.features.shape[1] != self.in_channels:
            raise ValueError(
                f"{type(self).__name__}: expected {self.in_channels} input channels, got {x.features.shape[1]}"
            )
        # Stride 1 keeps the grid (submanifold convolution), the usual choice inside a level; strided
        # and transposed convolutions generate their output grid unless a target is given.
        same_grid = target is None and self.stride == [1, 1, 1]
        plan = _plan(x.grid, self.kernel_size, self.stride, self.transposed, target, same_grid)
        # The parameters as they are where the dtypes agree: a no-op .to() still costs a dispatch.
        features = x.features
        dtype = features.dtype
        if features.is_cuda and dtype in _AUTOCAST_INPUTS:
            dtype = _cuda_autocast_dtype() or dtype
            if features.dtype != dtype:
                features = features.to(dtype)
        # A float32 weight goes to 16-bit executions as it is: the plan rounds it as it packs it (bitwise
        # the cast) and returns its gradient in float32, without a cast and its autograd node per layer.
        weight = self.weight
        if weight.dtype != dtype and not (weight.dtype == torch.float32 and dtype in _HALF):
            weight = weight.to(dtype)
        out = plan.execute(features, weight)
        if self.bias is not None:
            out = out + (self.bias if self.bias.dtype == dtype else self.bias.to(dtype))
        output_grid = target if target is not None else (x.grid if same_grid else plan.target_grid)
        return SparseFeatures(output_grid, out)

    def extra_repr(self):
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"bias={self.bias is not None}"
        )


class SparseConv3d(_SparseConvBase):
    """Sparse convolution. Output grid: the given target, else the input grid for stride 1
    (submanifold), else grid.conv_grid(K, S)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, bias=True):
        super().__init__(in_channels, out_channels, kernel_size, stride, bias, transposed=False)


class SparseConvTranspose3d(_SparseConvBase):
    """Transposed convolution. Output grid: the given target, else the input grid for stride 1, else
    grid.conv_transpose_grid(K, S) (generative)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, bias=True):
        super().__init__(in_channels, out_channels, kernel_size, stride, bias, transposed=True)


class Prune(nn.Module):
    """Keeps the voxels where mask is true and their feature rows (differentiable through the kept rows)."""

    def forward(self, x, mask):
        if not isinstance(mask, torch.Tensor):
            mask = torch.as_tensor(mask, device=x.grid.device)
        if mask.dtype not in (torch.bool, torch.uint8):
            raise TypeError(f"Prune: mask must be bool or uint8, got {mask.dtype}")
        mask = mask.reshape(-1)  # bool or uint8 as they are: nonzero keeps
        if mask.numel() != x.grid.num_voxels:
            raise ValueError(f"Prune: mask must have {x.grid.num_voxels} entries, got {mask.numel()}")
        # The kept rows by index, not by boolean indexing (which waits for the device to count them).
        grid, kept_index = x.grid.pruned_grid(mask, return_index=True)
        return SparseFeatures(grid, x.features.index_select(0, kept_index))


class _SparsePool(nn.Module):
    def __init__(self, kernel_size, stride=None):
        super().__init__()
        self.kernel_size = _triple(kernel_size)
        self.stride = _triple(stride if stride is not None else kernel_size, "stride")


class SparseMaxPool3d(_SparsePool):
    """Max over each output voxel's existing inputs (output grid: grid.conv_grid(K, S))."""

    def forward(self, x):
        plan = _plan(x.grid, self.kernel_size, self.stride, False)
        if plan.is_identity:
            return x
        neighbours = plan.target_map().long()
        present = neighbours >= 0
        gathered = x.features[neighbours.clamp(min=0)]  # [N_out, V, C]
        gathered = gathered.masked_fill(~present.unsqueeze(-1), float("-inf"))
        return SparseFeatures(plan.target_grid, gathered.max(dim=1).values)


class SparseAvgPool3d(_SparsePool):
    """Mean over each output voxel's existing inputs (output grid: grid.conv_grid(K, S))."""

    def forward(self, x):
        plan = _plan(x.grid, self.kernel_size, self.stride, False)
        if plan.is_identity:
            return x
        neighbours = plan.target_map().long()
        present = (neighbours >= 0).unsqueeze(-1).to(x.features.dtype)
        total = (x.features[neighbours.clamp(min=0)] * present).sum(dim=1)
        return SparseFeatures(plan.target_grid, total / present.sum(dim=1).clamp(min=1))


class GlobalPool(nn.Module):
    """Per-member pooling of all voxels' features: [batch_size, C] ("mean" or "max"; empty members give 0)."""

    def __init__(self, mode="mean"):
        super().__init__()
        if mode not in ("mean", "max"):
            raise ValueError(f"GlobalPool: mode must be 'mean' or 'max', got {mode!r}")
        self.mode = mode

    def forward(self, x):
        offsets = x.grid.joffsets
        counts = offsets[1:] - offsets[:-1]
        options = dict(dtype=x.features.dtype, device=x.features.device)
        # The output size is known on the host: no synchronisation on CUDA.
        member = torch.repeat_interleave(torch.arange(x.grid.batch_size, device=counts.device), counts,
                                         output_size=x.grid.num_voxels)
        channels = x.features.shape[1]
        if self.mode == "mean":
            total = torch.zeros(x.grid.batch_size, channels, **options)
            total = total.index_add(0, member, x.features)
            return total / counts.clamp(min=1).unsqueeze(1).to(x.features.dtype)
        out = torch.full((x.grid.batch_size, channels), float("-inf"), **options)
        out = out.scatter_reduce(0, member.unsqueeze(1).expand(-1, channels), x.features, reduce="amax")
        return out.masked_fill(counts.unsqueeze(1) == 0, 0.0)


class Features(nn.Module):
    """Applies a dense module (activation, normalisation, linear) to the features, keeping the grid."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return x.replace(self.module(x.features))


_ACTIVATIONS = {None: 0, "identity": 0, "relu": 1, "leaky_relu": 2, "elu": 3, "silu": 4}
# The parameter each activation takes and its default (torch.nn's): LeakyReLU's negative slope, ELU's alpha.
_ACTIVATION_PARAMETERS = {"leaky_relu": 0.01, "elu": 1.0}


@_compile.eager
def _batch_norm(*args):
    """The layer's call: torch.ops.sparsegrid.batch_norm, whose autograd is in C++ (a Python
    autograd.Function would cost more host time per call than the kernels it queues)."""
    return torch.ops.sparsegrid.batch_norm(*args)


class BatchNorm(nn.Module):
    """Batch normalization of the features over all voxels of the batch, as torch.nn.BatchNorm1d on
    features [N, C], fused with an optional activation ("relu", "leaky_relu", "elu", "silu"; None for
    none): one call of three kernels where BatchNorm1d followed by an activation module takes two modules,
    their dispatches and a counter update each step. Its backward pass recomputes the activation's input
    instead of keeping the normalized features. Parameters, buffers and their names are those of
    torch.nn.BatchNorm1d, so state dicts load either way. `activation_parameter` is LeakyReLU's negative
    slope (0.01) or ELU's alpha (1.0).

    Takes a SparseFeatures (returns one on the same grid) or a [N, C] tensor. The statistics are float32
    (float64 for float64 features); float16 and bfloat16 features (CUDA) are normalized in float32 and
    rounded once, so under autocast the layer takes the convolutions' 16-bit output with its float32
    parameters. Sums run in an order fixed by N: bitwise reproducible, CPU and CUDA equal within rounding.
    No host synchronisation, also with momentum=None (the cumulative average reads the counter on the
    device)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 activation=None, activation_parameter=None):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"BatchNorm: activation must be one of None, 'relu', 'leaky_relu', 'elu', 'silu', "
                             f"got {activation!r}")
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        self.activation = activation
        if activation_parameter is None:
            activation_parameter = _ACTIVATION_PARAMETERS.get(activation, 0.0)
        elif activation not in _ACTIVATION_PARAMETERS:
            raise ValueError(f"BatchNorm: activation {activation!r} takes no activation_parameter")
        self.activation_parameter = float(activation_parameter)
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self._code = _ACTIVATIONS[activation]

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self):
        self.reset_running_stats()
        if self.affine:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def forward(self, x):
        features = x.features if isinstance(x, SparseFeatures) else x
        if features.dim() != 2 or features.shape[1] != self.num_features:
            raise ValueError(f"BatchNorm: expected features [N, {self.num_features}], got {tuple(features.shape)}")
        # As torch's batch norm: batch statistics in training, and always without running statistics.
        training = self.training or self.running_mean is None
        update = self.training and self.running_mean is not None
        running_mean = self.running_mean if update or not training else None
        running_var = self.running_var if update or not training else None
        counter = self.num_batches_tracked if update else None
        momentum = 0.0 if self.momentum is None else self.momentum
        out = _batch_norm(features, self.weight, self.bias, running_mean, running_var, counter, training, momentum,
                          self.momentum is None, self.eps, self._code, self.activation_parameter)
        return x.replace(out) if isinstance(x, SparseFeatures) else out

    def extra_repr(self):
        text = (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")
        if self.activation is not None:
            text += f", activation={self.activation!r}"
            if self.activation in _ACTIVATION_PARAMETERS:
                text += f", activation_parameter={self.activation_parameter}"
        return text
