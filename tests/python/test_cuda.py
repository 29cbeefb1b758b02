"""The PyTorch layer on CUDA tensors against the same calls on CPU tensors: grids equal exactly (voxels,
order, offsets, transforms, kernel maps), convolutions within tolerance (float64 / float32 against
the CPU, float16 / bfloat16 against CUDA float32), gradients, determinism, no host synchronisation in
the convolution path, stream and device handling, and errors for tensors on the wrong device.

Skips without a CUDA device or without the CUDA backend; SPARSEGRID_REQUIRE_CUDA=1 (the GPU check)
turns the skip into a failure, so a GPU run cannot pass by skipping. Seeds are fixed and appear in the
test ids."""

import copy
import os
import pathlib

import pytest
import torch

import sparsegrid as sg
from sparsegrid import nn as snn

from test_sparsegrid import CASES, check_clip, member_bounds, random_members


def cuda_device_or_skip(missing=None):
    """The current CUDA device; skips the test where there is none, no CUDA backend, or `missing` (a
    reason, or None) says what else is absent, and fails instead where SPARSEGRID_REQUIRE_CUDA=1."""
    reason = None
    if not torch.cuda.is_available():
        reason = "torch sees no CUDA device"
    elif not sg.cuda_backend_available():
        reason = "sparsegrid was built without its CUDA backend"
    elif missing is not None:
        reason = missing
    if reason is not None:
        if os.environ.get("SPARSEGRID_REQUIRE_CUDA") == "1":
            pytest.fail(f"{reason}, but SPARSEGRID_REQUIRE_CUDA=1")
        pytest.skip(reason)
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(autouse=True)
def cuda_device():
    return cuda_device_or_skip()


def assert_same_grid(cuda_grid, cpu_grid):
    assert cuda_grid.device.type == "cuda" and cpu_grid.device.type == "cpu"
    assert cuda_grid.ijk.device == cuda_grid.device and cuda_grid.joffsets.device == cuda_grid.device
    assert torch.equal(cuda_grid.ijk.cpu(), cpu_grid.ijk)
    assert torch.equal(cuda_grid.joffsets.cpu(), cpu_grid.joffsets)
    assert torch.equal(cuda_grid.voxel_sizes.cpu(), cpu_grid.voxel_sizes)
    assert torch.equal(cuda_grid.origins.cpu(), cpu_grid.origins)


def grid_pair(seed, batch_size=3, device="cuda"):
    members = random_members(seed, batch_size)
    sizes = torch.tensor([[0.5, 1.0, 2.0]] * batch_size, dtype=torch.float64)
    return (sg.GridBatch.from_ijk(members, voxel_sizes=sizes, origins=[1.0, -2.0, 0.25], device=device),
            sg.GridBatch.from_ijk(members, voxel_sizes=sizes, origins=[1.0, -2.0, 0.25]))


