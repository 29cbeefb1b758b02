"""sparsegrid: batched sparse voxel grids and sparse convolution for PyTorch.

A thin layer over the C++ library's TorchScript classes (torch.classes.sparsegrid.*). Grids are
immutable batches of sparse voxel grids; features are plain tensors [num_voxels, channels] in the
grid's voxel order (member-major, then Morton order, see the README).

Devices: a grid lives on one device (CPU or a CUDA device), given at construction or taken from the
input tensors; everything it returns (ijk, joffsets, plans, maps, convolution outputs) lives there too,
and tensors passed to it must be there already (errors name both devices). GridBatch.to(device) copies
a grid. Work runs on PyTorch's current CUDA stream.
"""

import functools
import operator
import os
import pathlib

import torch

from . import _compile

__all__ = ["GridBatch", "ConvolutionPlan", "sparse_conv", "synthetic_shapes", "load_mesh", "convolution_seconds",
           "host_synchronizations", "cuda_backend_available", "mesh_loading_available", "library_path",
           "convolution_engine_configurations", "set_convolution_engine_configuration",
           "set_convolution_engine_tuning", "nn"]


def _candidate_libraries():
    explicit = os.environ.get("SPARSEGRID_TORCH_LIBRARY")
    if explicit:
        yield pathlib.Path(explicit)
    here = pathlib.Path(__file__).resolve().parent
    yield here / "libsparsegrid_torch.so"
    root = here.parent.parent
    for build in ("build/test", "build/release", "build/gpu", "build"):
        yield root / build / "python" / "libsparsegrid_torch.so"


def _load():
    tried = []
    for path in _candidate_libraries():
        tried.append(str(path))
        if path.is_file():
            torch.ops.load_library(str(path))
            return str(path)
    raise ImportError(
        "sparsegrid: the PyTorch layer libsparsegrid_torch.so was not found (looked in: "
        + ", ".join(tried)
        + "); build it with scripts/test.sh or set SPARSEGRID_TORCH_LIBRARY"
    )


library_path = _load()
_Grid = torch.classes.sparsegrid.GridBatch
_Plan = torch.classes.sparsegrid.ConvolutionPlan


def _triple(value, name="kernel_size"):
    """A per-axis value (kernel size, stride, factor) as the layer takes it: an int becomes [v, v, v], a
    sequence a list of ints. Integers only (a float raises TypeError naming the argument instead of being
    truncated); the layer checks the count and the core the values (RuntimeError naming the argument)."""
    # The usual forms first (a layer passes its lists on every call): plain ints, bool excluded.
    if type(value) is int:
        return [value, value, value]
    if type(value) in (list, tuple) and all(type(v) is int for v in value):
        return list(value)
    try:
        if isinstance(value, bool):
            raise TypeError
        try:
            v = operator.index(value)  # an integer scalar of numpy or torch
        except TypeError:
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise
            items = list(value)  # a list, tuple, torch.Size, array or tensor of integers
            if any(isinstance(item, bool) for item in items):
                raise
            return [operator.index(item) for item in items]
        return [v, v, v]
    except TypeError:
        raise TypeError(f"{name} must be an int or a sequence of ints, got {value!r}") from None


