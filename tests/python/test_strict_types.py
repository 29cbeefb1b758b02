"""Strict types at every entry point of the Python package and the torch operators: integer coordinates
only (int32, or int64 within the int32 range), bool or uint8 masks only, features and weights in the
supported float dtypes only. Each case is an entry point called with a bad type; it must raise an error
naming the argument, never convert silently. The same entry points accept the good types."""

import numpy as np
import pytest
import torch

import sparsegrid as sg
from sparsegrid import nn as snn

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and sg.cuda_backend_available() else [])


def small_grid(device):
    return sg.GridBatch.from_ijk([torch.tensor([[0, 0, 0], [1, 0, 0], [0, 2, 1]]), torch.tensor([[5, 5, 5]])],
                                 device=device)


def tetrahedron(dtype_faces=torch.int32):
    vertices = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
                            dtype=torch.float64)
    faces = torch.tensor([[0, 1, 2], [0, 1, 3], [0, 2, 3], [1, 2, 3]], dtype=dtype_faces)
    return vertices, faces


def bad_coordinate_cases(device):
    """(name, callable, exception, message pattern) for coordinates of a bad type or range."""
    grid = small_grid(device)
    return [
        ("from_ijk float tensor", lambda: sg.GridBatch.from_ijk(torch.tensor([[0.7, 0.2, 0.1]]), device=device),
         TypeError, "from_ijk: ijk must hold integers"),
        ("from_ijk float list", lambda: sg.GridBatch.from_ijk([[[0.7, 0.2, 0.1]]], device=device),
         TypeError, "from_ijk: ijk must hold integers"),
        ("from_ijk bool tensor", lambda: sg.GridBatch.from_ijk(torch.ones(2, 3, dtype=torch.bool), device=device),
         TypeError, "from_ijk: ijk must hold integers"),
        ("from_ijk int64 above int32", lambda: sg.GridBatch.from_ijk(torch.tensor([[2**31, 0, 0]]), device=device),
         ValueError, "from_ijk: ijk values must lie in the int32 range"),
        ("from_ijk int64 below int32",
         lambda: sg.GridBatch.from_ijk(torch.tensor([[0, -2**31 - 1, 0]]), device=device),
         ValueError, "from_ijk: ijk values must lie in the int32 range"),
        ("from_mesh float faces",
         lambda: sg.GridBatch.from_mesh([tetrahedron(torch.float32)], voxel_sizes=0.25, device=device),
         TypeError, "from_mesh: faces must hold integers"),
        ("ijk_to_index float query", lambda: grid.ijk_to_index([torch.tensor([[0.5, 0.0, 0.0]]),
                                                                torch.zeros(0, 3, dtype=torch.int32)]),
         TypeError, "ijk_to_index: ijk must hold integers"),
        ("clipped_grid float box", lambda: grid.clipped_grid(torch.tensor([0.0, 0.0, 0.0]), [1, 1, 1]),
         RuntimeError, "clipped_grid: ijk_min must have an integer dtype"),
    ]


def bad_mask_cases(device):
    grid = small_grid(device)
    n = grid.num_voxels
    features = snn.SparseFeatures(grid, torch.randn(n, 2, device=device))
    return [
        ("pruned_grid float mask", lambda: grid.pruned_grid(torch.full((n,), 0.7, device=device)),
         RuntimeError, "pruned_grid: mask must be bool or uint8, got Float"),
        ("pruned_grid int64 mask", lambda: grid.pruned_grid(torch.ones(n, dtype=torch.int64, device=device)),
         RuntimeError, "pruned_grid: mask must be bool or uint8, got Long"),
        ("pruned_grid float mask with index",
         lambda: grid.pruned_grid(torch.full((n,), 0.7, device=device), return_index=True),
         RuntimeError, "pruned_grid: mask must be bool or uint8, got Float"),
        ("pruned_grid short mask with index",
         lambda: grid.pruned_grid(torch.ones(n - 1, dtype=torch.bool, device=device), return_index=True),
         RuntimeError, "mask"),
        ("Prune short mask", lambda: snn.Prune()(features, torch.ones(n - 1, dtype=torch.bool, device=device)),
         ValueError, f"Prune: mask must have {n} entries, got {n - 1}"),
        ("refined_grid float mask", lambda: grid.refined_grid(2, torch.ones(n, device=device)),
         RuntimeError, "refined_grid: mask must be bool or uint8, got Float"),
        ("Prune float mask", lambda: snn.Prune()(features, torch.full((n,), 0.2, device=device)),
         TypeError, "Prune: mask must be bool or uint8"),
    ]


