"""sparsegrid.nn.BatchNorm against torch.nn.BatchNorm1d followed by the activation module: outputs,
running statistics, counters and gradients, in training and evaluation, with and without affine
parameters and running statistics, momentum=None, float64 and float32 on the CPU and, with a CUDA
device, float32 / float64 against the CPU and float16 / bfloat16 against float32; also state dicts,
SparseFeatures, empty inputs, reproducibility and the errors. Seeds are fixed and appear in the test ids."""

import pytest
import torch

import sparsegrid as sg
from sparsegrid import nn as snn

from test_cuda import cuda_device_or_skip

ACTIVATIONS = {
    None: lambda p: torch.nn.Identity(),
    "relu": lambda p: torch.nn.ReLU(),
    "leaky_relu": lambda p: torch.nn.LeakyReLU(p if p is not None else 0.01),
    "elu": lambda p: torch.nn.ELU(p if p is not None else 1.0),
    "silu": lambda p: torch.nn.SiLU(),
}


def reference_pair(channels, activation, parameter=None, **options):
    """(sparsegrid.nn.BatchNorm, BatchNorm1d + activation) with equal random parameters."""
    ours = snn.BatchNorm(channels, activation=activation, activation_parameter=parameter, **options)
    bn = torch.nn.BatchNorm1d(channels, **options)
    if bn.affine:
        with torch.no_grad():
            bn.weight.uniform_(-2, 2)
            bn.bias.uniform_(-1, 1)
    if bn.track_running_stats:
        with torch.no_grad():
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.num_batches_tracked.fill_(4)
    ours.load_state_dict(bn.state_dict())
    return ours, torch.nn.Sequential(bn, ACTIVATIONS[activation](parameter))