def topology_ops(seed):
    """(name, op) pairs applied to a CUDA grid and the equal CPU grid."""
    def mask(grid):
        g = torch.Generator().manual_seed(seed + 50)
        return (torch.rand(grid.num_voxels, generator=g) < 0.5).to(grid.device)

    return [
        ("conv_grid k3 s2", lambda g: g.conv_grid(3, 2)),
        ("conv_grid k(3,2,5) s(1,2,3)", lambda g: g.conv_grid((3, 2, 5), (1, 2, 3))),
        ("conv_transpose_grid k2 s2", lambda g: g.conv_transpose_grid(2, 2)),
        ("conv_transpose_grid k3 s2", lambda g: g.conv_transpose_grid(3, 2)),
        ("coarsened_grid 2", lambda g: g.coarsened_grid(2)),
        ("coarsened_grid (3,1,2)", lambda g: g.coarsened_grid((3, 1, 2))),
        ("refined_grid 2", lambda g: g.refined_grid(2)),
        ("refined_grid 2 masked", lambda g: g.refined_grid(2, mask(g))),
        ("dilated_grid 1", lambda g: g.dilated_grid(1)),
        ("pruned_grid", lambda g: g.pruned_grid(mask(g))),
        ("merged_grid", lambda g: g.merged_grid(g.conv_transpose_grid(3, 1))),
        ("clipped_grid", lambda g: g.clipped_grid([-10, -5, -20], [5, 20, 3])),
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grids_on_cuda_equal_the_cpu_grids(seed, cuda_device):
    cuda_grid, cpu_grid = grid_pair(seed)
    assert cuda_grid.device == cuda_device
    assert_same_grid(cuda_grid, cpu_grid)
    for name, op in topology_ops(seed):
        a, b = op(cuda_grid), op(cpu_grid)
        assert a.device == cuda_device, name
        assert_same_grid(a, b)
    queries = [torch.randint(-25, 25, (40, 3), generator=torch.Generator().manual_seed(seed)) for _ in range(3)]
    index = cuda_grid.ijk_to_index([q.to(cuda_device) for q in queries])
    assert index.device == cuda_device
    assert torch.equal(index.cpu(), cpu_grid.ijk_to_index(queries))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pyramid_on_cuda_equals_the_calls_it_replaces_with_one_synchronisation(seed, cuda_device):
    cuda_grid, cpu_grid = grid_pair(seed, batch_size=5)
    before = sg.host_synchronizations()
    levels, coarsened = cuda_grid.pyramid(3, 2, 4, [8, 4, (2, 1, 3)])
    assert sg.host_synchronizations() - before == 1
    assert len(levels) == 4 and len(coarsened) == 3
    chain = cpu_grid
    for level in levels:
        chain = chain.conv_grid(3, 2)
        assert_same_grid(level, chain)
    for grid, factor in zip(coarsened, [8, 4, (2, 1, 3)]):
        assert_same_grid(grid, cpu_grid.coarsened_grid(factor))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bbox_on_cuda_equals_the_cpu_without_synchronising(seed, cuda_device):
    members = random_members(seed, 4, empty=(1,))
    members[3] = members[3] - 1000
    cuda_grid = sg.GridBatch.from_ijk(members, device=cuda_device)
    cpu_grid = sg.GridBatch.from_ijk(members)
    before = sg.host_synchronizations()
    box = cuda_grid.bbox()
    assert sg.host_synchronizations() == before
    assert box.device == cuda_device and box.dtype == torch.int32 and box.shape == (4, 2, 3)
    assert torch.equal(box.cpu(), cpu_grid.bbox())
    assert torch.equal(box.cpu(), member_bounds(cpu_grid))
    assert box[1].tolist() == [[0, 0, 0], [-1, -1, -1]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clipped_grid_on_cuda_equals_the_cpu(seed, cuda_device):
    cuda_grid, cpu_grid = grid_pair(seed)
    bounds = member_bounds(cpu_grid)
    centre = (bounds[:, 0] + bounds[:, 1]) // 2
    boxes = [
        (bounds[:, 0], centre),  # per member, CPU tensors
        (bounds[:, 0].to(cuda_device), centre.to(cuda_device)),  # per member, on the grid's device
        ((centre - 1).tolist(), (centre + 2).tolist()),  # per member, lists
        ([-10, -10, -10], [5, 20, 0]),  # one box for every member
        ([0, 5, 0], [0, 4, 0]),  # keeps nothing
        ([-2 ** 31] * 3, [2 ** 31 - 1] * 3),  # keeps everything
    ]
    features = torch.randn(cpu_grid.num_voxels, 3, dtype=torch.float64)
    for ijk_min, ijk_max in boxes:
        cpu_clipped, cpu_index = check_clip(cpu_grid, ijk_min.cpu() if isinstance(ijk_min, torch.Tensor) else ijk_min,
                                            ijk_max.cpu() if isinstance(ijk_max, torch.Tensor) else ijk_max)
        clipped, kept_index = cuda_grid.clipped_grid(ijk_min, ijk_max, return_index=True)
        assert_same_grid(clipped, cpu_clipped)
        assert kept_index.device == cuda_device and torch.equal(kept_index.cpu(), cpu_index)
        assert torch.equal(features.to(cuda_device)[kept_index].cpu(), features[cpu_index])
    with pytest.raises(RuntimeError, match="clipped_grid: ijk_max must have an integer dtype, got Float"):
        cuda_grid.clipped_grid([0, 0, 0], torch.ones(3, device=cuda_device))
    with pytest.raises(RuntimeError, match=r"clipped_grid: ijk_min must have shape \[3\] or \[B, 3\], got \[3, 2\]"):
        cuda_grid.clipped_grid(torch.zeros(3, 2, dtype=torch.int32, device=cuda_device), [1, 1, 1])


def test_constructors_follow_the_device(cuda_device):
    points = [torch.tensor([[0.49, 0.5, -0.51], [1.0, 1.0, 1.0], [7.2, -3.3, 0.0]], dtype=torch.float64),
              torch.zeros((0, 3), dtype=torch.float64)]
    sizes = [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    on_cuda = sg.GridBatch.from_points([p.to(cuda_device) for p in points], voxel_sizes=sizes)
    assert_same_grid(on_cuda, sg.GridBatch.from_points(points, voxel_sizes=sizes))
    assert_same_grid(sg.GridBatch.from_points(points, voxel_sizes=sizes, device="cuda"),
                     sg.GridBatch.from_points(points, voxel_sizes=sizes))
    shapes = sg.synthetic_shapes(3, 16, seed=4, device=cuda_device)
    assert all(s.device == cuda_device for s in shapes)
    assert_same_grid(sg.GridBatch.from_ijk(shapes), sg.GridBatch.from_ijk(sg.synthetic_shapes(3, 16, seed=4)))


def test_from_mesh_on_cuda(cuda_device):
    vertices, faces = sg.load_mesh(pathlib.Path(__file__).resolve().parents[2] / "data" / "bunny.ply")
    lo = vertices.min(0).values
    size = float((vertices.max(0).values - lo).max()) / 16
    meshes = [(vertices, faces), (vertices, faces)]
    sizes = [[size] * 3, [size / 2] * 3]
    on_cuda = sg.GridBatch.from_mesh(meshes, voxel_sizes=sizes, origins=lo, device=cuda_device)
    assert_same_grid(on_cuda, sg.GridBatch.from_mesh(meshes, voxel_sizes=sizes, origins=lo))


def test_to_moves_grids_both_ways(cuda_device):
    cuda_grid, cpu_grid = grid_pair(5)
    assert cpu_grid.to(cuda_device) is not cpu_grid
    assert_same_grid(cpu_grid.to("cuda"), cpu_grid)
    assert_same_grid(cuda_grid, cuda_grid.to("cpu"))
    assert cuda_grid.to(cuda_device) is cuda_grid and cuda_grid.cuda() is cuda_grid
    x = snn.SparseFeatures(cpu_grid, torch.randn(cpu_grid.num_voxels, 2))
    y = x.to(cuda_device)
    assert y.device == cuda_device and y.features.device == cuda_device and torch.equal(y.features.cpu(), x.features)


def run_conv(plan, x, w, grad):
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    y = plan.execute(x, w)
    y.backward(grad)
    return y.detach(), x.grad, w.grad


def make_plans(seed, k, s, transposed):
    cuda_grid, cpu_grid = grid_pair(seed)
    make = sg.ConvolutionPlan.from_grid_transposed if transposed else sg.ConvolutionPlan.from_grid
    return make(cuda_grid, k, s), make(cpu_grid, k, s)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("k,s", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_convolution_matches_the_cpu(seed, k, s, transposed, dtype, cuda_device):
    cuda_plan, cpu_plan = make_plans(seed, k, s, transposed)
    assert cuda_plan.device == cuda_device
    assert_same_grid(cuda_plan.target_grid, cpu_plan.target_grid)
    if not cpu_plan.is_identity:
        assert torch.equal(cuda_plan.target_map().cpu(), cpu_plan.target_map())
        assert torch.equal(cuda_plan.transposed().target_map().cpu(), cpu_plan.transposed().target_map())
    g = torch.Generator().manual_seed(seed + 100)
    cin, cout = 5, 3
    x = torch.randn(cpu_plan.source_grid.num_voxels, cin, dtype=dtype, generator=g)
    w = torch.randn(cout, cin, *k, dtype=dtype, generator=g)
    grad = torch.randn(cpu_plan.target_grid.num_voxels, cout, dtype=dtype, generator=g)
    expected = run_conv(cpu_plan, x, w, grad)
    got = run_conv(cuda_plan, x.to(cuda_device), w.to(cuda_device), grad.to(cuda_device))
    tolerance = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-4)
    for name, a, b in zip(("output", "grad features", "grad weight"), got, expected):
        assert a.device == cuda_device and a.dtype == dtype, name
        torch.testing.assert_close(a.cpu(), b, **tolerance, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("dtype,bound", [(torch.float16, 1e-2), (torch.bfloat16, 4e-2)], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("k,s,transposed", [(3, 1, False), (2, 2, True), (3, 2, False)])
def test_half_precision_is_close_to_float32(k, s, transposed, dtype, bound, cuda_device):
    cuda_plan, _ = make_plans(3, k, s, transposed)
    g = torch.Generator().manual_seed(7)
    cin, cout = 16, 8
    x = torch.randn(cuda_plan.source_grid.num_voxels, cin, generator=g).to(cuda_device)
    w = (torch.randn(cout, cin, k, k, k, generator=g) / (cin * k ** 3) ** 0.5).to(cuda_device)
    grad = torch.randn(cuda_plan.target_grid.num_voxels, cout, generator=g).to(cuda_device)
    reference = run_conv(cuda_plan, x, w, grad)
    low = run_conv(cuda_plan, x.to(dtype), w.to(dtype), grad.to(dtype))
    for name, a, b in zip(("output", "grad features", "grad weight"), low, reference):
        assert a.dtype == dtype and a.device == cuda_device, name
        error = (a.float() - b).abs().max() / b.abs().max().clamp(min=1e-6)
        assert error < bound, f"{name}: max error {float(error):.3g} of the largest value, bound {bound}"


def test_float32_uses_tf32_exactly_when_torch_allows_it(cuda_device):
    # 1 + 2^-12 is exact in float32 and rounds to 1 in TF32 (10-bit mantissa); only the centre tap is
    # non-zero, so every output is the sum of 4 such inputs, 4 + 2^-10 in float32 and 4 in TF32.
    grid = sg.GridBatch.from_ijk([torch.tensor([[0, 0, 0], [1, 0, 0], [5, 5, 5]], dtype=torch.int32)],
                                 device=cuda_device)
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 1, grid)
    x = torch.full((3, 4), 1 + 2 ** -12, device=cuda_device)
    w = torch.zeros(4, 4, 3, 3, 3, device=cuda_device)
    w[:, :, 1, 1, 1] = 1
    grad = torch.full((3, 4), 1 + 2 ** -12, device=cuda_device)
    exact, rounded = 4 + 2 ** -10, 4.0
    tensor_cores = torch.cuda.get_device_capability(cuda_device)[0] >= 8
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        # grad_weight at the centre tap: the sum over the 3 voxels of grad * x, each (1 + 2^-12)^2 in
        # float32 (so above 3) and 1 in TF32.
        y, gx, gw = run_conv(plan, x, w, grad)
        assert torch.all(y == exact) and torch.all(gx == exact) and torch.all(gw[:, :, 1, 1, 1] > 3)
        torch.backends.cuda.matmul.allow_tf32 = True
        y, gx, gw = run_conv(plan, x, w, grad)
        if tensor_cores:
            assert torch.all(y == rounded) and torch.all(gx == rounded) and torch.all(gw[:, :, 1, 1, 1] == 3)
        else:
            assert torch.all(y == exact) and torch.all(gx == exact) and torch.all(gw[:, :, 1, 1, 1] > 3)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def test_gradcheck_on_cuda(cuda_device):
    grid = sg.GridBatch.from_ijk(random_members(7, 2, empty=()), device=cuda_device)
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 2)
    x = torch.randn(grid.num_voxels, 2, dtype=torch.float64, device=cuda_device, requires_grad=True)
    w = torch.randn(2, 2, 3, 3, 3, dtype=torch.float64, device=cuda_device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: plan.execute(a, b), (x, w))
    transposed = plan.transposed()
    y = torch.randn(plan.target_grid.num_voxels, 2, dtype=torch.float64, device=cuda_device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: transposed.execute(a, b), (y, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64],
                         ids=["float32", "float16", "bfloat16", "float64"])
def test_repeated_runs_are_bitwise_identical(dtype, cuda_device):
    grid = sg.GridBatch.from_ijk(sg.synthetic_shapes(4, 24, seed=3), device=cuda_device)
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 1)
    up = sg.ConvolutionPlan.from_grid_transposed(grid, 2, 2)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(grid.num_voxels, 32, generator=g).to(cuda_device, dtype)
    w = torch.randn(32, 32, 3, 3, 3, generator=g).div(30).to(cuda_device, dtype)
    w_up = torch.randn(16, 32, 2, 2, 2, generator=g).div(15).to(cuda_device, dtype)
    for p, weight in ((plan, w), (up, w_up)):
        grad = torch.randn(p.target_grid.num_voxels, weight.shape[0], generator=g).to(cuda_device, dtype)
        first, second = run_conv(p, x, weight, grad), run_conv(p, x, weight, grad)
        for a, b in zip(first, second):
            assert torch.equal(a, b)


def test_convolution_never_synchronises(cuda_device):
    grid = sg.GridBatch.from_ijk(sg.synthetic_shapes(4, 24, seed=5), device=cuda_device)
    plans = [sg.ConvolutionPlan.from_grid(grid, 3, 1, grid), sg.ConvolutionPlan.from_grid(grid, 2, 2),
             sg.ConvolutionPlan.from_grid_transposed(grid, 2, 2)]
    x = torch.randn(grid.num_voxels, 16, device=cuda_device, requires_grad=True)
    weights = [torch.randn(16, 16, k, k, k, device=cuda_device, requires_grad=True) for k in (3, 2, 2)]

    def step():
        return sum(p.execute(x, w).square().sum() for p, w in zip(plans, weights)).backward()

    step()  # the first backward pass may derive the transposed maps
    before = sg.host_synchronizations()
    step()
    torch.cuda.synchronize()
    assert sg.host_synchronizations() == before


def test_work_on_a_side_stream_is_ordered(cuda_device):
    grid, cpu_grid = grid_pair(8)
    g = torch.Generator().manual_seed(8)
    x_cpu = torch.randn(grid.num_voxels, 4, dtype=torch.float64, generator=g)
    w_cpu = torch.randn(3, 4, 3, 3, 3, dtype=torch.float64, generator=g)
    expected = sg.ConvolutionPlan.from_grid(cpu_grid, 3, 2).execute(x_cpu, w_cpu)
    side = torch.cuda.Stream(cuda_device)
    side.wait_stream(torch.cuda.current_stream(cuda_device))
    with torch.cuda.stream(side):
        # A grid built on the default stream, used on the side stream; inputs made on the side stream.
        x, w = x_cpu.to(cuda_device), w_cpu.to(cuda_device)
        plan = sg.ConvolutionPlan.from_grid(grid, 3, 2)
        y = plan.execute(x, w) * 1.0
        # And a grid built on the side stream.
        offsets = cpu_grid.joffsets.tolist()
        members = [cpu_grid.ijk[a:b].to(cuda_device) for a, b in zip(offsets[:-1], offsets[1:])]
        side_grid = sg.GridBatch.from_ijk(members, voxel_sizes=cpu_grid.voxel_sizes, origins=cpu_grid.origins)
    torch.cuda.current_stream(cuda_device).wait_stream(side)
    torch.testing.assert_close(y.cpu(), expected, rtol=1e-10, atol=1e-10)
    assert torch.equal(side_grid.conv_grid(3, 2).ijk.cpu(), cpu_grid.conv_grid(3, 2).ijk)
    out = sg.ConvolutionPlan.from_grid(side_grid, 3, 2).execute(x, w)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-10, atol=1e-10)


def test_threads_on_their_own_streams_match_the_serial_results_bitwise(cuda_device):
    """Four host threads, each on a stream of its own, build grids and plans and run forward and backward
    passes in float32 and float16 (tiled kernels and tensor-core engine), and all use one shared plan
    whose lazy parts (transposed map, row orders) are first built inside them: every result equals the
    serial one bit for bit."""
    import threading

    members = [m.to(cuda_device) for m in sg.synthetic_shapes(4, 32, seed=31)]
    shared_grid = sg.GridBatch.from_ijk(members)
    shared = sg.ConvolutionPlan.from_grid(shared_grid, 3, 1, shared_grid)
    g = torch.Generator().manual_seed(31)
    x_cpu = torch.randn(shared_grid.num_voxels, 16, generator=g)
    weights_cpu = {k: torch.randn(16, 16, k, k, k, generator=g) / 8 for k in (2, 3)}

    def workload():
        results = []
        grid = sg.GridBatch.from_ijk(members)
        coarse = grid.conv_grid(2, 2)
        results += [grid.ijk, coarse.ijk, coarse.conv_transpose_grid(2, 2).ijk]
        plans = [(sg.ConvolutionPlan.from_grid(grid, 3, 1, grid), 3), (sg.ConvolutionPlan.from_grid(grid, 2, 2), 2),
                 (sg.ConvolutionPlan.from_grid_transposed(coarse, 2, 2, grid), 2), (shared, 3)]
        for dtype in (torch.float32, torch.float16):
            x = x_cpu.to(cuda_device, dtype)
            for plan, k in plans:
                source = x if plan.source_grid.num_voxels == x.shape[0] else x[:plan.source_grid.num_voxels]
                source = source.detach().requires_grad_(True)
                w = weights_cpu[k].to(cuda_device, dtype).detach().requires_grad_(True)
                y = plan.execute(source, w)
                y.float().square().sum().backward()
                results += [y.detach(), source.grad, w.grad]
        return [r.cpu() for r in results]

    serial = workload()
    outcomes, failures = [None] * 8, []

    def run(index):
        try:
            stream = torch.cuda.Stream(cuda_device)
            stream.wait_stream(torch.cuda.current_stream(cuda_device))
            with torch.cuda.stream(stream):
                outcomes[index] = workload()
        except Exception as error:  # reported below, with the thread's index
            failures.append(f"thread {index % 4}, round {index // 4}: {error!r}")

    for round_ in range(2):
        threads = [threading.Thread(target=run, args=(4 * round_ + t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not failures, failures
    for index, outcome in enumerate(outcomes):
        assert len(outcome) == len(serial)
        for n, (got, expected) in enumerate(zip(outcome, serial)):
            assert torch.equal(got, expected), f"thread {index % 4}, round {index // 4}: result {n} differs"


def test_other_cuda_devices_keep_their_work(cuda_device):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    other = torch.device("cuda", 1 if cuda_device.index == 0 else 0)
    grid, cpu_grid = grid_pair(9, device=other)
    assert grid.device == other and grid.conv_grid(3, 2).ijk.device == other
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 2)
    x = torch.randn(grid.num_voxels, 4, dtype=torch.float64)
    w = torch.randn(3, 4, 3, 3, 3, dtype=torch.float64)
    y = plan.execute(x.to(other), w.to(other))
    assert y.device == other
    torch.testing.assert_close(y.cpu(), sg.ConvolutionPlan.from_grid(cpu_grid, 3, 2).execute(x, w),
                               rtol=1e-10, atol=1e-10)


def test_modules_on_cuda_match_the_cpu(cuda_device):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        snn.SparseConv3d(4, 8, 3),
        snn.Features(torch.nn.ELU()),
        snn.SparseConv3d(8, 8, 3, stride=2),
        snn.Features(torch.nn.BatchNorm1d(8)),
        snn.SparseConvTranspose3d(8, 4, 2, stride=2),
    ).double()
    net_cuda = copy.deepcopy(net).to(cuda_device)
    _, cpu_grid = grid_pair(10)
    features = torch.randn(cpu_grid.num_voxels, 4, dtype=torch.float64)
    x_cpu = snn.SparseFeatures(cpu_grid, features)
    x_cuda = x_cpu.to(cuda_device)
    y_cpu, y_cuda = net(x_cpu), net_cuda(x_cuda)
    assert y_cuda.features.device == cuda_device
    assert_same_grid(y_cuda.grid, y_cpu.grid)
    torch.testing.assert_close(y_cuda.features.cpu(), y_cpu.features, rtol=1e-9, atol=1e-9)
    y_cpu.features.square().sum().backward()
    y_cuda.features.square().sum().backward()
    for (name, a), b in zip(net_cuda.named_parameters(), net.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-8, atol=1e-8, msg=lambda m: f"{name}: {m}")
    for pool in (snn.SparseMaxPool3d(2), snn.SparseAvgPool3d(2), snn.GlobalPool("mean"), snn.GlobalPool("max")):
        a, b = pool(x_cuda), pool(x_cpu)
        a, b = (a.features, b.features) if isinstance(a, snn.SparseFeatures) else (a, b)
        assert a.device == cuda_device
        torch.testing.assert_close(a.cpu(), b, rtol=1e-12, atol=1e-12)
    mask = torch.arange(cpu_grid.num_voxels) % 3 == 0
    pruned = snn.Prune()(x_cuda, mask.to(cuda_device))
    assert_same_grid(pruned.grid, snn.Prune()(x_cpu, mask).grid)
    torch.testing.assert_close(pruned.features.cpu(), x_cpu.features[mask], rtol=0, atol=0)


def test_prune_gathers_its_rows_without_a_torch_synchronisation(cuda_device):
    # Boolean indexing (features[mask]) waits for the device to count the rows; Prune takes the kept
    # rows by the index that pruned_grid returns (its own one sync is the library's, not torch's).
    grid, _ = grid_pair(7)
    x = snn.SparseFeatures(grid, torch.randn(grid.num_voxels, 5, device=cuda_device, requires_grad=True))
    mask = torch.arange(grid.num_voxels, device=cuda_device) % 2 == 0
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = snn.Prune()(x, mask)
        y.features.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(y.features, x.features[mask])
    assert torch.equal(x.features.grad, mask.to(x.features.dtype).unsqueeze(1).expand(-1, 5))


def test_tensors_on_the_wrong_device_raise_clear_errors(cuda_device):
    grid, cpu_grid = grid_pair(6)
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 1)
    name = str(cuda_device)
    x = torch.randn(grid.num_voxels, 4, device=cuda_device)
    w = torch.randn(2, 4, 3, 3, 3, device=cuda_device)
    with pytest.raises(RuntimeError, match=f"input is on cpu but the grid is on {name}"):
        plan.execute(x.cpu(), w)
    with pytest.raises(RuntimeError, match=f"weight is on cpu but the grid is on {name}"):
        plan.execute(x, w.cpu())
    with pytest.raises(RuntimeError, match=f"mask is on cpu but the grid is on {name}"):
        grid.pruned_grid(torch.ones(grid.num_voxels, dtype=torch.bool))
    with pytest.raises(RuntimeError, match=f"mask is on {name} but the grid is on cpu"):
        cpu_grid.refined_grid(2, torch.ones(grid.num_voxels, dtype=torch.bool, device=cuda_device))
    with pytest.raises(RuntimeError, match=f"query is on cpu but the grid is on {name}"):
        grid.ijk_to_index([torch.zeros(2, 3, dtype=torch.int32)] * 3)
    with pytest.raises(RuntimeError, match=f"other is on cpu but the grid is on {name}"):
        grid.merged_grid(cpu_grid)
    with pytest.raises(RuntimeError, match=f"target is on cpu but the source grid is on {name}"):
        sg.ConvolutionPlan.from_grid(grid, 3, 1, cpu_grid)
    with pytest.raises(ValueError, match="several devices"):
        sg.GridBatch.from_ijk([torch.zeros(1, 3, dtype=torch.int32), torch.zeros(1, 3, dtype=torch.int32,
                                                                                 device=cuda_device)])
    with pytest.raises(ValueError, match=f"features are on cpu but the grid is on {name}"):
        snn.SparseFeatures(grid, x.cpu())
    with pytest.raises(RuntimeError, match="float16 and bfloat16 run on CUDA only"):
        sg.ConvolutionPlan.from_grid(cpu_grid, 3, 1).execute(x.cpu().half(), w.cpu().half())
    with pytest.raises(RuntimeError, match=r"dtype of input \(Half\) or be float32, got Double"):
        plan.execute(x.half(), w.double())
    with pytest.raises(RuntimeError, match=r"dtype of input \(Float\), got Half"):
        plan.execute(x, w.half())
    with pytest.raises(RuntimeError, match=r"dtype must be the dtype of input .*float32 with float16"):
        plan._handle.backward_weight(x, torch.zeros(plan.target_grid.num_voxels, w.shape[0], device=cuda_device),
                                     torch.float16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_float32_weights_with_16_bit_features(dtype, cuda_device):
    # execute and the operator sparse_conv (one autograd in C++) take a float32 weight with
    # 16-bit features: the output and the features' gradient are bitwise those of the weight cast first,
    # the weight's gradient is float32 and rounds to the cast weight's. Engine-sized and odd channels,
    # gathering (k3s1, k3s2), scattering (the generative k2s2) and the identity plan.
    torch.manual_seed(1)
    grid = sg.GridBatch.from_ijk(sg.synthetic_shapes(2, 24, seed=7), device=cuda_device)
    plans = [(sg.ConvolutionPlan.from_grid(grid, 3, 1, grid), 3), (sg.ConvolutionPlan.from_grid(grid, 3, 2), 3),
             (sg.ConvolutionPlan.from_grid_transposed(grid, 2, 2), 2),
             (sg.ConvolutionPlan.from_grid(grid, 1, 1, grid), 1)]
    assert plans[-1][0].is_identity
    for plan, k in plans:
        for cin, cout in ((32, 16), (3, 5)):
            features = torch.randn(plan.source_grid.num_voxels, cin, device=cuda_device).to(dtype)
            weight = torch.randn(cout, cin, k, k, k, device=cuda_device)
            grad = torch.randn(plan.target_grid.num_voxels, cout, device=cuda_device).to(dtype)
            results = []
            for run in (plan.execute, lambda f, w: torch.ops.sparsegrid.sparse_conv(f, w, plan._handle)):
                f = features.clone().requires_grad_(True)
                w = weight.clone().requires_grad_(True)
                out = run(f, w)
                out.backward(grad)
                assert out.dtype == dtype and f.grad.dtype == dtype and w.grad.dtype == torch.float32
                results.append((out, f.grad, w.grad))
            f = features.clone().requires_grad_(True)
            w = weight.to(dtype).requires_grad_(True)
            out = plan.execute(f, w)
            out.backward(grad)
            for mixed in results:
                assert torch.equal(mixed[0], out)
                assert torch.equal(mixed[1], f.grad)
                assert torch.equal(mixed[2].to(dtype), w.grad)
                assert not torch.equal(mixed[2], w.grad.float())
            assert torch.equal(results[0][2], results[1][2])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_convolution_layers_follow_cuda_autocast(dtype, cuda_device):
    # Inside torch.autocast("cuda") a layer runs in the autocast dtype: bitwise the layer on features and
    # parameters cast by hand, with float32 parameter gradients (the bias's the hand-cast one widened, the
    # weight's the float32 sum that the hand-cast one rounds).
    torch.manual_seed(0)
    grid = sg.GridBatch.from_ijk(sg.synthetic_shapes(2, 24, seed=5), device=cuda_device)
    layers = [snn.SparseConv3d(16, 32, 3), snn.SparseConvTranspose3d(16, 8, 2, stride=2)]
    features = torch.randn(grid.num_voxels, 16, device=cuda_device)
    for layer in layers:
        layer.to(cuda_device)
        with torch.autocast("cuda", dtype=dtype):
            out = layer(snn.SparseFeatures(grid, features))
        assert out.features.dtype == dtype
        grad = torch.randn_like(out.features)
        out.features.backward(grad)
        assert layer.weight.grad.dtype == torch.float32 and layer.bias.grad.dtype == torch.float32
        by_autocast = (out.features, layer.weight.grad.clone(), layer.bias.grad.clone())
        layer.zero_grad(set_to_none=True)

        cast = copy.deepcopy(layer).to(dtype)
        by_hand = cast(snn.SparseFeatures(grid, features.to(dtype)))
        by_hand.features.backward(grad)
        assert torch.equal(by_autocast[0], by_hand.features)
        # The float32 weight's gradient is the float32 sum that the cast weight's gradient rounds.
        assert torch.equal(by_autocast[1].to(dtype), cast.weight.grad)
        assert not torch.equal(by_autocast[1], cast.weight.grad.float())
        assert torch.equal(by_autocast[2], cast.bias.grad.float())
    # float64 features keep their dtype, as torch's autocast leaves float64 alone.
    layer = snn.SparseConv3d(16, 8, 3).to(cuda_device, torch.float64)
    with torch.autocast("cuda", dtype=dtype):
        assert layer(snn.SparseFeatures(grid, features.double())).features.dtype == torch.float64