def bad_feature_cases(device):
    grid = small_grid(device)
    n = grid.num_voxels
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 1, target=grid)
    weight = torch.randn(4, 2, 3, 3, 3, device=device)
    cases = [
        ("execute int features", lambda: plan.execute(torch.ones(n, 2, dtype=torch.int32, device=device), weight),
         RuntimeError, "input must be float32 or float64"),
        ("execute int weight",
         lambda: plan.execute(torch.randn(n, 2, device=device), torch.ones(4, 2, 3, 3, 3, dtype=torch.int64,
                                                                            device=device)),
         RuntimeError, r"weight must have the dtype of input \(Float\), got Long"),
        ("execute complex features",
         lambda: plan.execute(torch.randn(n, 2, dtype=torch.complex64, device=device), weight),
         RuntimeError, "input must be float32 or float64"),
        ("sparse_conv op int features",
         lambda: torch.ops.sparsegrid.sparse_conv(torch.ones(n, 2, dtype=torch.int64, device=device), weight,
                                                  plan._handle),
         RuntimeError, "input must be float32 or float64"),
    ]
    if device == "cpu":
        cases.append(("execute float16 on the CPU",
                      lambda: plan.execute(torch.randn(n, 2).half(), weight.half()),
                      RuntimeError, "float16 and bfloat16 run on CUDA only"))
    return cases


def bad_size_cases(device):
    """Kernel sizes, strides, factors and counts: integers only (a float would be truncated)."""
    grid = small_grid(device)
    return [
        ("conv_grid float kernel size", lambda: grid.conv_grid((2.5, 2, 2), 2), TypeError,
         "kernel_size must be an int or a sequence of ints"),
        ("conv_grid float stride", lambda: grid.conv_grid(3, 2.0), TypeError,
         "stride must be an int or a sequence of ints"),
        ("conv_transpose_grid bool kernel size", lambda: grid.conv_transpose_grid(True, 1), TypeError,
         "kernel_size must be an int"),
        ("coarsened_grid float factor", lambda: grid.coarsened_grid([2, 2.0, 2]), TypeError,
         "factor must be an int or a sequence of ints"),
        ("refined_grid float factor", lambda: grid.refined_grid(1.5), TypeError, "factor must be an int"),
        ("dilated_grid float distance", lambda: grid.dilated_grid(1.5), TypeError, "distance must be an int"),
        ("pyramid float levels", lambda: grid.pyramid(3, 2, 2.0), TypeError, "pyramid: levels must be an int"),
        ("pyramid float coarsening factor", lambda: grid.pyramid(3, 2, 1, [2.5]), TypeError,
         "coarsening factor must be an int"),
        ("synthetic_shapes float resolution", lambda: sg.synthetic_shapes(2, 31.5), TypeError,
         "synthetic_shapes: resolution must be an int"),
        ("from_grid float stride", lambda: sg.ConvolutionPlan.from_grid(grid, 3, (1, 1, 1.0)), TypeError,
         "stride must be an int"),
        ("SparseConv3d float kernel size", lambda: snn.SparseConv3d(2, 2, 3.0), TypeError,
         "kernel_size must be an int"),
        ("SparseMaxPool3d float stride", lambda: snn.SparseMaxPool3d(2, 2.0), TypeError, "stride must be an int"),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group", [bad_coordinate_cases, bad_mask_cases, bad_feature_cases, bad_size_cases])
def test_every_entry_point_rejects_bad_types(device, group):
    cases = group(device)
    assert cases
    for name, call, exception, pattern in cases:
        with pytest.raises(exception, match=pattern):
            call()
            pytest.fail(f"{name}: no error")


@pytest.mark.parametrize("device", DEVICES)
def test_good_types_are_accepted(device):
    expected = small_grid("cpu").ijk
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        grid = sg.GridBatch.from_ijk([torch.tensor([[0, 0, 0], [1, 0, 0], [0, 2, 1]], dtype=dtype),
                                      torch.tensor([[5, 5, 5]], dtype=dtype)], device=device)
        assert torch.equal(grid.ijk.cpu(), expected), dtype
    # int64 at the ends of the int32 range is exact.
    far = sg.GridBatch.from_ijk(torch.tensor([[-2**31, 2**31 - 1, 0]]), device=device)
    assert far.ijk.cpu().tolist() == [[-2**31, 2**31 - 1, 0]]
    # An empty member given as an empty list is fine.
    assert sg.GridBatch.from_ijk([[[1, 2, 3]], []], device=device).joffsets.tolist() == [0, 1, 1]
    grid = small_grid(device)
    n = grid.num_voxels
    for mask_dtype in (torch.bool, torch.uint8):
        mask = (torch.arange(n, device=device) % 2 == 0).to(mask_dtype)
        assert grid.pruned_grid(mask).num_voxels == int(mask.sum())
        assert snn.Prune()(snn.SparseFeatures(grid, torch.randn(n, 1, device=device)), mask).grid.num_voxels == \
            int(mask.sum())
    vertices, faces = tetrahedron(torch.int64)
    assert sg.GridBatch.from_mesh([(vertices, faces)], voxel_sizes=0.25, device=device).num_voxels > 0
    # Sizes: ints, sequences of ints, and the integer scalars and arrays of torch and numpy.
    want = grid.conv_grid((3, 3, 3), (2, 2, 2)).ijk
    for kernel, stride in ((3, 2), (torch.tensor(3), np.int64(2)), (np.array([3, 3, 3]), torch.Size([2, 2, 2])),
                           (torch.tensor([3, 3, 3]), [2])):
        assert torch.equal(grid.conv_grid(kernel, stride).ijk, want), (kernel, stride)