def features(rows, channels, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    offset = torch.empty(channels).uniform_(-10, 10, generator=g)
    scale = torch.empty(channels).uniform_(0.2, 4, generator=g)
    return (offset + scale * torch.randn(rows, channels, generator=g, dtype=torch.float64)).to(dtype).to(device)


def run(module, x, grad):
    x = x.clone().requires_grad_(True)
    y = module(x)
    y.backward(grad)
    params = [p.grad for p in module.parameters()]
    return y.detach(), x.grad, params


@pytest.mark.parametrize("activation", [None, "relu", "leaky_relu", "elu", "silu"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("options", [{}, {"affine": False}, {"track_running_stats": False}, {"momentum": None}],
                         ids=["default", "no-affine", "no-running", "cumulative"])
def test_matches_batchnorm1d_and_activation(activation, training, options):
    torch.manual_seed(1)
    parameter = {"leaky_relu": 0.2, "elu": 0.7}.get(activation)
    ours, reference = reference_pair(5, activation, parameter, **options)
    ours, reference = ours.double(), reference.double()
    ours.train(training)
    reference.train(training)
    x = features(700, 5)
    grad = torch.randn(700, 5, dtype=torch.float64)
    for step in range(2):  # the second step sees the running statistics the first one updated
        y, dx, dparams = run(ours, x + step, grad)
        y_ref, dx_ref, dparams_ref = run(reference, x + step, grad)
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(dx, dx_ref, rtol=1e-9, atol=1e-9)
        for got, want in zip(dparams, dparams_ref):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
        for name, buffer in reference[0].named_buffers():
            torch.testing.assert_close(getattr(ours, name), buffer, rtol=1e-12, atol=1e-12, msg=name)
        for p in ours.parameters():
            p.grad = None
        for p in reference.parameters():
            p.grad = None


def test_float32_and_sparse_features():
    torch.manual_seed(2)
    ours, reference = reference_pair(3, "elu")
    grid = sg.GridBatch.from_ijk([torch.randint(-9, 9, (300, 3), dtype=torch.int32),
                                  torch.zeros((0, 3), dtype=torch.int32), torch.randint(0, 5, (50, 3)).int()])
    x = snn.SparseFeatures(grid, features(grid.num_voxels, 3, torch.float32))
    out = ours(x)
    assert isinstance(out, snn.SparseFeatures) and out.grid is grid
    torch.testing.assert_close(out.features, reference(x.features), rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(ours.running_var, reference[0].running_var)
    assert ours.num_batches_tracked.item() == reference[0].num_batches_tracked.item() == 5


def test_state_dict_round_trip_and_repr():
    ours = snn.BatchNorm(4, activation="leaky_relu", activation_parameter=0.3)
    assert set(ours.state_dict()) == set(torch.nn.BatchNorm1d(4).state_dict())
    assert "activation='leaky_relu'" in repr(ours) and "activation_parameter=0.3" in repr(ours)
    torch.nn.BatchNorm1d(4).load_state_dict(ours.state_dict())


def test_empty_and_single_rows():
    ours = snn.BatchNorm(3, activation="relu")
    before = ours.running_mean.clone()
    out = ours(torch.empty(0, 3))
    assert out.shape == (0, 3)
    torch.testing.assert_close(ours.running_mean, before)  # no rows: the statistics stay
    with pytest.raises(RuntimeError, match="more than 1 row"):
        ours(torch.randn(1, 3))
    ours.eval()
    assert ours(torch.randn(1, 3)).shape == (1, 3)


def test_errors():
    with pytest.raises(ValueError, match="activation must be one of"):
        snn.BatchNorm(3, activation="tanh")
    with pytest.raises(ValueError, match="takes no activation_parameter"):
        snn.BatchNorm(3, activation="relu", activation_parameter=0.5)
    ours = snn.BatchNorm(3)
    with pytest.raises(ValueError, match=r"expected features \[N, 3\]"):
        ours(torch.randn(4, 2))
    with pytest.raises(RuntimeError, match="weight must be float64 for float64 features"):
        ours(torch.randn(4, 3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="CUDA only"):
        ours(torch.randn(4, 3).half())
    with pytest.raises(RuntimeError, match="activation must be 0"):
        torch.ops.sparsegrid.batch_norm_forward(torch.randn(4, 3), None, None, None, None, None, True, 0.1, False,
                                                1e-5, 7, 0.0)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_differentiable_once(affine):
    """First-order gradients under create_graph are the plain ones; a second backward pass through them
    raises (also next to a differentiable term), instead of counting them as constants."""
    torch.manual_seed(4)
    ours = snn.BatchNorm(3, activation="elu", affine=affine).double()
    x = torch.randn(40, 3, dtype=torch.float64, requires_grad=True)
    wanted = (x, ours.weight) if affine else (x,)
    first = torch.autograd.grad(ours(x).square().sum(), wanted, create_graph=True)
    plain = torch.autograd.grad(ours(x).square().sum(), wanted)
    for a, b in zip(first, plain):
        assert torch.equal(a.detach(), b)
    for second in (first[0].sum(), first[-1].sum() + x.sum()):
        with pytest.raises(RuntimeError, match="gradients of batch_norm are not differentiable"):
            torch.autograd.grad(second, wanted, allow_unused=True)


def test_reproducible():
    ours = snn.BatchNorm(6, activation="silu")
    x = features(20000, 6, torch.float32)
    grad = torch.randn(20000, 6)
    first, second = run(ours, x, grad), run(ours, x, grad)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("activation", [None, "elu", "silu"])
def test_cuda_matches_cpu(dtype, activation):
    device = cuda_device_or_skip()
    torch.manual_seed(3)
    ours, _ = reference_pair(40, activation)
    ours = ours.to(dtype)
    on_cuda = snn.BatchNorm(40, activation=activation).to(dtype).to(device)
    on_cuda.load_state_dict(ours.state_dict())
    x = features(150000, 40, dtype)  # 1,024 chunks of 147 rows
    grad = torch.randn(150000, 40, dtype=dtype)
    tolerance = 1e-10 if dtype == torch.float64 else 1e-4
    for training in (True, False):
        ours.train(training)
        on_cuda.train(training)
        start = {name: value.clone() for name, value in on_cuda.state_dict().items()}
        want, got = run(ours, x, grad), run(on_cuda, x.to(device), grad.to(device))
        for a, b in zip((want[0], want[1], *want[2]), (got[0], got[1], *got[2])):
            torch.testing.assert_close(b.cpu(), a, rtol=tolerance, atol=tolerance * max(1.0, a.abs().max().item()))
        torch.testing.assert_close(on_cuda.running_var.cpu(), ours.running_var, rtol=tolerance, atol=tolerance)
        assert on_cuda.num_batches_tracked.item() == ours.num_batches_tracked.item()
        # The same step again from the same state: bitwise the same (and the same state after it).
        got = [got[0], got[1], [g.clone() for g in got[2]]]
        on_cuda.load_state_dict(start)
        for p in on_cuda.parameters():
            p.grad = None
        again = run(on_cuda, x.to(device), grad.to(device))
        assert torch.equal(again[0], got[0]) and torch.equal(again[1], got[1])
        assert all(torch.equal(a, b) for a, b in zip(again[2], got[2]))
        for p in list(ours.parameters()) + list(on_cuda.parameters()):
            p.grad = None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_against_float32(dtype):
    device = cuda_device_or_skip()
    torch.manual_seed(4)
    reference = snn.BatchNorm(16, activation="elu").to(device)
    ours = snn.BatchNorm(16, activation="elu").to(device)  # float32 parameters with 16-bit features
    x = features(5000, 16, torch.float32, device).to(dtype)
    grad = torch.randn(5000, 16, device=device).to(dtype)
    want = run(reference, x.float(), grad.float())
    got = run(ours, x, grad)
    assert got[0].dtype == dtype and got[1].dtype == dtype and got[2][0].dtype == torch.float32
    bits = 8 if dtype == torch.bfloat16 else 11
    tolerance = 4 * 2.0 ** -bits
    torch.testing.assert_close(got[0].float(), want[0], rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(got[1].float(), want[1], rtol=tolerance, atol=tolerance * 4)
    for a, b in zip(want[2], got[2]):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-3 * a.abs().max().item())
    torch.testing.assert_close(ours.running_mean, reference.running_mean, rtol=tolerance, atol=tolerance)


def test_cuda_no_host_synchronisation():
    device = cuda_device_or_skip()
    ours = snn.BatchNorm(8, activation="relu", momentum=None).to(device)
    x = torch.randn(1000, 8, device=device, requires_grad=True)
    ours(x).sum().backward()  # warm-up
    torch.cuda.synchronize()
    before = sg.host_synchronizations()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ours(x).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert sg.host_synchronizations() == before
