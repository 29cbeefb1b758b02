"""Grids past 80 million voxels, where N x 27 passes 2^31: the k3s1 plan and convolutions (forward, input
and weight gradient, float32 and float16) on a dense cube of 470^3 = 103,823,000 voxels, and the
generative k2s2 transposed convolution to 660^3 = 287,496,000 voxels (8 x N past 2^31), spot-checked
against values computed here from the coordinates alone. Needs a CUDA device with about 40 GB free and
runs only when SPARSEGRID_HUGE_TESTS=1 (scripts/gpu-check.sh, phase huge); prints the time and the peak
device memory of each step."""

import os
import time

import pytest
import torch

import sparsegrid as sg

# SPARSEGRID_HUGE_SIDE and SPARSEGRID_HUGE_DEVICE run the same checks small (a check of the test itself).
SIDE = int(os.environ.get("SPARSEGRID_HUGE_SIDE", "470"))  # 470^3 = 103,823,000 voxels: N x 27 > 2^31
DEVICE = os.environ.get("SPARSEGRID_HUGE_DEVICE", "cuda")

pytestmark = pytest.mark.skipif(
    os.environ.get("SPARSEGRID_HUGE_TESTS") != "1" or
    (DEVICE == "cuda" and not (torch.cuda.is_available() and sg.cuda_backend_available())),
    reason="huge-grid tests run on a CUDA device with SPARSEGRID_HUGE_TESTS=1")


def _step(name, function):
    cuda = DEVICE == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = function()
    if cuda:
        torch.cuda.synchronize()
    peak = f", peak device memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if cuda else ""
    print(f"{name}: {time.perf_counter() - start:.3f} s{peak}")
    return result


