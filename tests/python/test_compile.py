"""torch.compile of sparsegrid.nn networks: the convolutions are traced through their custom operators
(fake implementations give the shapes), grids and plans run eagerly at graph breaks, and the compiled
forward and backward pass agree with the eager ones."""

import gc

import pytest
import torch

import sparsegrid as sg
from sparsegrid import _compile
from sparsegrid import nn as snn

pytestmark = pytest.mark.skipif(
    not _compile.available,
    reason="this torch has no torch.compile custom operators (torch.library.custom_op, torch 2.4 and later)")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and sg.cuda_backend_available() else [])


class Net(torch.nn.Module):
    """A level down and back up: submanifold, strided and generative transposed convolutions, with dense
    ops between them for the compiler to fuse."""

    def __init__(self):
        super().__init__()
        self.inner = snn.SparseConv3d(4, 16, 3)
        self.down = snn.SparseConv3d(16, 16, 2, stride=2)
        self.coarse = snn.SparseConv3d(16, 16, 3)
        self.up = snn.SparseConvTranspose3d(16, 8, 2, stride=2)
        self.act = snn.Features(torch.nn.SiLU())

    def forward(self, x):
        y = self.act(self.inner(x))
        z = self.act(self.coarse(self.act(self.down(y))))
        u = self.up(z, target=y.grid)
        return (u.features * torch.tanh(y.features[:, :8])).square().mean()


def _inputs(device, seed):
    grid = sg.GridBatch.from_ijk(sg.synthetic_shapes(3, 16, seed=seed), device=device)
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(grid.num_voxels, 4, generator=generator).to(device)
    return grid, features


def _loss_and_grads(model, grid, features):
    x = features.clone().requires_grad_(True)
    loss = model(snn.SparseFeatures(grid, x))
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad]
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_network_matches_eager(device):
    torch.manual_seed(0)
    model = Net().to(device)
    # Inductor on CUDA; on the CPU the AOT tracer alone (fake tensors through the operators, no C++
    # compiler needed).
    compiled = torch.compile(model, backend="inductor" if device == "cuda" else "aot_eager")
    for seed in (1, 2, 3):  # new grids, new plans and new voxel counts at every step
        grid, features = _inputs(device, seed)
        loss, grads = _loss_and_grads(model, grid, features)
        compiled_loss, compiled_grads = _loss_and_grads(compiled, grid, features)
        torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-7)
        for compiled_grad, grad in zip(compiled_grads, grads):
            torch.testing.assert_close(compiled_grad, grad, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif("cuda" not in DEVICES, reason="16-bit convolutions run on CUDA only")
def test_compiled_network_under_autocast_matches_eager():
    # Under autocast the layers pass their float32 weights to the bfloat16 operators uncast: the fake
    # implementations must give the features' dtype to the output and the weight's to its gradient.
    torch.manual_seed(0)
    model = Net().to("cuda")
    compiled = torch.compile(model, backend="aot_eager")
    grid, features = _inputs("cuda", 6)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, grads = _loss_and_grads(model, grid, features)
        compiled_loss, compiled_grads = _loss_and_grads(compiled, grid, features)
    assert all(grad.dtype == torch.float32 for grad in grads)
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-2, atol=1e-4)
    for compiled_grad, grad in zip(compiled_grads, grads):
        assert compiled_grad.dtype == grad.dtype
        torch.testing.assert_close(compiled_grad, grad, rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_convolution_traces_through_the_operator(device):
    grid, features = _inputs(device, 4)
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 1, grid)
    weight = torch.randn(5, 4, 3, 3, 3, device=device)

    def layer(x, w):
        return torch.relu(plan.execute(x, w) + 1.0)

    explanation = torch._dynamo.explain(layer)(features, weight)
    assert explanation.graph_count >= 1
    operators = [str(node.target) for graph in explanation.graphs for node in graph.graph.nodes]
    assert any("sparsegrid.conv" in name for name in operators), operators
    compiled = torch.compile(layer, backend="aot_eager")
    torch.testing.assert_close(compiled(features, weight), layer(features, weight), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_plan_dropped_after_the_forward_pass_still_serves_the_backward_pass(device):
    torch.manual_seed(0)
    model = Net().to(device)
    compiled = torch.compile(model, backend="aot_eager")
    before = len(_compile._handles)
    grid, features = _inputs(device, 5)
    x = features.clone().requires_grad_(True)
    loss = compiled(snn.SparseFeatures(grid, x))
    del grid  # the grids and their cached plans are gone; the autograd graph keeps the plans' keys
    gc.collect()
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    del loss, x
    gc.collect()
    assert len(_compile._handles) == before, "plans of finished steps must be released"