def _integer(value, name):
    """A Python integer (a float raises TypeError naming the argument instead of being truncated)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def _per_member(value, batch_size, name, default):
    """A [B, 3] float64 CPU tensor (host metadata) from a scalar, a 3-sequence or a [B, 3] tensor."""
    if value is None:
        value = default
    t = torch.as_tensor(value, dtype=torch.float64).cpu()
    if t.dim() == 0:
        t = t.expand(3)
    if t.dim() == 1:
        if t.numel() != 3:
            raise ValueError(f"{name} must be a scalar, 3 values or [batch_size, 3], got shape {tuple(t.shape)}")
        t = t.expand(batch_size, 3)
    if tuple(t.shape) != (batch_size, 3):
        raise ValueError(f"{name} must have shape [{batch_size}, 3], got {tuple(t.shape)}")
    return t.contiguous()


def _device(device):
    """A concrete torch.device ("cuda" means the current CUDA device), or None."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _members(values, device, dtype, op, name):
    """Per-member [N_m, 3] tensors of `dtype` on one device: `device` when given, else the device of the
    tensors among `values` (all on one device), else the CPU. For dtype torch.int32 the values must be
    integers (see _int32)."""
    tensors = [torch.as_tensor(v) for v in values]
    device = _device(device)
    if device is None:
        found = {t.device for v, t in zip(values, tensors) if isinstance(v, torch.Tensor)}
        if len(found) > 1:
            raise ValueError(f"{op}: the {name} tensors are on several devices ({', '.join(sorted(map(str, found)))}); "
                             f"move them to one or pass device=")
        device = found.pop() if found else torch.device("cpu")
    if dtype == torch.int32:
        tensors = _int32(tensors, op, name)
    return [t.reshape(-1, 3).to(device=device, dtype=dtype) for t in tensors], device


# Integer dtypes whose every value fits int32; int64 is accepted within the int32 range.
_SMALL_INTEGERS = (torch.int8, torch.uint8, torch.int16, torch.int32)


def _int32(tensors, op, name):
    """The tensors, checked to hold integers that fit int32: floats, bools and complex numbers raise
    TypeError (no silent truncation), int64 values outside the int32 range raise ValueError (no silent
    wrap). Checking int64 values reads their range back: a host synchronisation for CUDA tensors, which
    int32 inputs avoid."""
    for t in tensors:
        # An empty list becomes an empty float tensor: nothing to truncate.
        if t.numel() > 0 and t.dtype not in _SMALL_INTEGERS and t.dtype != torch.int64:
            raise TypeError(f"{op}: {name} must hold integers (int32, or int64 within the int32 range), got {t.dtype}")
    wide = [t.reshape(-1) for t in tensors if t.dtype == torch.int64 and t.numel() > 0]
    if wide:
        values = torch.cat([t.to(wide[0].device) for t in wide])
        lo, hi = int(values.min()), int(values.max())
        if lo < -2**31 or hi > 2**31 - 1:
            raise ValueError(f"{op}: {name} values must lie in the int32 range [-2^31, 2^31 - 1], got "
                             f"{lo if lo < -2**31 else hi}")
    return tensors


def _offsets(members):
    """Member offsets [B + 1] int64 on the CPU (host metadata: costs no synchronisation)."""
    return torch.tensor([0] + [m.shape[0] for m in members], dtype=torch.int64).cumsum(0)


def _on_device(value, device):
    """Python data becomes a tensor on `device`; tensors are passed as they are (and checked by the layer)."""
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(value, device=device)


