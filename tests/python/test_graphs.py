"""CUDA-graph capture of the convolutions: a network over grids whose plans exist already (built in a
warm-up step) is captured with torch.cuda.graph, forward and backward, and each replay gives bitwise the
outputs and gradients of the same step run eagerly. What cannot be captured (building a grid whose size
depends on the data: it reads the size back) raises, instead of recording a wrong graph.

Skips without a CUDA device, or with a torch without torch.cuda.graph; SPARSEGRID_REQUIRE_CUDA=1 (the
GPU check) turns the skip into a failure."""

import pytest
import torch
from torch import nn

import sparsegrid as sg
from sparsegrid import nn as snn

from test_cuda import cuda_device_or_skip
from test_sparsegrid import random_members


@pytest.fixture(autouse=True)
def cuda_device():
    missing = None if hasattr(torch.cuda, "graph") else f"torch {torch.__version__} has no torch.cuda.graph"
    return cuda_device_or_skip(missing)


class Network(nn.Module):
    """An encoder level down and a transposed convolution back onto the input grid: submanifold, strided
    (generated target) and transposed (given target) plans, two channel counts the tensor-core engine
    takes and one (3) it does not."""

    def __init__(self):
        super().__init__()
        self.inner = snn.SparseConv3d(3, 16, 3)
        self.down = snn.SparseConv3d(16, 32, 3, 2)
        self.coarse = snn.SparseConv3d(32, 32, 3)
        self.up = snn.SparseConvTranspose3d(32, 16, 3, 2)
        self.out = snn.SparseConv3d(16, 8, 3)

    def forward(self, x):
        x = snn.Features(nn.ELU())(self.inner(x))
        skip = x
        x = snn.Features(nn.ELU())(self.coarse(self.down(x)))
        x = self.up(x, target=skip.grid)
        return self.out(x.replace(x.features + skip.features)).features


def grid_on(device, seed):
    """Four procedural surfaces (some 7,000 voxels: past the size from which plans order their rows, so
    the execution orders are captured too) and a small random member."""
    members = sg.synthetic_shapes(4, 32, seed) + random_members(seed, 2, empty=())
    return sg.GridBatch.from_ijk([m.to(device) for m in members], device=device)


def assert_capture_replays_eager(step, inputs, named_params, side):
    """Runs step(features) (forward and backward) eagerly on each of `inputs`, after two warm-up runs
    (every plan, kept on the grids, their execution orders, transposed maps and the gradients' buffers),
    then captures it on `side` without a host synchronisation and checks that replays on the same inputs
    give bitwise the eager outputs and gradients. Called on the stream `side`."""
    params = [p for _, p in named_params]

    def eager(features):
        for p in params:
            p.grad = None
        out = step(features)
        return out.detach().clone(), [p.grad.detach().clone() for p in params]

    for _ in range(2):
        eager(inputs[0])
    expected = [eager(x) for x in inputs]

    static_input = inputs[0].clone()
    for p in params:
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    syncs = sg.host_synchronizations()
    with torch.cuda.graph(graph, stream=side):
        static_out = step(static_input)
    assert sg.host_synchronizations() == syncs, "the captured step waited for the GPU"
    static_grads = [p.grad for p in params]

    for x, (out, grads) in zip(reversed(inputs), reversed(expected)):
        static_input.copy_(x)
        graph.replay()  # the gradients were None when captured: each replay writes them anew
        side.synchronize()
        assert torch.equal(static_out, out), "captured output differs from the eager one"
        for (name, _), captured, want in zip(named_params, static_grads, grads):
            assert torch.equal(captured, want), f"captured gradient of {name} differs from the eager one"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
