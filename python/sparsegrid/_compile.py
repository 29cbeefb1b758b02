"""torch.compile support (torch 2.4 and later; a no-op before).

Convolutions inside a compiled region run as the custom operators sparsegrid::conv, ::conv_input_grad
and ::conv_weight_grad. They take tensors only: the features and weight, a CPU int64 scalar naming the
plan (a key into a registry of plan handles) and an empty [rows, 0] tensor that carries the row count of
the output (and of the source, for the input gradient). Their fake implementations give the output
shapes from those, so the compiler traces through a convolution, its autograd and the dense ops around
it without running them.

Everything whose result depends on data (grids, plans, the topology operations: a generated grid's
voxel count is known only once it is built) runs eagerly: while the compiler traces, the GridBatch and
ConvolutionPlan methods call through torch.compiler.disable, so the compiler breaks the graph there (a graph break, not an error;
fullgraph=True is therefore not supported for networks that build grids or plans).

The registry holds a plan's C++ handle for as long as the plan's key tensor lives: the plan object holds
it, and so does an autograd graph that saved it for the backward pass, so a plan dropped after the
forward pass still serves its backward pass.
"""

import functools
import itertools
import weakref

import torch

available = (hasattr(torch, "library") and hasattr(torch.library, "custom_op") and hasattr(torch, "compiler")
             and hasattr(torch.compiler, "is_compiling") and hasattr(torch.compiler, "disable"))

_handles = {}  # key -> C++ ConvolutionPlan handle
_keys = itertools.count(1)


def compiling():
    """True while torch.compile traces (then convolutions go through the custom operators)."""
    return available and torch.compiler.is_compiling()


def _register(plan):
    """(key, target rows, source rows) of `plan`, made once per plan object."""
    inputs = plan.__dict__.get("_compile_inputs")
    if inputs is None:
        key_value = next(_keys)
        key = torch.tensor(key_value, dtype=torch.int64)
        _handles[key_value] = plan._handle
        weakref.finalize(key, _handles.pop, key_value, None)
        device = plan.device
        target_rows = torch.empty((plan.target_grid.num_voxels, 0), device=device)
        source_rows = torch.empty((plan.source_grid.num_voxels, 0), device=device)
        inputs = plan.__dict__["_compile_inputs"] = (key, target_rows, source_rows)
    return inputs


def _handle(key):
    handle = _handles.get(int(key))
    if handle is None:
        raise RuntimeError("sparsegrid: a compiled convolution's plan is no longer alive")
    return handle


if available:
    register_inputs = torch.compiler.disable(_register)

    @torch.library.custom_op("sparsegrid::conv", mutates_args=())
    def conv(features: torch.Tensor, weight: torch.Tensor, key: torch.Tensor, target_rows: torch.Tensor,
             source_rows: torch.Tensor) -> torch.Tensor:
        return _handle(key).forward(features, weight)

    @conv.register_fake
    def _(features, weight, key, target_rows, source_rows):
        return features.new_empty((target_rows.shape[0], weight.shape[0]))

    @torch.library.custom_op("sparsegrid::conv_input_grad", mutates_args=())
    def conv_input_grad(grad_output: torch.Tensor, weight: torch.Tensor, key: torch.Tensor,
                        source_rows: torch.Tensor) -> torch.Tensor:
        return _handle(key).backward_input(grad_output.contiguous(), weight)

    @conv_input_grad.register_fake
    def _(grad_output, weight, key, source_rows):
        return grad_output.new_empty((source_rows.shape[0], weight.shape[1]))

    @torch.library.custom_op("sparsegrid::conv_weight_grad", mutates_args=())
    def conv_weight_grad(features: torch.Tensor, grad_output: torch.Tensor, weight: torch.Tensor,
                         key: torch.Tensor) -> torch.Tensor:
        return _handle(key).backward_weight(features, grad_output.contiguous(), weight.dtype)

    @conv_weight_grad.register_fake
    def _(features, grad_output, weight, key):
        return weight.new_empty(weight.shape)

    def _setup_context(ctx, inputs, output):
        features, weight, key, target_rows, source_rows = inputs
        ctx.save_for_backward(features, weight, key, source_rows)

    def _backward(ctx, grad_output):
        features, weight, key, source_rows = ctx.saved_tensors
        grad_features = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_features = conv_input_grad(grad_output, weight, key, source_rows)
        if ctx.needs_input_grad[1]:
            grad_weight = conv_weight_grad(features, grad_output, weight, key)
        return grad_features, grad_weight, None, None, None

    conv.register_autograd(_backward, setup_context=_setup_context)


def run(plan, features, weight):
    """plan.execute(features, weight) as traced by torch.compile."""
    key, target_rows, source_rows = register_inputs(plan)
    return conv(features, weight, key, target_rows, source_rows)


def eager(function):
    """`function` run eagerly under torch.compile: while the compiler traces, the call goes through
    torch.compiler.disable (a graph break); otherwise it is the plain call. torch.compiler.disable's own
    wrapper switches the interpreter's frame evaluation at every call, eager ones included, which a layer
    (plan lookup, grid properties) would pay several times per call."""
    if not available:
        return function
    disabled = torch.compiler.disable(function)

    @functools.wraps(function)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling():
            return disabled(*args, **kwargs)
        return function(*args, **kwargs)

    return call


def eager_only(cls, keep=()):
    """Makes the methods and cached properties of `cls` (but those in `keep` and the special methods) run
    eagerly under torch.compile (`eager`): they call into the C++ handle, which the compiler cannot trace."""
    if not available:
        return cls
    for name, value in list(vars(cls).items()):
        if name in keep or (name.startswith("__") and name.endswith("__")):
            continue
        if isinstance(value, staticmethod):
            setattr(cls, name, staticmethod(eager(value.__func__)))
        elif isinstance(value, functools.cached_property):
            wrapped = functools.cached_property(eager(value.func))
            wrapped.__set_name__(cls, name)
            wrapped.__doc__ = value.__doc__
            setattr(cls, name, wrapped)
        elif isinstance(value, property):
            setattr(cls, name, property(eager(value.fget), doc=value.__doc__))
        elif callable(value):
            setattr(cls, name, eager(value))
    return cls
