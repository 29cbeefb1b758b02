"""The PyTorch layer against dense oracles: features scattered into a dense canvas per member,
torch conv3d / conv_transpose3d, read back at the target voxels (float64)."""

import itertools
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import sparsegrid as sg
from sparsegrid import nn as snn

CASES = [
    ((3, 3, 3), (1, 1, 1)),
    ((2, 2, 2), (2, 2, 2)),
    ((3, 3, 3), (2, 2, 2)),
    ((1, 1, 1), (1, 1, 1)),
    ((3, 2, 5), (1, 2, 3)),
    ((4, 1, 2), (2, 1, 1)),
    ((5, 5, 5), (3, 3, 3)),
]


def random_members(seed, batch_size, empty=(1,)):
    g = torch.Generator().manual_seed(seed)
    members = []
    for m in range(batch_size):
        if m in empty:
            members.append(torch.zeros((0, 3), dtype=torch.int32))
            continue
        centre = torch.randint(-20, 20, (3,), generator=g)
        points = centre + torch.randint(-4, 5, (int(torch.randint(5, 60, (1,), generator=g)), 3), generator=g)
        members.append(points.to(torch.int32))
    return members


def member_rows(grid):
    offsets = grid.joffsets.tolist()
    return [range(offsets[m], offsets[m + 1]) for m in range(grid.batch_size)]


