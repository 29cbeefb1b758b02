"""sparsegrid: batched sparse voxel grids and sparse convolution for PyTorch.

A thin layer over the C++ library's TorchScript classes (torch.classes.sparsegrid.*). Grids are
immutable batches of sparse voxel grids; features are plain tensors [num_voxels, channels] in the
grid's voxel order (member-major, then Morton order, see the README).
"""

import os
import pathlib

import torch

__all__ = ["GridBatch", "ConvolutionPlan", "sparse_conv", "synthetic_shapes", "load_mesh", "convolution_seconds",
           "library_path", "nn"]


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


def _triple(value, name):
    if isinstance(value, int):
        return [value, value, value]
    values = [int(v) for v in value]
    if len(values) != 3:
        raise ValueError(f"{name} must be an int or 3 ints, got {value!r}")
    return values


def _per_member(value, batch_size, name, default):
    """A [B, 3] float64 tensor from a scalar, a 3-sequence or a [B, 3] tensor."""
    if value is None:
        value = default
    t = torch.as_tensor(value, dtype=torch.float64)
    if t.dim() == 0:
        t = t.expand(3)
    if t.dim() == 1:
        if t.numel() != 3:
            raise ValueError(f"{name} must be a scalar, 3 values or [batch_size, 3], got shape {tuple(t.shape)}")
        t = t.expand(batch_size, 3)
    if tuple(t.shape) != (batch_size, 3):
        raise ValueError(f"{name} must have shape [{batch_size}, 3], got {tuple(t.shape)}")
    return t.contiguous()


class GridBatch:
    """An immutable batch of sparse voxel grids (see include/sparsegrid/grid_batch.h)."""

    def __init__(self, handle):
        self._handle = handle

    @staticmethod
    def from_ijk(ijk, voxel_sizes=None, origins=None):
        """From one int tensor [N_m, 3] per member (any order, duplicates removed)."""
        if isinstance(ijk, torch.Tensor):
            ijk = [ijk]
        members = [torch.as_tensor(m).reshape(-1, 3).to(torch.int32) for m in ijk]
        if not members:
            raise ValueError("from_ijk: ijk must hold at least one member")
        offsets = torch.tensor([0] + [m.shape[0] for m in members], dtype=torch.int64).cumsum(0)
        flat = torch.cat(members) if members else torch.zeros((0, 3), dtype=torch.int32)
        batch = len(members)
        return GridBatch(_Grid.from_ijk(flat.contiguous(), offsets,
                                        _per_member(voxel_sizes, batch, "voxel_sizes", 1.0),
                                        _per_member(origins, batch, "origins", 0.0)))

    @staticmethod
    def from_points(points, voxel_sizes, origins=None):
        """The voxels containing at least one point: ijk = floor((xyz - origin) / voxel_size + 1/2).
        points: one float tensor [P_m, 3] per member (world coordinates)."""
        if isinstance(points, torch.Tensor):
            points = [points]
        if not points:
            raise ValueError("from_points: points must hold at least one member")
        members = [torch.as_tensor(p, dtype=torch.float64).reshape(-1, 3) for p in points]
        offsets = torch.tensor([0] + [m.shape[0] for m in members], dtype=torch.int64).cumsum(0)
        batch = len(members)
        return GridBatch(_Grid.from_points(torch.cat(members).contiguous(), offsets,
                                           _per_member(voxel_sizes, batch, "voxel_sizes", 1.0),
                                           _per_member(origins, batch, "origins", 0.0)))

    @staticmethod
    def from_mesh(meshes, voxel_sizes, origins=None):
        """Every voxel whose cube meets a triangle. meshes: one (vertices [V, 3], faces [F, 3]) pair per
        member, faces indexing that member's vertices (load_mesh returns such a pair)."""
        if isinstance(meshes, tuple):
            meshes = [meshes]
        if not meshes:
            raise ValueError("from_mesh: meshes must hold at least one member")
        vertices = [torch.as_tensor(v, dtype=torch.float64).reshape(-1, 3) for v, _ in meshes]
        faces = [torch.as_tensor(f).reshape(-1, 3).to(torch.int32) for _, f in meshes]
        vertex_offsets = torch.tensor([0] + [v.shape[0] for v in vertices], dtype=torch.int64).cumsum(0)
        face_offsets = torch.tensor([0] + [f.shape[0] for f in faces], dtype=torch.int64).cumsum(0)
        batch = len(meshes)
        return GridBatch(_Grid.from_mesh(torch.cat(vertices).contiguous(), vertex_offsets,
                                         torch.cat(faces).contiguous(), face_offsets,
                                         _per_member(voxel_sizes, batch, "voxel_sizes", 1.0),
                                         _per_member(origins, batch, "origins", 0.0)))

    @property
    def batch_size(self):
        return self._handle.batch_size()

    @property
    def num_voxels(self):
        return self._handle.num_voxels()

    @property
    def ijk(self):
        return self._handle.ijk()

    @property
    def joffsets(self):
        """Member offsets [B + 1]: member m owns voxels joffsets[m] .. joffsets[m + 1] - 1."""
        return self._handle.offsets()

    @property
    def voxel_sizes(self):
        return self._handle.voxel_sizes()

    @property
    def origins(self):
        return self._handle.origins()

    def conv_grid(self, kernel_size, stride=1):
        return GridBatch(self._handle.conv_grid(_triple(kernel_size, "kernel_size"), _triple(stride, "stride")))

    def conv_transpose_grid(self, kernel_size, stride=1):
        return GridBatch(self._handle.conv_transpose_grid(_triple(kernel_size, "kernel_size"),
                                                          _triple(stride, "stride")))

    def coarsened_grid(self, factor):
        return GridBatch(self._handle.coarsened_grid(_triple(factor, "factor")))

    def refined_grid(self, factor, mask=None):
        return GridBatch(self._handle.refined_grid(_triple(factor, "factor"), mask))

    def dilated_grid(self, distance):
        return GridBatch(self._handle.dilated_grid(int(distance)))

    def pruned_grid(self, mask):
        return GridBatch(self._handle.pruned_grid(mask))

    def merged_grid(self, other):
        return GridBatch(self._handle.merged_grid(other._handle))

    def ijk_to_index(self, ijk):
        """Global voxel index of each coordinate (one int tensor [Q_m, 3] per member), or -1."""
        if isinstance(ijk, torch.Tensor):
            ijk = [ijk]
        if len(ijk) != self.batch_size:
            raise ValueError(f"ijk_to_index: expected {self.batch_size} query lists, got {len(ijk)}")
        members = [torch.as_tensor(m).reshape(-1, 3).to(torch.int32) for m in ijk]
        offsets = torch.tensor([0] + [m.shape[0] for m in members], dtype=torch.int64).cumsum(0)
        return self._handle.ijk_to_index(torch.cat(members).contiguous(), offsets)

    def __repr__(self):
        return f"GridBatch(batch_size={self.batch_size}, num_voxels={self.num_voxels})"


