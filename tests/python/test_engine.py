"""The CUDA tensor-core convolution engine from Python: its configurations can be listed and forced, every
configuration and the tuner give bitwise the same forward and backward results in float16, bfloat16
and TF32, and bad names or types raise naming the function."""

import pytest
import torch

import sparsegrid as sg

CUDA = torch.cuda.is_available() and sg.cuda_backend_available()


@pytest.fixture
def automatic_engine():
    yield
    sg.set_convolution_engine_configuration("auto")
    sg.set_convolution_engine_tuning(False)


def test_names_and_types_are_checked(automatic_engine):
    with pytest.raises(RuntimeError, match="set_convolution_engine_configuration: configuration must be auto"):
        sg.set_convolution_engine_configuration("fastest")
    with pytest.raises(TypeError, match="name must be a str"):
        sg.set_convolution_engine_configuration(3)
    with pytest.raises(TypeError, match="enabled must be a bool"):
        sg.set_convolution_engine_tuning(1)
    sg.set_convolution_engine_configuration("off")
    sg.set_convolution_engine_configuration("auto")
    names = sg.convolution_engine_configurations()
    assert all(isinstance(name, str) for name in names)
    assert len(names) == len(set(names))
    for name in names:
        sg.set_convolution_engine_configuration(name)


def run(plan, x, w, g):
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    y = plan.execute(x, w)
    y.backward(g)
    return y.detach(), x.grad, w.grad


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and the CUDA backend")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_every_configuration_and_the_tuner_agree_bitwise(dtype, automatic_engine, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", dtype == torch.float32)
    generator = torch.Generator().manual_seed(5)
    shapes = sg.synthetic_shapes(3, 24, seed=5, device="cuda")
    grid = sg.GridBatch.from_ijk(shapes, device="cuda")
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 1, target=grid)
    cin, cout = 40, 24
    x = torch.randn(grid.num_voxels, cin, generator=generator).to("cuda", dtype)
    w = (torch.randn(cout, cin, 3, 3, 3, generator=generator) / 10).to("cuda", dtype)
    g = torch.randn(grid.num_voxels, cout, generator=generator).to("cuda", dtype)
    reference = run(plan, x.double(), w.double(), g.double())
    first = run(plan, x, w, g)
    tolerance = {torch.float16: 2e-2, torch.bfloat16: 1e-1, torch.float32: 1e-2}[dtype]
    for name, value, ref in zip(("forward", "input gradient", "weight gradient"), first, reference):
        error = (value.double() - ref).norm() / ref.norm()
        assert error < tolerance, f"{name}: relative error {error:.2e}"
    for configuration in sg.convolution_engine_configurations():
        sg.set_convolution_engine_configuration(configuration)
        for name, value, expected in zip(("forward", "input gradient", "weight gradient"), run(plan, x, w, g), first):
            assert torch.equal(value, expected), f"{configuration}: {name} differs"
    sg.set_convolution_engine_configuration("auto")
    file = tmp_path / "tuning.txt"
    sg.set_convolution_engine_tuning(True, file)
    before = sg.host_synchronizations()
    tuned = run(plan, x, w, g)
    assert sg.host_synchronizations() > before
    assert file.read_text().count("\n") == 3  # forward, input gradient, weight gradient
    for value, expected in zip(tuned, first):
        assert torch.equal(value, expected)