def dense_forward(plan, x, w):
    """conv3d on a canvas per member (forward plan, generated target)."""
    k, s = plan_geometry(plan)
    pb = [(ka - 1) // 2 for ka in k]
    src, dst = plan.source_grid, plan.target_grid
    out = torch.zeros(dst.num_voxels, w.shape[0], dtype=torch.float64)
    for rows_s, rows_t in zip(member_rows(src), member_rows(dst)):
        if len(rows_s) == 0:
            continue
        fine = src.ijk[rows_s.start:rows_s.stop].long()
        lo = [math.floor((int(fine[:, a].min()) - k[a]) / s[a]) * s[a] for a in range(3)]
        size = [int(fine[:, a].max()) - lo[a] + k[a] + s[a] + 1 for a in range(3)]
        canvas = torch.zeros(1, x.shape[1], *size, dtype=torch.float64)
        f = fine - torch.tensor(lo)
        canvas[0, :, f[:, 0], f[:, 1], f[:, 2]] = x[rows_s.start:rows_s.stop].T
        dense = F.conv3d(canvas, w, stride=s, padding=pb)
        c = dst.ijk[rows_t.start:rows_t.stop].long() - torch.tensor([lo[a] // s[a] for a in range(3)])
        out[rows_t.start:rows_t.stop] = dense[0, :, c[:, 0], c[:, 1], c[:, 2]].T
    return out


def dense_transposed(plan, x, w):
    """conv_transpose3d(x, W.transpose(0, 1), stride=S, padding=pb) on a canvas per member."""
    k, s = plan_geometry(plan)
    pb = [(ka - 1) // 2 for ka in k]
    src, dst = plan.source_grid, plan.target_grid
    out = torch.zeros(dst.num_voxels, w.shape[0], dtype=torch.float64)
    for rows_s, rows_t in zip(member_rows(src), member_rows(dst)):
        if len(rows_s) == 0:
            continue
        coarse = src.ijk[rows_s.start:rows_s.stop].long()
        lo = [int(coarse[:, a].min()) - (pb[a] + s[a] - 1) // s[a] - 1 for a in range(3)]
        size = [int(coarse[:, a].max()) - lo[a] + (pb[a] + s[a] - 1) // s[a] + 2 for a in range(3)]
        canvas = torch.zeros(1, x.shape[1], *size, dtype=torch.float64)
        c = coarse - torch.tensor(lo)
        canvas[0, :, c[:, 0], c[:, 1], c[:, 2]] = x[rows_s.start:rows_s.stop].T
        dense = F.conv_transpose3d(canvas, w.transpose(0, 1), stride=s, padding=pb)
        f = dst.ijk[rows_t.start:rows_t.stop].long() - torch.tensor([s[a] * lo[a] for a in range(3)])
        out[rows_t.start:rows_t.stop] = dense[0, :, f[:, 0], f[:, 1], f[:, 2]].T
    return out


_geometry = {}


def plan_geometry(plan):
    return _geometry[id(plan)]


def make_plan(grid, k, s, transposed):
    plan = (sg.ConvolutionPlan.from_grid_transposed if transposed else sg.ConvolutionPlan.from_grid)(grid, k, s)
    _geometry[id(plan)] = (list(k), list(s))
    return plan


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("k,s", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_values_and_gradients_match_dense_oracle(seed, k, s, transposed):
    grid = sg.GridBatch.from_ijk(random_members(seed, 3))
    plan = make_plan(grid, k, s, transposed)
    g = torch.Generator().manual_seed(seed + 100)
    cin, cout = 3, 2
    x = torch.randn(grid.num_voxels, cin, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(cout, cin, *k, dtype=torch.float64, generator=g, requires_grad=True)
    y = plan.execute(x, w)
    oracle = dense_transposed if transposed else dense_forward
    x_ref = x.detach().clone().requires_grad_(True)
    w_ref = w.detach().clone().requires_grad_(True)
    y_ref = oracle(plan, x_ref, w_ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    grad = torch.randn(y.shape, dtype=torch.float64, generator=g)
    y.backward(grad)
    y_ref.backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=1e-11, atol=1e-11)


def test_gradcheck():
    grid = sg.GridBatch.from_ijk(random_members(7, 2, empty=()))
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 2)
    x = torch.randn(grid.num_voxels, 2, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 2, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: plan.execute(a, b), (x, w))


def test_all_ones_weights_give_degrees():
    grid = sg.GridBatch.from_ijk([torch.tensor([[i, 0, 0] for i in range(16)])])
    plan = sg.ConvolutionPlan.from_grid(grid, (4, 1, 1), (4, 1, 1))
    y = plan.execute(torch.ones(16, 1), torch.ones(1, 1, 4, 1, 1))
    assert y.flatten().tolist() == [3, 4, 4, 4, 1]


def test_repeated_runs_are_bitwise_identical():
    grid = sg.GridBatch.from_ijk(random_members(3, 4))
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 1)
    x = torch.randn(grid.num_voxels, 16)
    w = torch.randn(8, 16, 3, 3, 3)
    first = plan.execute(x, w)
    assert torch.equal(first, plan.execute(x, w))


def test_execution_builds_a_graph_only_when_a_gradient_can_be_asked_for():
    grid = sg.GridBatch.from_ijk(random_members(12, 2))
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 2)
    x = torch.randn(grid.num_voxels, 5, dtype=torch.float64)
    w = torch.randn(3, 5, 3, 3, 3, dtype=torch.float64)
    plain = plan.execute(x, w)  # the direct path
    through_op = torch.ops.sparsegrid.sparse_conv(x, w, plan._handle)
    assert plain.grad_fn is None and not plain.requires_grad and through_op.grad_fn is None
    assert torch.equal(plain, through_op)
    w.requires_grad_(True)
    tracked = plan.execute(x, w)
    assert tracked.grad_fn is not None and torch.equal(tracked.detach(), plain)
    tracked.sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0
    with torch.no_grad():
        assert plan.execute(x, w).grad_fn is None
    with pytest.raises(RuntimeError, match="weight must have shape"):
        plan.execute(x, torch.randn(3, 4, 3, 3, 3, dtype=torch.float64))  # errors on the direct path too


def test_execute_and_the_operator_give_the_same_gradients():
    """execute (the plan's method) and the operator sparse_conv (for LibTorch) share one autograd in C++:
    bitwise equal outputs and gradients; neither is differentiable twice."""
    grid = sg.GridBatch.from_ijk(random_members(13, 2))
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 2)
    g = torch.Generator().manual_seed(13)
    x = torch.randn(grid.num_voxels, 5, dtype=torch.float64, generator=g)
    w = torch.randn(3, 5, 3, 3, 3, dtype=torch.float64, generator=g)
    grad = torch.randn(plan.target_grid.num_voxels, 3, dtype=torch.float64, generator=g)
    results = []
    for run in (plan.execute, lambda a, b: torch.ops.sparsegrid.sparse_conv(a, b, plan._handle)):
        for needs in ((True, True), (True, False), (False, True)):
            xs, ws = x.clone().requires_grad_(needs[0]), w.clone().requires_grad_(needs[1])
            y = run(xs, ws)
            y.backward(grad)
            results.append((y.detach(), xs.grad, ws.grad))
    for (y0, gx0, gw0), (y1, gx1, gw1) in zip(results[:3], results[3:]):
        assert torch.equal(y0, y1)
        assert (gx0 is None) == (gx1 is None) and (gx0 is None or torch.equal(gx0, gx1))
        assert (gw0 is None) == (gw1 is None) and (gw0 is None or torch.equal(gw0, gw1))
    for run in (plan.execute, lambda a, b: torch.ops.sparsegrid.sparse_conv(a, b, plan._handle)):
        xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        # First-order gradients under create_graph are the plain ones.
        gx, gw = torch.autograd.grad(run(xs, ws).square().sum(), (xs, ws), create_graph=True)
        plain = torch.autograd.grad(run(xs, ws).square().sum(), (xs, ws))
        assert torch.equal(gx.detach(), plain[0]) and torch.equal(gw.detach(), plain[1])
        # A second backward pass through them raises, also next to a differentiable term (which would
        # otherwise go through alone, counting the convolution's gradients as constants).
        for second in (gx.sum(), gw.sum(), gx.sum() + xs.sum()):
            with pytest.raises(RuntimeError, match="gradients of a sparse convolution are not differentiable"):
                torch.autograd.grad(second, (xs, ws), allow_unused=True)
        # Gradients only of the weight, the features constant: still refused.
        (gw,) = torch.autograd.grad(run(x, ws).square().sum(), ws, create_graph=True)
        with pytest.raises(RuntimeError, match="not differentiable"):
            torch.autograd.grad(gw.sum(), ws)


def test_transposed_plan_shares_the_grids():
    grid = sg.GridBatch.from_ijk(random_members(4, 3))
    plan = sg.ConvolutionPlan.from_grid(grid, 2, 2)
    flipped = plan.transposed()
    assert torch.equal(flipped.source_grid.ijk, plan.target_grid.ijk)
    assert torch.equal(flipped.target_grid.ijk, grid.ijk)


def test_topology_matches_brute_force():
    members = random_members(5, 3)
    grid = sg.GridBatch.from_ijk(members)
    coarse = grid.conv_grid(3, 2)
    for m, rows in enumerate(member_rows(coarse)):
        fine = {tuple(v) for v in members[m].tolist()}
        expected = {
            tuple(c)
            for f in fine
            for tap in itertools.product(range(3), repeat=3)
            for c in [[(f[a] - tap[a] + 1) // 2 for a in range(3)]]
            if all((f[a] - tap[a] + 1) % 2 == 0 for a in range(3))
        }
        assert {tuple(v) for v in coarse.ijk[rows.start:rows.stop].tolist()} == expected
    assert coarse.voxel_sizes.tolist() == [[2.0, 2.0, 2.0]] * 3


def test_bad_inputs_raise_clear_errors():
    grid = sg.GridBatch.from_ijk(random_members(6, 2, empty=()))
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 1)
    x = torch.randn(grid.num_voxels, 4)
    with pytest.raises(RuntimeError, match="weight must have shape"):
        plan.execute(x, torch.randn(2, 3, 3, 3, 3))
    with pytest.raises(RuntimeError, match="rows"):
        plan.execute(torch.randn(grid.num_voxels + 1, 4), torch.randn(2, 4, 3, 3, 3))
    with pytest.raises(RuntimeError, match="float32 or float64"):
        plan.execute(x.to(torch.int64), torch.randn(2, 4, 3, 3, 3).to(torch.int64))
    with pytest.raises(RuntimeError, match="dtype of input"):
        plan.execute(x, torch.randn(2, 4, 3, 3, 3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="stride"):
        grid.conv_grid(3, 0)
    with pytest.raises(RuntimeError, match="mask"):
        grid.pruned_grid(torch.ones(grid.num_voxels + 2, dtype=torch.bool))


def test_outputs_too_large_for_the_host_raise_clear_errors():
    """Outputs past the grid size limit are refused before allocating; outputs whose size is known only
    once built, and too large for the host's memory, raise naming the operation (here under an address
    space limit of 16 GB in a child process: the dilation of two far voxels by 640 needs 34 GB of keys)."""
    one = sg.GridBatch.from_ijk(torch.zeros(1, 3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"refined_grid: .*2151685171 voxels, more than the 2\^31 - 1"):
        one.refined_grid(1291)
    script = """
import resource, sys
import torch, sparsegrid as sg
grid = sg.GridBatch.from_ijk(torch.tensor([[0, 0, 0], [5000, 0, 0]], dtype=torch.int32))
limit = 16 * 2**30
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    grid.dilated_grid(640)
except RuntimeError as error:
    print("raised:", error)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "raised: dilated_grid: out of host memory" in result.stdout, result.stdout + result.stderr[-2000:]


def test_from_points_uses_the_voxel_containing_each_point():
    grid = sg.GridBatch.from_points([torch.tensor([[0.49, 0.5, -0.51], [1.0, 1.0, 1.0]]), torch.zeros((0, 3))],
                                    voxel_sizes=[[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]], origins=[0.0, 0.0, 0.0])
    assert sorted(map(tuple, grid.ijk.tolist())) == [(0, 1, -1), (1, 1, 1)]
    assert grid.joffsets.tolist() == [0, 2, 2]
    with pytest.raises(RuntimeError, match="finite"):
        sg.GridBatch.from_points(torch.tensor([[float("nan"), 0.0, 0.0]]), voxel_sizes=1.0)


def test_bunny_from_mesh(tmp_path):
    import pathlib
    vertices, faces = sg.load_mesh(pathlib.Path(__file__).resolve().parents[2] / "data" / "bunny.ply")
    assert faces.shape == (3674, 3)
    lo = vertices.min(0).values
    size = float((vertices.max(0).values - lo).max()) / 16
    grid = sg.GridBatch.from_mesh([(vertices, faces), (vertices, faces)], voxel_sizes=[[size] * 3, [size / 2] * 3],
                                  origins=lo)
    counts = grid.joffsets.diff().tolist()
    assert counts[0] > 100 and counts[1] > 3 * counts[0]  # finer voxels, ~4x the surface voxels
    with pytest.raises(RuntimeError, match="missing.ply"):
        sg.load_mesh(tmp_path / "missing.ply")
    scene = tmp_path / "scene.3ds"
    scene.write_bytes(b"3ds")
    with pytest.raises(RuntimeError, match=r"scene\.3ds.*not supported; supported: \.obj, \.off, \.ply, \.stl"):
        sg.load_mesh(scene)


def test_grids_and_plans_report_their_device():
    grid = sg.GridBatch.from_ijk(random_members(8, 2))
    assert grid.device == torch.device("cpu") and grid.ijk.device == grid.device
    assert grid.joffsets.device == grid.device and grid.voxel_sizes.device == grid.device
    assert grid.to("cpu") is grid and grid.cpu() is grid
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 2)
    assert plan.device == grid.device and plan.target_grid.device == grid.device
    assert "device=cpu" in repr(grid)


def test_half_precision_and_other_devices_are_rejected_on_the_cpu():
    grid = sg.GridBatch.from_ijk(random_members(9, 2, empty=()))
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 1)
    x = torch.randn(grid.num_voxels, 4)
    for dtype in (torch.float16, torch.bfloat16):
        with pytest.raises(RuntimeError, match="float16 and bfloat16 run on CUDA only"):
            plan.execute(x.to(dtype), torch.randn(2, 4, 3, 3, 3).to(dtype))
    with pytest.raises(RuntimeError, match="input is on meta but the grid is on cpu"):
        plan.execute(x.to("meta"), torch.randn(2, 4, 3, 3, 3))
    with pytest.raises(RuntimeError, match="sparsegrid runs on CPU and CUDA tensors"):
        sg.GridBatch.from_ijk([torch.zeros((2, 3), dtype=torch.int32, device="meta")])


def test_cpu_work_never_synchronises():
    before = sg.host_synchronizations()
    grid = sg.GridBatch.from_ijk(random_members(10, 3))
    plan = sg.ConvolutionPlan.from_grid_transposed(grid, 2, 2)
    x = torch.randn(grid.num_voxels, 3, requires_grad=True)
    plan.execute(x, torch.randn(2, 3, 2, 2, 2)).sum().backward()
    # The counter is process-wide: CUDA tests run earlier in the same process may have raised it.
    assert sg.host_synchronizations() == before


def test_per_axis_values_are_checked_once_by_the_layer():
    grid = sg.GridBatch.from_ijk(random_members(11, 2, empty=()))
    with pytest.raises(RuntimeError, match="conv_grid: kernel_size must have 1 or 3 entries, got 2"):
        grid.conv_grid((3, 3), 1)
    with pytest.raises(RuntimeError, match="conv_transpose_grid: stride must have 1 or 3 entries, got 4"):
        grid.conv_transpose_grid(2, [2, 2, 2, 2])
    with pytest.raises(RuntimeError, match="coarsened_grid: factor must have 1 or 3 entries, got 0"):
        grid.coarsened_grid([])
    with pytest.raises(RuntimeError, match="ConvolutionPlan: kernel_size must have 1 or 3 entries, got 2"):
        sg.ConvolutionPlan.from_grid(grid, (3, 3))
    with pytest.raises(RuntimeError, match="ConvolutionPlan: stride entries must fit int32, got 4294967298"):
        sg.ConvolutionPlan.from_grid_transposed(grid, 3, [2 ** 32 + 2])
    with pytest.raises(RuntimeError, match="ConvolutionPlan: kernel_size must have 1 or 3 entries, got 2"):
        snn.SparseMaxPool3d((2, 2))(snn.SparseFeatures(grid, torch.zeros(grid.num_voxels, 1)))
    # One entry means the same value on every axis, as in the layer's triple().
    assert torch.equal(grid.conv_grid([3], [2]).ijk, grid.conv_grid(3, 2).ijk)


def test_dilation_distance_is_converted_by_the_layer_and_checked_by_the_core():
    grid = sg.GridBatch.from_ijk(random_members(12, 2, empty=()))
    with pytest.raises(RuntimeError, match=r"dilated_grid: distance must fit int32, got 2147483648"):
        grid.dilated_grid(2 ** 31)
    with pytest.raises(RuntimeError, match=r"dilated_grid: distance must fit int32, got -2147483649"):
        grid.dilated_grid(-2 ** 31 - 1)
    for distance in (-1, 100000):
        with pytest.raises(RuntimeError, match=rf"dilated_grid: distance must be in \[0, \d+\], got {distance}"):
            grid.dilated_grid(distance)


def member_bounds(grid):
    """[B, 2, 3] per-member min and max by torch, (0, -1) for empty members."""
    out = torch.tensor([[0, 0, 0], [-1, -1, -1]], dtype=torch.int32).repeat(grid.batch_size, 1, 1)
    ijk = grid.ijk.cpu()
    for m, rows in enumerate(member_rows(grid)):
        if len(rows):
            out[m, 0] = ijk[rows.start:rows.stop].min(0).values
            out[m, 1] = ijk[rows.start:rows.stop].max(0).values
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bbox_matches_the_member_min_and_max(seed):
    members = random_members(seed, 4, empty=(1,))
    members[3] = members[3] - 1000  # far in the negative octant
    grid = sg.GridBatch.from_ijk(members)
    box = grid.bbox()
    assert box.dtype == torch.int32 and box.shape == (4, 2, 3) and box.device == grid.device
    assert torch.equal(box, member_bounds(grid))
    assert box[1].tolist() == [[0, 0, 0], [-1, -1, -1]]  # the empty member: hi < lo
    assert (box[3] < -900).all()
    for m in (0, 2, 3):
        assert torch.equal(box[m, 0], members[m].min(0).values) and torch.equal(box[m, 1], members[m].max(0).values)


def clip_by_brute_force(grid, ijk_min, ijk_max):
    """Index in `grid` of every voxel inside its member's box, in grid order; boxes [B, 3] (broadcast)."""
    lo = torch.as_tensor(ijk_min, dtype=torch.int64).reshape(-1, 3).expand(grid.batch_size, 3)
    hi = torch.as_tensor(ijk_max, dtype=torch.int64).reshape(-1, 3).expand(grid.batch_size, 3)
    ijk = grid.ijk.cpu().tolist()
    kept = []
    for m, rows in enumerate(member_rows(grid)):
        kept.extend(v for v in rows if all(lo[m, a] <= ijk[v][a] <= hi[m, a] for a in range(3)))
    return kept


def check_clip(grid, ijk_min, ijk_max):
    clipped, kept_index = grid.clipped_grid(ijk_min, ijk_max, return_index=True)
    expected = clip_by_brute_force(grid, ijk_min, ijk_max)
    assert kept_index.dtype == torch.int64 and kept_index.device == grid.device
    assert kept_index.tolist() == expected  # increasing: the order is preserved
    assert torch.equal(clipped.ijk, grid.ijk[kept_index])
    offsets = grid.joffsets.tolist()
    counts = [sum(offsets[m] <= v < offsets[m + 1] for v in expected) for m in range(grid.batch_size)]
    assert clipped.joffsets.diff().tolist() == counts
    assert torch.equal(clipped.voxel_sizes, grid.voxel_sizes) and torch.equal(clipped.origins, grid.origins)
    # The voxel order of a grid built from the kept voxels, so every operation can use the clipped grid.
    kept_members = [clipped.ijk[a:b] for a, b in zip(clipped.joffsets[:-1].tolist(), clipped.joffsets[1:].tolist())]
    assert torch.equal(sg.GridBatch.from_ijk(kept_members).ijk, clipped.ijk)
    features = torch.randn(grid.num_voxels, 3, dtype=torch.float64)
    assert torch.equal(features[kept_index], features[expected])
    return clipped, kept_index


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clipped_grid_matches_a_brute_force_filter(seed):
    members = random_members(seed, 3)
    sizes = torch.tensor([[0.5, 1.0, 2.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]], dtype=torch.float64)
    grid = sg.GridBatch.from_ijk(members, voxel_sizes=sizes, origins=[1.0, -2.0, 0.25])
    bounds = member_bounds(grid)
    centre = (bounds[:, 0] + bounds[:, 1]) // 2
    # Per-member boxes around each member's centre (the lower half on every axis).
    check_clip(grid, bounds[:, 0], centre)
    check_clip(grid, (centre - 1).tolist(), (centre + 2).tolist())
    # One box for every member, as a 3-sequence, a [3] tensor and a [1, 3] tensor.
    for box in ([-10, -10, -10], torch.tensor([-10, -10, -10]), torch.tensor([[-10, -10, -10]], dtype=torch.int32)):
        clipped, _ = check_clip(grid, box, [5, 20, 0])
    # A box keeping everything, and boxes keeping nothing (min > max on one axis, or far away).
    everything, kept_index = check_clip(grid, [-2 ** 31] * 3, [2 ** 31 - 1] * 3)
    assert torch.equal(everything.ijk, grid.ijk) and torch.equal(kept_index, torch.arange(grid.num_voxels))
    for ijk_min, ijk_max in (([0, 5, 0], [0, 4, 0]), ([1000, 1000, 1000], [2000, 2000, 2000])):
        nothing, kept_index = check_clip(grid, ijk_min, ijk_max)
        assert nothing.num_voxels == 0 and kept_index.shape == (0,)
        assert nothing.batch_size == grid.batch_size and nothing.joffsets.tolist() == [0] * (grid.batch_size + 1)
    # Without return_index: the grid alone.
    alone = grid.clipped_grid([-5, -5, -5], [5, 5, 5])
    assert isinstance(alone, sg.GridBatch)
    assert torch.equal(alone.ijk, check_clip(grid, [-5, -5, -5], [5, 5, 5])[0].ijk)


def test_clipped_grid_rejects_bad_boxes_naming_the_argument():
    grid = sg.GridBatch.from_ijk(random_members(13, 3, empty=()))
    lo, hi = [0, 0, 0], [5, 5, 5]
    with pytest.raises(RuntimeError, match=r"clipped_grid: ijk_min must have shape \[3\] or \[B, 3\], got \[2\]"):
        grid.clipped_grid([0, 0], hi)
    with pytest.raises(RuntimeError, match=r"clipped_grid: ijk_max must have shape \[3\] or \[B, 3\], got \[3, 4\]"):
        grid.clipped_grid(lo, torch.zeros(3, 4, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="clipped_grid: ijk_min must have an integer dtype, got Float"):
        grid.clipped_grid([0.0, 0.5, 0.0], hi)
    with pytest.raises(RuntimeError, match="clipped_grid: ijk_max must have an integer dtype, got Double"):
        grid.clipped_grid(lo, torch.tensor([5.0, 5.0, 5.0], dtype=torch.float64))
    with pytest.raises(RuntimeError, match="clipped_grid: ijk_max must have an integer dtype, got Bool"):
        grid.clipped_grid(lo, torch.ones(3, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="clipped_grid: ijk_min entries must fit int32, got -2147483649"):
        grid.clipped_grid([0, -2 ** 31 - 1, 0], hi)
    with pytest.raises(RuntimeError, match=r"clipped_grid: ijk_max must hold 1 or batch_size \(3\) coordinates, got 2"):
        grid.clipped_grid(lo, [hi, hi])
    with pytest.raises(RuntimeError, match="clipped_grid: ijk_min is on meta"):
        grid.clipped_grid(torch.zeros(3, dtype=torch.int64, device="meta"), hi)


def test_pyramid_equals_the_calls_it_replaces():
    grid = sg.GridBatch.from_ijk(random_members(17, 4), voxel_sizes=[0.5, 1.0, 2.0], origins=[1.0, -2.0, 0.25])
    for kernel, stride in [(3, 2), (2, 2), ((3, 2, 1), (2, 2, 1)), ((1, 3, 3), (2, 2, 2))]:
        levels, coarsened = grid.pyramid(kernel, stride, 3, [2, (3, 1, 2), 1])
        chain = grid
        for level in levels:
            chain = chain.conv_grid(kernel, stride)
            for a, b in ((level.ijk, chain.ijk), (level.joffsets, chain.joffsets),
                         (level.voxel_sizes, chain.voxel_sizes), (level.origins, chain.origins)):
                assert torch.equal(a, b)
        for got, factor in zip(coarsened, [2, (3, 1, 2), 1]):
            want = grid.coarsened_grid(factor)
            assert torch.equal(got.ijk, want.ijk) and torch.equal(got.origins, want.origins)
    assert grid.pyramid(3, 2, 0) == ([], [])
    with pytest.raises(RuntimeError, match="pyramid: levels must be"):
        grid.pyramid(3, 2, -1)
    with pytest.raises(TypeError):
        grid.pyramid(3, 2, 2.0)
    with pytest.raises(ValueError, match="coarsening factor"):
        grid.pyramid(3, 2, 1, [(2, 2)])