class GridBatch:
    """An immutable batch of sparse voxel grids (see include/sparsegrid/grid_batch.h). Its sizes and
    device are read from the layer once and kept (every read is a call into the layer, and layers ask
    for them many times per step)."""

    def __init__(self, handle):
        self._handle = handle

    @staticmethod
    def from_ijk(ijk, voxel_sizes=None, origins=None, device=None):
        """From one integer tensor [N_m, 3] per member (any order, duplicates removed; int32, or int64
        within the int32 range; floats raise TypeError). The grid lives on `device`, by default on the
        device of the given tensors (CPU for Python lists)."""
        if isinstance(ijk, torch.Tensor):
            ijk = [ijk]
        if not ijk:
            raise ValueError("from_ijk: ijk must hold at least one member")
        members, _ = _members(ijk, device, torch.int32, "from_ijk", "ijk")
        batch = len(members)
        return GridBatch(_Grid.from_ijk(torch.cat(members).contiguous(), _offsets(members),
                                        _per_member(voxel_sizes, batch, "voxel_sizes", 1.0),
                                        _per_member(origins, batch, "origins", 0.0)))

    @staticmethod
    def from_points(points, voxel_sizes, origins=None, device=None):
        """The voxels containing at least one point: ijk = floor((xyz - origin) / voxel_size + 1/2).
        points: one float tensor [P_m, 3] per member (world coordinates). The grid lives on `device`,
        by default on the points' device."""
        if isinstance(points, torch.Tensor):
            points = [points]
        if not points:
            raise ValueError("from_points: points must hold at least one member")
        members, _ = _members(points, device, torch.float64, "from_points", "points")
        batch = len(members)
        return GridBatch(_Grid.from_points(torch.cat(members).contiguous(), _offsets(members),
                                           _per_member(voxel_sizes, batch, "voxel_sizes", 1.0),
                                           _per_member(origins, batch, "origins", 0.0)))

    @staticmethod
    def from_mesh(meshes, voxel_sizes, origins=None, device=None):
        """Every voxel whose cube meets a triangle. meshes: one (vertices [V, 3], faces [F, 3]) pair per
        member, faces indexing that member's vertices (load_mesh returns such a pair). The grid lives
        on `device`, by default on the vertices' device."""
        if isinstance(meshes, tuple):
            meshes = [meshes]
        if not meshes:
            raise ValueError("from_mesh: meshes must hold at least one member")
        vertices, device = _members([v for v, _ in meshes], device, torch.float64, "from_mesh", "vertices")
        faces, _ = _members([f for _, f in meshes], device, torch.int32, "from_mesh", "faces")
        batch = len(meshes)
        return GridBatch(_Grid.from_mesh(torch.cat(vertices).contiguous(), _offsets(vertices),
                                         torch.cat(faces).contiguous(), _offsets(faces),
                                         _per_member(voxel_sizes, batch, "voxel_sizes", 1.0),
                                         _per_member(origins, batch, "origins", 0.0)))

    @functools.cached_property
    def device(self):
        """The torch.device the grid and everything derived from it live on."""
        return self._handle.device()

    def to(self, device):
        """This grid on `device` (self when it is there already): same voxels, order and transforms."""
        device = _device(device)
        if device == self.device:
            return self
        return GridBatch(self._handle.to(device))

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None):
        """This grid on a CUDA device: the current one, or the given index or device."""
        return self.to(torch.device("cuda", device) if isinstance(device, int) else (device or "cuda"))

    @functools.cached_property
    def batch_size(self):
        return self._handle.batch_size()

    @functools.cached_property
    def num_voxels(self):
        return self._handle.num_voxels()

    @property
    def ijk(self):
        return self._handle.ijk()

    @property
    def joffsets(self):
        """Member offsets [B + 1] int64 on the grid's device: member m owns voxels joffsets[m] ..
        joffsets[m + 1] - 1."""
        return self._handle.offsets()

    @property
    def voxel_sizes(self):
        return self._handle.voxel_sizes()

    @property
    def origins(self):
        return self._handle.origins()

    def conv_grid(self, kernel_size, stride=1):
        return GridBatch(self._handle.conv_grid(_triple(kernel_size), _triple(stride, "stride")))

    def conv_transpose_grid(self, kernel_size, stride=1):
        return GridBatch(self._handle.conv_transpose_grid(_triple(kernel_size), _triple(stride, "stride")))

    def coarsened_grid(self, factor):
        return GridBatch(self._handle.coarsened_grid(_triple(factor, "factor")))

    def pyramid(self, kernel_size, stride, levels, coarsening_factors=()):
        """Grids derived from this one, built together: (levels, coarsened), where levels[l] is
        conv_grid(kernel_size, stride) applied l + 1 times and coarsened[i] is
        coarsened_grid(coarsening_factors[i]), each equal to what those calls return. On CUDA one host
        synchronisation for all of them, where each call takes one: an encoder's strided levels and a
        decoder's coarse targets in one pass (with a kernel smaller than its stride on some axis, the
        levels take one each)."""
        levels = _integer(levels, "pyramid: levels")
        flat = []
        for factor in coarsening_factors:
            triple = _triple(factor, "coarsening factor")
            if len(triple) not in (1, 3):
                raise ValueError(f"pyramid: each coarsening factor must be an int or 3 ints, got {factor!r}")
            flat += triple * 3 if len(triple) == 1 else triple
        handles = self._handle.pyramid(_triple(kernel_size), _triple(stride, "stride"), levels, flat)
        grids = [GridBatch(h) for h in handles]
        return grids[:levels], grids[levels:]

    def refined_grid(self, factor, mask=None):
        mask = None if mask is None else _on_device(mask, self.device)
        return GridBatch(self._handle.refined_grid(_triple(factor, "factor"), mask))

    def dilated_grid(self, distance):
        return GridBatch(self._handle.dilated_grid(_integer(distance, "distance")))

    def pruned_grid(self, mask, return_index=False):
        """The voxels whose mask entry (bool or uint8, one per voxel) is nonzero, order preserved. With
        return_index=True, returns (grid, kept_index): kept_index [N_kept] int64 on the grid's device
        holds the index in this grid of each kept voxel (increasing), so that features follow as
        features.index_select(0, kept_index) with no host synchronisation (features[mask] waits for the
        device). Cost on CUDA: one host synchronisation (the kept counts)."""
        mask = _on_device(mask, self.device)
        if not return_index:
            return GridBatch(self._handle.pruned_grid(mask))
        handle, kept_index = self._handle.pruned_grid_with_index(mask)
        return GridBatch(handle), kept_index

    def merged_grid(self, other):
        return GridBatch(self._handle.merged_grid(other._handle))

    def clipped_grid(self, ijk_min, ijk_max, return_index=False):
        """The voxels of each member inside the inclusive box [ijk_min, ijk_max], in their order, with the
        transforms unchanged. ijk_min and ijk_max: integer coordinates, 3 values (one box for every
        member) or [batch_size, 3] (one per member), as a sequence or a tensor on any device (host
        metadata: a CUDA tensor costs a synchronisation); a box with ijk_min > ijk_max on some axis
        keeps nothing. With return_index=True, returns (grid, kept_index): kept_index [N_kept] int64 on
        the grid's device holds the index in this grid of each kept voxel (increasing), so that features
        follow as features[kept_index]. Cost on CUDA: one host synchronisation (the kept counts)."""
        handle, kept_index = self._handle.clipped_grid(_on_device(ijk_min, "cpu"), _on_device(ijk_max, "cpu"))
        grid = GridBatch(handle)
        return (grid, kept_index) if return_index else grid

    def ijk_to_index(self, ijk):
        """Global voxel index [Q] int64 of each coordinate (one int tensor [Q_m, 3] per member, on the
        grid's device), or -1."""
        if isinstance(ijk, torch.Tensor):
            ijk = [ijk]
        if len(ijk) != self.batch_size:
            raise ValueError(f"ijk_to_index: expected {self.batch_size} query lists, got {len(ijk)}")
        members = [t.reshape(-1, 3).to(torch.int32)
                   for t in _int32([_on_device(m, self.device) for m in ijk], "ijk_to_index", "ijk")]
        return self._handle.ijk_to_index(torch.cat(members).contiguous(), _offsets(members))

    def bbox(self):
        """Per-member inclusive bounds of the voxels: int32 [batch_size, 2, 3] on the grid's device, [m, 0]
        the smallest and [m, 1] the largest (i, j, k) of member m. An empty member has hi < lo (lo = 0,
        hi = -1 on every axis). No host synchronisation."""
        return self._handle.bbox()

    def __repr__(self):
        return f"GridBatch(batch_size={self.batch_size}, num_voxels={self.num_voxels}, device={self.device})"

    def __reduce__(self):
        """Pickling (pickle, torch.save, data-loader workers): the coordinates and member offsets as
        tensors on the grid's device, and the transforms. Unpickling rebuilds the grid on the device its
        coordinates load on, with the same voxels in the same order (the order is a function of the
        coordinate set), so torch.load(..., map_location="cpu") brings a CUDA grid to the CPU. Plans
        cached on the grid are not saved; they are rebuilt on first use."""
        return (_restore_grid, (self.ijk, self.joffsets, self.voxel_sizes, self.origins))

    def __copy__(self):
        return self  # immutable: a copy is the grid itself

    def __deepcopy__(self, memo):
        return self  # immutable, like a tuple of numbers: copying a model shares its grids