def _offsets(plan_map, ijk):
    """The (di, dj, dk) of each tap, read off an interior row, and checked to be the 27 offsets in [-1, 1]."""
    centre = torch.tensor([SIDE // 2] * 3, device=ijk.device, dtype=torch.int32)
    row = int(((ijk == centre).all(dim=1)).nonzero()[0])
    offsets = (ijk[plan_map[row].long()] - ijk[row]).cpu()
    expected = torch.tensor([[a, b, c] for a in (-1, 0, 1) for b in (-1, 0, 1) for c in (-1, 0, 1)], dtype=torch.int32)
    assert torch.equal(offsets, expected), offsets
    return offsets


def test_k3s1_plan_and_convolution_past_2_to_the_31_map_entries():
    device = torch.device(DEVICE)
    axis = torch.arange(SIDE, device=device, dtype=torch.int32)
    ijk = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(-1, 3)
    n = ijk.shape[0]
    assert n * 27 > 2**31 or SIDE != 470
    grid = _step(f"from_ijk ({n} voxels)", lambda: sg.GridBatch.from_ijk(ijk, device=device))
    del ijk
    assert grid.num_voxels == n
    plan = _step("k3s1 plan (maps)", lambda: sg.ConvolutionPlan.from_grid(grid, 3, 1, grid))
    plan_map = _step("target map", plan.target_map)
    coords = grid.ijk
    offsets = _offsets(plan_map, coords)

    # Rows spread over the whole grid, the last ones included (their map entries sit past 2^31).
    generator = torch.Generator().manual_seed(0)
    rows = torch.cat([torch.randint(0, n, (400,), generator=generator), torch.arange(n - 100, n)]).to(device)
    expected = coords[rows].unsqueeze(1) + offsets.to(device).unsqueeze(0)  # [R, 27, 3]
    inside = ((expected >= 0) & (expected < SIDE)).all(dim=2)
    sampled = plan_map[rows].long()
    assert torch.equal(sampled >= 0, inside)
    assert torch.equal(coords[sampled.clamp(min=0)][inside], expected[inside])

    channels = 8
    dtypes = ((torch.float32, 1e-5), (torch.float16, 2e-3)) if DEVICE == "cuda" else ((torch.float32, 1e-5),)
    for dtype, tolerance in dtypes:
        x = torch.randn(n, channels, device=device, dtype=dtype)
        w = (torch.randn(channels, channels, 3, 3, 3, device=device) / 16).to(dtype)
        x.requires_grad_(True)
        w.requires_grad_(True)
        y = _step(f"forward {dtype}", lambda: plan.execute(x, w))
        grad = torch.randn(n, channels, device=device, dtype=dtype)
        _step(f"backward {dtype}", lambda: y.backward(grad))
        taps = w.detach().double().reshape(channels, channels, 27)  # [out, in, tap]
        # Forward: y[r] = sum_t W_t x[map[r, t]].
        gathered = x.detach().double()[sampled.clamp(min=0)] * inside.unsqueeze(2)  # [R, 27, Cin]
        reference = torch.einsum("oit,rti->ro", taps, gathered)
        error = (y.detach()[rows].double() - reference).norm() / reference.norm()
        assert error < tolerance, f"forward {dtype}: relative error {error:.2e}"
        # Input gradient: grad_x[s] = sum_t W_t^T grad[map[s, 26 - t]] (k3s1 maps are symmetric).
        mirrored = sampled.flip(1)
        gathered = grad.double()[mirrored.clamp(min=0)] * (mirrored >= 0).unsqueeze(2)
        reference = torch.einsum("oit,rto->ri", taps, gathered)
        error = (x.grad[rows].double() - reference).norm() / reference.norm()
        assert error < tolerance, f"input gradient {dtype}: relative error {error:.2e}"
        del x, w, y, grad, gathered

    # Weight gradient with unit features and gradients: dW[o, i, t] = the number of edges at tap t,
    # (SIDE - |di|)(SIDE - |dj|)(SIDE - |dk|), up to 103,823,000 summed ones per entry.
    x = torch.ones(n, 2, device=device)
    w = torch.zeros(2, 2, 3, 3, 3, device=device, requires_grad=True)
    y = plan.execute(x, w)
    _step("weight gradient of ones", lambda: y.backward(torch.ones_like(y)))
    counts = torch.tensor([float((SIDE - abs(int(a))) * (SIDE - abs(int(b))) * (SIDE - abs(int(c))))
                           for a, b, c in offsets.tolist()], dtype=torch.float64)
    got = w.grad.double().reshape(2, 2, 27).cpu()
    error = ((got - counts).abs() / counts).max()
    assert error < 1e-5, f"weight gradient: largest relative error {error:.2e} (of counts up to {int(counts.max())})"


COARSE_SIDE = int(os.environ.get("SPARSEGRID_HUGE_COARSE_SIDE", "330"))  # fine 660^3 = 287,496,000 voxels


def test_generative_k2s2_past_2_to_the_31_map_entries():
    """The generative K = S = 2 transposed convolution from a dense cube of 330^3 = 35,937,000 voxels to its
    subdivision of 287,496,000 voxels: 8 x N (the fine rows' map entries) passes 2^31. Each fine voxel has
    exactly one edge, from its parent at the tap of its corner."""
    device = torch.device(DEVICE)
    axis = torch.arange(COARSE_SIDE, device=device, dtype=torch.int32)
    coarse = sg.GridBatch.from_ijk(torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), -1).reshape(-1, 3))
    plan = _step("k2s2 generative plan", lambda: sg.ConvolutionPlan.from_grid_transposed(coarse, 2, 2))
    fine = plan.target_grid
    n = fine.num_voxels
    assert n == 8 * coarse.num_voxels and (8 * n > 2**31 or COARSE_SIDE != 330)

    channels = 4
    x = torch.randn(coarse.num_voxels, channels, device=device, requires_grad=True)
    w = torch.randn(channels, channels, 2, 2, 2, device=device, requires_grad=True)
    y = _step("k2s2 forward float32", lambda: plan.execute(x, w))
    grad = torch.randn(n, channels, device=device)
    _step("k2s2 backward float32", lambda: y.backward(grad))

    generator = torch.Generator().manual_seed(1)
    rows = torch.cat([torch.randint(0, n, (400,), generator=generator), torch.arange(n - 100, n)]).to(device)
    fine_ijk = fine.ijk[rows]
    parents = coarse.ijk_to_index(fine_ijk // 2)
    assert (parents >= 0).all()
    corner = fine_ijk % 2
    taps = w.detach().double()[:, :, corner[:, 0].long(), corner[:, 1].long(), corner[:, 2].long()]  # [o, i, R]
    reference = torch.einsum("oir,ri->ro", taps, x.detach().double()[parents])
    error = (y.detach()[rows].double() - reference).norm() / reference.norm()
    assert error < 1e-5, f"k2s2 forward: relative error {error:.2e}"
    # Input gradient of sampled parents: the sum over their 8 children.
    parent_rows = parents[:50]
    children = fine.ijk_to_index((coarse.ijk[parent_rows].unsqueeze(1) * 2 + torch.tensor(
        [[a, b, c] for a in (0, 1) for b in (0, 1) for c in (0, 1)], device=device, dtype=torch.int32)).reshape(-1, 3))
    children = children.reshape(-1, 8)
    assert (children >= 0).all()
    weights = w.detach().double().reshape(channels, channels, 8)  # tap t = 4 a + 2 b + c
    reference = torch.einsum("oit,pto->pi", weights, grad.double()[children])
    error = (x.grad[parent_rows].double() - reference).norm() / reference.norm()
    assert error < 1e-5, f"k2s2 input gradient: relative error {error:.2e}"
    # Weight gradient with unit features and gradients: every tap has one edge per coarse voxel.
    ones = torch.ones(coarse.num_voxels, 1, device=device)
    w1 = torch.zeros(1, 1, 2, 2, 2, device=device, requires_grad=True)
    y1 = plan.execute(ones, w1)
    _step("k2s2 weight gradient of ones", lambda: y1.backward(torch.ones_like(y1)))
    error = ((w1.grad.double().cpu() - coarse.num_voxels).abs() / coarse.num_voxels).max()
    assert error < 1e-5, f"k2s2 weight gradient: largest relative error {error:.2e}"