class ConvolutionPlan:
    """The kernel map between two grids and the convolution over it (see convolution.h)."""

    def __init__(self, handle):
        self._handle = handle

    @staticmethod
    def from_grid(source, kernel_size, stride=1, target=None):
        """Forward (strided) convolution; target None means source.conv_grid(kernel_size, stride)."""
        return ConvolutionPlan(_Plan.make(source._handle, _triple(kernel_size, "kernel_size"),
                                          _triple(stride, "stride"), None if target is None else target._handle,
                                          False))

    @staticmethod
    def from_grid_transposed(source, kernel_size, stride=1, target=None):
        """Transposed convolution; target None means source.conv_transpose_grid(kernel_size, stride)."""
        return ConvolutionPlan(_Plan.make(source._handle, _triple(kernel_size, "kernel_size"),
                                          _triple(stride, "stride"), None if target is None else target._handle,
                                          True))

    def transposed(self):
        return ConvolutionPlan(self._handle.transposed())

    @property
    def source_grid(self):
        return GridBatch(self._handle.source_grid())

    @property
    def target_grid(self):
        return GridBatch(self._handle.target_grid())

    @property
    def is_identity(self):
        return self._handle.is_identity()

    def target_map(self):
        """Neighbour map [num_target, kernel_volume] int32, -1 where there is no edge."""
        return self._handle.target_map()

    def execute(self, features, weight):
        """features [N_source, Cin], weight [Cout, Cin, K0, K1, K2] -> [N_target, Cout], differentiable."""
        return torch.ops.sparsegrid.sparse_conv(features, weight, self._handle)


def convolution_seconds():
    """Seconds this process has spent executing convolutions (forward and backward), for step profiles."""
    return torch.ops.sparsegrid.convolution_seconds()


def load_mesh(path):
    """A triangle mesh file (OBJ, PLY, STL, OFF, glTF, ... through assimp): (vertices [V, 3] float64,
    faces [F, 3] int32)."""
    return torch.ops.sparsegrid.load_mesh(str(path))


def synthetic_shapes(batch_size, resolution, seed=0):
    """Surface voxels of procedural closed shapes (ellipsoids, tori, boxes, capsules) in [0, resolution)^3,
    deterministic by seed: a list of int32 tensors [N_m, 3], one per shape."""
    ijk, offsets = torch.ops.sparsegrid.synthetic_surface_batch(int(batch_size), int(resolution), int(seed))
    return [ijk[offsets[m]:offsets[m + 1]] for m in range(int(batch_size))]


def sparse_conv(features, weight, plan):
    """Functional form of ConvolutionPlan.execute."""
    return plan.execute(features, weight)


from . import nn  # noqa: E402  (the modules need the classes above)