def _restore_grid(ijk, joffsets, voxel_sizes, origins):
    """Unpickles a GridBatch (see GridBatch.__reduce__): a grid from tensors only, so safe to allow in
    torch.load(weights_only=True)."""
    if not all(isinstance(t, torch.Tensor) for t in (ijk, joffsets, voxel_sizes, origins)):
        raise TypeError("GridBatch unpickling: expected four tensors (ijk, joffsets, voxel_sizes, origins)")
    return GridBatch(_Grid.from_ijk(ijk.contiguous(), joffsets.cpu(), voxel_sizes.cpu().double(),
                                    origins.cpu().double()))


if hasattr(torch.serialization, "add_safe_globals"):
    # torch.load defaults to weights_only=True from torch 2.6: grids in a checkpoint load there too.
    torch.serialization.add_safe_globals([_restore_grid])


class ConvolutionPlan:
    """The kernel map between two grids and the convolution over it (see convolution.h)."""

    def __init__(self, handle):
        self._handle = handle

    def __reduce__(self):
        raise TypeError("ConvolutionPlan cannot be pickled: pickle its grids (GridBatch pickles) and build the "
                        "plan again, which is cheap")

    def __copy__(self):
        return self  # immutable

    def __deepcopy__(self, memo):
        return self

    @staticmethod
    def from_grid(source, kernel_size, stride=1, target=None):
        """Forward (strided) convolution; target None means source.conv_grid(kernel_size, stride)."""
        return ConvolutionPlan(_Plan.make(source._handle, _triple(kernel_size), _triple(stride, "stride"),
                                          None if target is None else target._handle, False))

    @staticmethod
    def from_grid_transposed(source, kernel_size, stride=1, target=None):
        """Transposed convolution; target None means source.conv_transpose_grid(kernel_size, stride)."""
        return ConvolutionPlan(_Plan.make(source._handle, _triple(kernel_size), _triple(stride, "stride"),
                                          None if target is None else target._handle, True))

    def transposed(self):
        return ConvolutionPlan(self._handle.transposed())

    @functools.cached_property
    def source_grid(self):
        """The same GridBatch object at every read (so that its cached plans and sizes are shared)."""
        return GridBatch(self._handle.source_grid())

    @functools.cached_property
    def target_grid(self):
        return GridBatch(self._handle.target_grid())

    @property
    def is_identity(self):
        return self._handle.is_identity()

    @property
    def device(self):
        """The device of the plan's grids and maps; features and weights must be there."""
        return self._handle.device()

    def target_map(self):
        """Neighbour map [num_target, kernel_volume] int32, -1 where there is no edge."""
        return self._handle.target_map()

    def execute(self, features, weight):
        """features [N_source, Cin], weight [Cout, Cin, K0, K1, K2] -> [N_target, Cout], differentiable.
        Both on the plan's device with one dtype: float32 or float64, or float16 / bfloat16 on CUDA
        (accumulated in float32). float16 / bfloat16 features also take a float32 weight (as autocast
        runs a layer): it is rounded to the features' dtype as it is packed, so the output and the
        features' gradient are bitwise those of converting it first, and its gradient is float32 (the
        float32 sums, not rounded to 16 bits). Float32 on CUDA runs on TF32 tensor cores exactly when PyTorch allows
        TF32 for its own float32 matrix products (torch.backends.cuda.matmul.allow_tf32, or
        torch.set_float32_matmul_precision("high")); off by default. No host synchronisation, forward or
        backward."""
        if _compile.compiling():
            return _compile.run(self, features, weight)  # traced by torch.compile (see _compile.py)
        if not (isinstance(features, torch.Tensor) and isinstance(weight, torch.Tensor)):
            name, value = ("features", features) if not isinstance(features, torch.Tensor) else ("weight", weight)
            raise TypeError(f"ConvolutionPlan.execute: {name} must be a torch.Tensor, got {type(value).__name__}")
        # The plan's execute method: the autograd of the operator torch.ops.sparsegrid.sparse_conv (in
        # C++, for LibTorch too), without the operator's schema parsing per call; no autograd node when
        # nothing can ask for a gradient.
        return self._handle.execute(features, weight)