def test_captured_forward_and_backward_replay_the_eager_step_bitwise(cuda_device, dtype):
    # A grid's work runs on the stream that was current when it was built, so the grid is built on the
    # stream the graph is captured on (torch.cuda.graph(stream=...)): on any other stream the library's
    # launches would not be part of the capture. The warm-up runs there too, as torch.cuda.graph asks.
    torch.manual_seed(7)
    model = Network().to(cuda_device, dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        grid = grid_on(cuda_device, 3101)
        inputs = [torch.randn(grid.num_voxels, 3, device=cuda_device, dtype=dtype) for _ in range(3)]
        probe = torch.randn(grid.num_voxels, 8, device=cuda_device, dtype=dtype)

        def step(features):
            out = model(snn.SparseFeatures(grid, features))
            (out.float() * probe.float()).sum().backward()
            return out

        assert_capture_replays_eager(step, inputs, list(model.named_parameters()), side)
    torch.cuda.current_stream().wait_stream(side)


def test_a_data_dependent_grid_cannot_be_captured(cuda_device):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        grid = grid_on(cuda_device, 3102)
        grid.conv_grid(3, 2)  # the first call, outside capture, works
        g = torch.cuda.CUDAGraph()
        with pytest.raises(Exception):
            with torch.cuda.graph(g, stream=side):
                # The coarse grid's size is read back, which capture does not allow.
                grid.conv_grid(3, 2)
        side.synchronize()
        # The failed capture leaves the library usable.
        assert grid.conv_grid(3, 2).num_voxels > 0
    torch.cuda.current_stream().wait_stream(side)


def test_a_captured_training_step_replays_the_eager_steps_bitwise(cuda_device):
    # Forward, backward and the optimizer step (Adam with capturable=True keeps its step count on the
    # device) captured once and replayed three times, against three eager steps from the same start.
    def make():
        torch.manual_seed(11)
        model = Network().to(cuda_device)
        return model, torch.optim.Adam(model.parameters(), lr=1e-2, capturable=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        grid = grid_on(cuda_device, 3103)
        generator = torch.Generator(device=cuda_device).manual_seed(5)
        batches = [torch.randn(grid.num_voxels, 3, device=cuda_device, generator=generator) for _ in range(3)]

        def train_step(model, optimizer, features):
            optimizer.zero_grad(set_to_none=False)
            out = model(snn.SparseFeatures(grid, features))
            out.square().mean().backward()
            optimizer.step()

        eager_model, eager_optimizer = make()
        for features in batches:
            train_step(eager_model, eager_optimizer, features)

        model, optimizer = make()
        static_features = batches[0].clone()
        # Warm-up on a copy of the start (gradients allocated, plans and their orders built), then the
        # parameters and the optimizer state are reset to the start before capturing.
        start = {name: p.detach().clone() for name, p in model.named_parameters()}
        for _ in range(2):
            train_step(model, optimizer, static_features)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(start[name])
        for state in optimizer.state.values():
            for value in state.values():
                value.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            train_step(model, optimizer, static_features)
        # Capture ran nothing: the start is unchanged. Each replay is one training step.
        for features in batches:
            static_features.copy_(features)
            graph.replay()
        side.synchronize()
        for (name, p), q in zip(model.named_parameters(), eager_model.parameters()):
            assert torch.equal(p, q), f"{name} after three captured steps differs from three eager steps"
    torch.cuda.current_stream().wait_stream(side)


def test_a_decoder_level_after_its_prune_is_captured_and_replays_bitwise(cuda_device):
    # A generative decoder level: the prune (data-dependent: it reads the kept count back) runs eagerly,
    # then the level on the pruned grid, a generative transposed convolution (k2s2) to the grid it
    # generates, a submanifold convolution there and the head's logits, is captured forward and
    # backward once its plans exist, and replays the eager level bitwise for new features.
    torch.manual_seed(13)
    up = snn.SparseConvTranspose3d(16, 8, 2, 2).to(cuda_device)
    refine = snn.SparseConv3d(8, 8, 3).to(cuda_device)
    head = snn.SparseConv3d(8, 1, 1).to(cuda_device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        coarse = grid_on(cuda_device, 3104)
        keep = torch.arange(coarse.num_voxels, device=cuda_device) % 3 != 0
        features = torch.randn(coarse.num_voxels, 16, device=cuda_device)
        pruned = snn.Prune()(snn.SparseFeatures(coarse, features), keep)
        inputs = [torch.randn_like(pruned.features) for _ in range(3)]

        def level(x):
            fine = snn.Features(nn.ELU())(up(snn.SparseFeatures(pruned.grid, x)))
            logits = head(refine(fine)).features
            logits.square().sum().backward()
            return logits

        named = [(f"{name}.{n}", p) for name, module in (("up", up), ("refine", refine), ("head", head))
                 for n, p in module.named_parameters()]
        assert_capture_replays_eager(level, inputs, named, side)
    torch.cuda.current_stream().wait_stream(side)


def test_batch_norm_is_captured_and_replays_bitwise(cuda_device):
    # sparsegrid.nn.BatchNorm between two convolutions, training: its statistics, running statistics and
    # counter (momentum=None: the cumulative average reads the counter on the device) are all in the graph.
    torch.manual_seed(17)
    conv = snn.SparseConv3d(3, 16, 3).to(cuda_device)
    norm = snn.BatchNorm(16, activation="elu", momentum=None).to(cuda_device)
    head = snn.SparseConv3d(16, 8, 3).to(cuda_device)
    named = [(f"{name}.{key}", p) for name, module in (("conv", conv), ("norm", norm), ("head", head))
             for key, p in module.named_parameters()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        grid = grid_on(cuda_device, 3105)
        inputs = [torch.randn(grid.num_voxels, 3, device=cuda_device) for _ in range(3)]
        probe = torch.randn(grid.num_voxels, 8, device=cuda_device)

        def step(features):
            out = head(norm(conv(snn.SparseFeatures(grid, features)))).features
            (out * probe).sum().backward()
            return out

        assert_capture_replays_eager(step, inputs, named, side)
        # Two warm-up and three eager steps, then three replays (the capture itself runs nothing).
        assert norm.num_batches_tracked.item() == 8
    torch.cuda.current_stream().wait_stream(side)