# Grids and plans run eagerly under torch.compile (a graph break at each call, see _compile.py); the
# convolution itself is traced.
_compile.eager_only(GridBatch)
_compile.eager_only(ConvolutionPlan, keep=("execute",))


def convolution_seconds():
    """Seconds this process has spent in convolution calls (forward and backward), for step profiles.
    Host time: on CUDA it counts queueing the work, not running it (synchronise to measure that)."""
    return torch.ops.sparsegrid.convolution_seconds()


def host_synchronizations():
    """Times the library has waited for a CUDA stream so far (process-wide): read it before and after an
    operation to count that operation's synchronisations. Always 0 on the CPU."""
    return torch.ops.sparsegrid.host_synchronizations()


def convolution_engine_configurations():
    """Names of the tile configurations of the CUDA tensor-core convolution engine (forward and input
    gradient ones, then weight-gradient ones starting with "w"); empty without CUDA. Those starting with
    "g" or "wg" use Hopper's warpgroup products on compute capability 9.0 ("g" in float16, bfloat16 and
    TF32, "wg" in float16 and bfloat16; elsewhere a forced one gives way to the automatic choice). Every configuration gives bitwise the same result."""
    return list(torch.ops.sparsegrid.convolution_engine_configurations())


def set_convolution_engine_configuration(name):
    """For measurements: runs every following CUDA tensor-core convolution of the process on one
    configuration; "auto" restores the automatic (or tuned) choice, "off" runs the tiled kernels the
    engine replaced."""
    if not isinstance(name, str):
        raise TypeError(f"set_convolution_engine_configuration: name must be a str, got {type(name).__name__}")
    torch.ops.sparsegrid.set_convolution_engine_configuration(name)


def set_convolution_engine_tuning(enabled, file=""):
    """With `enabled`, the first CUDA execution of each convolution shape times every configuration of the
    engine (it waits for the GPU: let it happen in a warm-up step) and keeps the fastest. `file`, when
    given, is read now and rewritten with each new choice, so that later processes start tuned. Results
    are bitwise the same whichever configuration runs."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_convolution_engine_tuning: enabled must be a bool, got {type(enabled).__name__}")
    torch.ops.sparsegrid.set_convolution_engine_tuning(enabled, os.fspath(file))


def mesh_loading_available():
    """Always True: every build reads the formats of load_mesh (kept for code that checked it)."""
    return torch.ops.sparsegrid.mesh_loading_available()


def cuda_backend_available():
    """True when the library was built with its CUDA backend (grids on CUDA tensors need it)."""
    return torch.ops.sparsegrid.cuda_backend_available()


def load_mesh(path):
    """A triangle mesh file (.obj, .off, .ply, .stl; others are refused): (vertices [V, 3] float64,
    faces [F, 3] int32). Raises naming the file and the reason for a malformed one."""
    return torch.ops.sparsegrid.load_mesh(str(path))


def synthetic_shapes(batch_size, resolution, seed=0, device=None):
    """Surface voxels of procedural closed shapes (ellipsoids, tori, boxes, capsules) in [0, resolution)^3,
    deterministic by seed: a list of int32 tensors [N_m, 3], one per shape, on `device` (default CPU)."""
    batch_size = _integer(batch_size, "synthetic_shapes: batch_size")
    ijk, offsets = torch.ops.sparsegrid.synthetic_surface_batch(
        batch_size, _integer(resolution, "synthetic_shapes: resolution"), _integer(seed, "synthetic_shapes: seed"))
    if device is not None:
        ijk = ijk.to(_device(device))
    offsets = offsets.tolist()
    return [ijk[offsets[m]:offsets[m + 1]] for m in range(batch_size)]


def sparse_conv(features, weight, plan):
    """Functional form of ConvolutionPlan.execute."""
    return plan.execute(features, weight)


from . import nn  # noqa: E402  (the modules need the classes above)
