"""Generative shape VAE on sparse voxel grids, trained on procedural closed shapes.

Encoder: 4 levels of (strided k3s2 conv, k3s1 conv), batch norm and ELU, then a dense k2 convolution over
the last level's small cube of cells: the latent is spatial, a Gaussian of --latent channels per cell of a
(resolution / 16)^3 cube. Decoder: two dense convolutions turn that cube into the features of a seed cube
of as many voxels per shape, then 4 levels of (generative transposed k2s2 conv, k3s1 conv, 1x1 occupancy
classifier, prune): the topology is generated and pruned anew at every step, which is what sparsegrid is
built for. The loss is the occupancy BCE of each level, averaged over the levels, plus the KL term (summed
over the latent cube per shape). In the first --teacher-forcing part of training the voxels of the target
at each level are kept as well, so every level sees its whole ground truth while the predictions are still
poor; after that each level keeps only what it predicts, as at inference. Adam's learning rate decays to
zero along a cosine.

Trains on procedural shapes plus triangle meshes (by default the bundled Stanford bunny), voxelised as
surfaces at the training resolution, on --device (auto: CUDA when torch sees a GPU). Prints a progress
line every --print-every iterations with the mean loss and the per-iteration time split measured by
StepProfiler (topology and plan construction, convolutions forward and backward, everything else), and
at the end the intersection-over-union of reconstructions with their inputs; with --output it writes
loss.png and reconstructions.png. With --world-size N it trains N processes with torch.distributed and
DistributedDataParallel (NCCL with one GPU per process on CUDA, gloo on the CPU): each rank samples its
own batches and builds its own topology; gradients are averaged by DDP. The last lines give the
throughput (shapes per second over all processes, after the first fifth of the iterations).
Usage: PYTHONPATH=python python3 examples/vae.py [--device auto] [--resolution 32] [--batch 8]
       [--iterations 300] [--output DIR]
"""

import argparse
import contextlib
import inspect
import math
import os
import pathlib
import socket
import sys
import time

import torch
from torch import nn

import sparsegrid as sg
from sparsegrid import nn as snn

LEVELS = 4
ROOT = pathlib.Path(__file__).resolve().parents[1]


def norm_elu(channels, norm="torch"):
    """Batch norm and ELU: torch's BatchNorm1d and ELU modules ("torch"), or sparsegrid.nn.BatchNorm with
    the ELU fused ("fused": the same function in one call, fewer launches and less host time per step)."""
    if norm == "fused":
        return [snn.BatchNorm(channels, activation="elu")]
    if norm != "torch":
        raise ValueError(f"norm must be 'torch' or 'fused', got {norm!r}")
    return [snn.Features(nn.BatchNorm1d(channels)), snn.Features(nn.ELU())]


def conv_block(cin, cout, kernel, stride, norm="torch"):
    """Convolution, batch norm, ELU. The convolution has no bias: the batch norm right after it subtracts
    each channel's mean, and any bias with it (ResNets leave it out of torch.nn.Conv3d before BatchNorm3d
    for the same reason), while on CUDA each bias would cost an addition, a cast under autocast and a
    reduction in the backward pass, queued from the host at every step."""
    return [snn.SparseConv3d(cin, cout, kernel, stride, bias=False)] + norm_elu(cout, norm)


class Encoder(nn.Module):
    """cube_side: the edge of the last level's cube, resolution / 2^LEVELS + 1 (a k3s2 convolution takes
    voxels in [0, n) to [0, n / 2], so inputs in [0, resolution)^3 end in [0, resolution / 2^LEVELS]^3).
    latent: the latent channels per cell.

    The latent is spatial: a mean and a log-variance per cell of a (resolution / 2^LEVELS)^3 cube, the
    decoder's seed cube. A single code for the whole shape (a linear map of the flattened cube to 32
    numbers) had to carry every detail of it: at resolution 64 it reconstructed held-out shapes with an
    IoU of 0.63 after 5000 iterations of batch 16, about as well as the training shapes. The head is a dense
    k2 convolution over the last level's cube: a chain of 4 k3s2 convolutions takes fine voxel 16j to
    cell j, and the decoder's seed voxel j becomes fine voxels [16j, 16j + 16), which cells j and j + 1
    straddle, so latent cell j reads those two cells along each axis."""

    def __init__(self, channels, latent, cube_side, norm="torch"):
        super().__init__()
        layers, cin = [], 1
        for c in channels:
            layers += conv_block(cin, c, 3, 2, norm) + conv_block(c, c, 3, 1, norm)
            cin = c
        self.body = nn.Sequential(*layers)
        self.cube_side = cube_side
        self.head = nn.Conv3d(cin, 2 * latent, kernel_size=2)

    def forward(self, x, levels=None):
        """x: voxels in [0, resolution)^3. levels: the grids of the strided levels, x.grid.pyramid(3, 2,
        LEVELS)[0], built together with one host synchronisation; None builds each from the one before
        (one synchronisation each). Returns the mean and log-variance, [batch_size, latent, S, S, S] each
        with S = cube_side - 1, indexed by the seed voxel's (i, j, k)."""
        level = 0
        for module in self.body:
            if levels is not None and isinstance(module, snn.SparseConv3d) and module.stride != [1, 1, 1]:
                x = module(x, target=levels[level])  # the same grid conv_grid(3, 2) would generate
                level += 1
            else:
                x = module(x)
        ijk = x.grid.ijk.long()
        side = self.cube_side
        cube = x.features.new_zeros(x.grid.batch_size, side, side, side, x.features.shape[1])
        cube = cube.index_put((member_index(x.grid), ijk[:, 0], ijk[:, 1], ijk[:, 2]), x.features)
        mean, log_var = self.head(cube.permute(0, 4, 1, 2, 3)).chunk(2, dim=1)
        return mean, log_var


class Decoder(nn.Module):
    """seed_side: the seed cube's edge in voxels (resolution / 2^LEVELS), so that LEVELS subdivisions
    reach the training resolution. latent: the latent channels per cell of that cube.

    Two dense 3x3x3 convolutions turn the latent cube into the seed voxels' features, so each seed voxel
    sees its neighbours' codes too (a shape's parts continue across the cells' borders)."""

    def __init__(self, channels, latent, seed_side=2, norm="torch"):
        super().__init__()
        self.seed_voxels = seed_side ** 3
        self.seed = nn.Sequential(nn.Conv3d(latent, channels[0], 3, padding=1), nn.ELU(),
                                  nn.Conv3d(channels[0], channels[0], 3, padding=1))
        side = torch.arange(seed_side, dtype=torch.int32)
        # Buffers, so the seed coordinates live on the model's device and cost no copy per step.
        self.register_buffer("seed_ijk", torch.cartesian_prod(side, side, side).reshape(-1, 3), persistent=False)
        self.register_buffer("seed_strides", torch.tensor([seed_side ** 2, seed_side, 1]), persistent=False)
        self.up = nn.ModuleList()
        self.refine = nn.ModuleList()
        self.classify = nn.ModuleList()
        cin = channels[0]
        for c in channels:
            self.up.append(nn.Sequential(snn.SparseConvTranspose3d(cin, c, 2, 2, bias=False), *norm_elu(c, norm)))
            self.refine.append(nn.Sequential(*conv_block(c, c, 3, 1, norm)))
            self.classify.append(snn.SparseConv3d(c, 1, 1))
            cin = c
        self.prune = snn.Prune()
        self._seed_grids = {}  # (batch, device) -> (grid, cells), see seed_grid

    def forward(self, z, targets=None, keep_targets=True):
        """targets: the target grid at each level (training), or None. keep_targets: keep the target's
        voxels at each level besides the predicted ones (teacher forcing), so that the next level sees
        all of the ground truth; without it every level keeps only its predictions, as at inference, and
        is trained on the kind of input it will get there. Returns the final voxels, their occupancy
        (logits > 0) and the per-level (logits, labels) for the loss."""
        batch = z.shape[0]
        grid, cells = self.seed_grid(batch, z.device)
        seed = self.seed(z).flatten(2)  # [batch, channels, seed voxels], the cube's cells in C order
        x = snn.SparseFeatures(grid, seed[:, :, cells].transpose(1, 2).reshape(batch * self.seed_voxels, -1))
        outputs = []
        for level in range(LEVELS):
            x = self.refine[level](self.up[level](x))
            logits = self.classify[level](x).features.squeeze(1)
            labels = None
            keep = logits > 0
            if targets is not None:
                labels = contained_in(x.grid, targets[level])
                if keep_targets:
                    keep = keep | labels
            outputs.append((logits, labels))
            if level + 1 < LEVELS:
                x = self.prune(x, keep)
        return x.grid, logits > 0, outputs

    def seed_grid(self, batch, device):
        """The seed cube of `batch` members and the latent cell each seed voxel reads, built once per batch
        size and device: the same grid object every step, so its first level's plans (kept on the grid)
        and the grid itself cost nothing after the first step."""
        key = (batch, str(device))
        if key not in self._seed_grids:
            grid = sg.GridBatch.from_ijk([self.seed_ijk.to(device)] * batch)
            # from_ijk sorts each member's voxels (not in C order once the cube's edge exceeds 2), the
            # same way for every member: the first member's coordinates say which cell each voxel reads.
            cells = (grid.ijk[:self.seed_voxels].long() * self.seed_strides.to(device)).sum(1)
            self._seed_grids[key] = (grid, cells)
        return self._seed_grids[key]


def contained_in(grid, target):
    """For each voxel of grid: is it a voxel of target (same member)? The 1x1 kernel map from target to
    grid holds exactly these lookups, for all members at once and without a host synchronisation."""
    plan = sg.ConvolutionPlan.from_grid(target, 1, 1, grid)
    if plan.is_identity:  # the same grid
        return torch.ones(grid.num_voxels, dtype=torch.bool, device=grid.ijk.device)
    return plan.target_map()[:, 0] >= 0


def target_pyramid(target, encoder_levels=0):
    """The target at the resolution of each decoder level, coarsest first, and its first `encoder_levels`
    strided k3s2 levels (the encoder's grids): (pyramid, levels), built together with one host
    synchronisation on CUDA."""
    levels, coarsened = target.pyramid(3, 2, encoder_levels, [2 ** (LEVELS - 1 - level) for level in range(LEVELS)])
    return coarsened, levels


def member_index(grid):
    """The member of each voxel, [num_voxels] int64 on the grid's device (no synchronisation)."""
    device = grid.ijk.device
    counts = grid.joffsets.diff().to(device)
    return torch.repeat_interleave(torch.arange(grid.batch_size, device=device), counts,
                                   output_size=grid.num_voxels)


def iou(predicted, target):
    """Per-member intersection over union of two grid batches, [batch_size] float64 on the CPU."""
    hit = contained_in(predicted, target)
    inter = torch.zeros(predicted.batch_size, dtype=torch.float64, device=hit.device)
    inter = inter.index_add(0, member_index(predicted), hit.double())
    union = predicted.joffsets.diff().to(hit.device) + target.joffsets.diff().to(hit.device) - inter
    return (inter / union.clamp(min=1)).cpu()


class StepProfiler:
    """Splits training time into topology and plan construction, convolutions and the rest.

    Spans are measured on the device's timeline. On CUDA a span is a pair of CUDA events recorded on the
    current stream around the call, so it covers the GPU work queued inside it, plus any time the GPU sat
    waiting for the host to queue that work (including the host synchronisations a topology operation
    needs), but not the earlier work still in the queue when the span began; the events are read only in
    collect(), after one synchronisation, so timing adds no synchronisation to the steps. On the CPU
    every call is synchronous and a span is a perf_counter pair. (The library's own
    sparsegrid.convolution_seconds() reads a host clock around each call, which on CUDA measures only the
    launches; it is not used here.)

    install() wraps the library's calls, process-wide, until uninstall():
      grids         GridBatch constructors and generating operations (from_ijk, conv_grid, ...)
      plans         ConvolutionPlan construction (kernel maps, and the generated target grids)
      pruning       GridBatch.pruned_grid
      labels        contained_in (the decoder's "is this voxel in the target" lookups, 1x1 kernel maps)
                    and GridBatch.ijk_to_index
      convolutions  ConvolutionPlan.execute, forward, and its backward (from a hook on the output's
                    gradient to a hook after the backward node), both input and weight gradients
    The caller adds spans of its own with span(name); calls inside a span are counted in that span only
    (the training step puts the ground-truth pyramid in a "pyramid" span). Topology is every category
    but convolutions. Per-plan data derived lazily (the transposed map of the backward pass) is counted
    where it is first used.
    """

    TOPOLOGY = ("grids", "plans", "pruning", "labels", "pyramid")
    CATEGORIES = TOPOLOGY + ("convolutions",)
    WRAPPED = [  # (category, owner, names); None: this module
        ("grids", sg.GridBatch, ("from_ijk", "from_points", "from_mesh", "conv_grid", "conv_transpose_grid",
                                 "coarsened_grid", "refined_grid", "dilated_grid", "merged_grid", "pyramid")),
        ("plans", sg.ConvolutionPlan, ("from_grid", "from_grid_transposed", "transposed")),
        ("pruning", sg.GridBatch, ("pruned_grid",)),
        ("labels", sg.GridBatch, ("ijk_to_index",)),
        ("labels", None, ("contained_in",)),
    ]

    def __init__(self, device, enabled=True):
        self.cuda = torch.device(device).type == "cuda"
        self.enabled = enabled
        self.spans = []  # (category, start mark, stop mark)
        self.depth = 0
        self.originals = []

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    @contextlib.contextmanager
    def span(self, category):
        if not self.enabled or self.depth:
            yield
            return
        self.depth += 1
        start = self.mark()
        try:
            yield
        finally:
            self.spans.append((category, start, self.mark()))
            self.depth -= 1

    def synchronize(self):
        if self.cuda:
            torch.cuda.synchronize()

    def collect(self):
        """Seconds per category of the spans since the last collect, after waiting for the device."""
        self.synchronize()
        seconds = dict.fromkeys(self.CATEGORIES, 0.0)
        for category, start, stop in self.spans:
            seconds[category] += start.elapsed_time(stop) * 1e-3 if self.cuda else stop - start
        self.spans.clear()
        return seconds

    def install(self):
        if self.originals:
            return self
        for category, owner, names in self.WRAPPED:
            owner = owner or sys.modules[__name__]  # the Decoder looks contained_in up in these globals
            for name in names:
                original = inspect.getattr_static(owner, name, None)
                if original is None:
                    continue
                static = isinstance(original, staticmethod)
                wrapped = self._timed(category, original.__func__ if static else original)
                setattr(owner, name, staticmethod(wrapped) if static else wrapped)
                self.originals.append((owner, name, original))
        original_execute = sg.ConvolutionPlan.execute
        profiler = self

        def execute(plan, features, weight):
            with profiler.span("convolutions"):
                out = original_execute(plan, features, weight)
            if profiler.enabled and out.grad_fn is not None:
                profiler._time_backward(out)
            return out

        sg.ConvolutionPlan.execute = execute
        self.originals.append((sg.ConvolutionPlan, "execute", original_execute))
        return self

    def uninstall(self):
        for owner, name, original in reversed(self.originals):
            setattr(owner, name, original)
        self.originals.clear()

    def _timed(self, category, function):
        profiler = self

        def timed(*args, **kwargs):
            with profiler.span(category):
                return function(*args, **kwargs)

        timed.__wrapped__ = function
        return timed

    def _time_backward(self, out):
        # The output's gradient hook runs right before the convolution's backward node, the node's
        # hook right after it (on the thread and stream autograd runs that node on).
        marks = []

        def before(grad):
            marks.append(self.mark())

        def after(grad_inputs, grad_outputs):
            if marks:
                self.spans.append(("convolutions", marks.pop(), self.mark()))

        out.register_hook(before)
        out.grad_fn.register_hook(after)


class Progress:
    """A progress line every `every` iterations: a bar, the window's mean loss and its per-iteration time
    split. Losses stay on the device until a line is printed, and the device is synchronised only there,
    so reporting adds no synchronisation to the steps."""

    def __init__(self, iterations, every, profiler, log=print):
        self.iterations, self.every, self.profiler, self.log = iterations, every, profiler, log
        self.losses = []
        self.iteration = 0
        self.window_first = 0
        self.window_voxels = 0
        self.profiler.collect()  # drops spans from before training
        self.window_start = time.perf_counter()

    def step(self, loss, voxels=0):
        """loss: the iteration's loss, a detached scalar tensor (left on its device)."""
        self.iteration += 1
        self.losses.append(loss)
        self.window_voxels += voxels
        if self.iteration % self.every == 0 or self.iteration == self.iterations:
            self.report()

    def report(self):
        split = self.profiler.collect()
        count = self.iteration - self.window_first
        ms = 1e3 * (time.perf_counter() - self.window_start) / count
        loss = torch.stack(self.losses[self.window_first:]).mean().item()
        filled = round(20 * self.iteration / self.iterations)
        line = (f"[{'#' * filled}{'.' * (20 - filled)}] iteration {self.iteration:5d}/{self.iterations}  "
                f"loss {loss:.4f}  {ms:7.1f} ms/iter")
        if self.profiler.enabled:
            topology = 1e3 * sum(split[c] for c in StepProfiler.TOPOLOGY) / count
            convolutions = 1e3 * split["convolutions"] / count
            line += (f": topology+plans {topology:6.1f} ms (pyramid {1e3 * split['pyramid'] / count:.1f}), "
                     f"convolutions {convolutions:6.1f} ms, other {ms - topology - convolutions:6.1f} ms")
        if self.window_voxels:
            line += f"; {self.window_voxels // count} decoder voxels/iter"
        self.log(line, flush=True)
        self.window_first, self.window_voxels = self.iteration, 0
        self.window_start = time.perf_counter()

    def curve(self):
        """Every iteration's loss, as floats (one transfer)."""
        return torch.stack(self.losses).tolist() if self.losses else []

    def window_means(self):
        curve = self.curve()
        return [sum(curve[i:i + self.every]) / len(curve[i:i + self.every]) for i in range(0, len(curve), self.every)]


def chamfer(predicted, target, chunk=4096):
    """Per-member symmetric Chamfer distance between the voxel centres of two grid batches, in voxels:
    the mean distance from each predicted voxel to the nearest target voxel plus the mean from each target
    voxel to the nearest predicted one, [batch_size] float64 on the CPU (a member with an empty side
    scores inf)."""
    out = []
    p_offsets, t_offsets = predicted.joffsets.tolist(), target.joffsets.tolist()
    p_ijk, t_ijk = predicted.ijk.float(), target.ijk.float()
    for m in range(predicted.batch_size):
        a = p_ijk[p_offsets[m]:p_offsets[m + 1]]
        b = t_ijk[t_offsets[m]:t_offsets[m + 1]]
        if a.shape[0] == 0 or b.shape[0] == 0:
            out.append(float("inf"))
            continue

        def nearest(x, y):
            return torch.cat([torch.cdist(x[i:i + chunk], y).min(1).values for i in range(0, x.shape[0], chunk)])

        out.append(float(nearest(a, b).mean() + nearest(b, a).mean()))
    return torch.tensor(out, dtype=torch.float64)


def rotated(ijk, quarter_turns, axes=(0, 1)):
    """Voxel coordinates turned by quarter turns in the plane of two axes (exact on the grid), shifted back
    to start at the previous minimum."""
    ijk = ijk.clone()
    a, b = axes
    for _ in range(quarter_turns % 4):
        ijk[:, a], ijk[:, b] = ijk[:, b].clone(), -ijk[:, a]
    return ijk - ijk.min(0).values + 1


def symmetric_copy(ijk, resolution, generator):
    """The shape under one of the 48 symmetries of the cube (axes permuted, each flipped or not: exact on
    the grid), centred in [0, resolution)^3. Training on these augments the data without new shapes."""
    permutation = torch.randperm(3, generator=generator).tolist()
    flips = torch.randint(0, 2, (3,), generator=generator).tolist()
    out = ijk[:, permutation]
    out = torch.stack([-out[:, a] if flips[a] else out[:, a] for a in range(3)], dim=1)
    lo, hi = out.min(0).values, out.max(0).values
    return (out - lo + torch.div(resolution - 1 - (hi - lo), 2, rounding_mode="floor")).to(ijk.dtype)


def mesh_shape(path, resolution):
    """The surface voxels of a mesh scaled to fit [1, resolution - 1)^3."""
    vertices, faces = sg.load_mesh(path)
    lo = vertices.min(0).values
    extent = float((vertices.max(0).values - lo).max())
    size = extent / (resolution - 3)
    grid = sg.GridBatch.from_mesh([(vertices, faces)], voxel_sizes=size, origins=lo - size)
    return grid.ijk


def add_device_argument(parser):
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the model, data and topology live (auto: cuda when torch sees a GPU)")


def resolve_device(name):
    """'auto' -> 'cuda' when torch sees a GPU, else 'cpu'; 'cuda' without a GPU is an error."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    return name


def autocast_choice(name, device):
    """--autocast `name` on device type `device`: None for "none", else the dtype's name (CUDA only)."""
    if name == "none":
        return None
    if device != "cuda":
        raise SystemExit(f"--autocast {name} needs --device cuda (16-bit sparse convolutions run on CUDA only), "
                         f"got --device {device}; --autocast none trains in float32")
    return name


def check_resolution(resolution):
    step = 2 ** LEVELS
    if resolution < step or resolution % step != 0:
        raise SystemExit(f"--resolution must be a positive multiple of {step} (the decoder subdivides a seed "
                         f"cube {LEVELS} times), got {resolution}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Shape VAE on sparse voxel grids")
    add_device_argument(parser)
    parser.add_argument("--resolution", type=int, default=32, help="a multiple of 16")
    parser.add_argument("--batch", type=int, default=8, help="shapes per batch and process")
    parser.add_argument("--shapes", type=int, default=64,
                        help="procedural shapes in the training set (thousands for a GPU run of thousands of "
                        "iterations: with 4096, 5000 iterations of batch 16 at resolution 64 reconstructed "
                        "held-out shapes as well as training ones)")
    parser.add_argument("--meshes", nargs="*", default=[str(ROOT / "data" / "bunny.ply")],
                        help="mesh files added to the training set")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--augment", action="store_true",
                        help="train on a random cube symmetry of each shape (axes permuted and flipped)")
    parser.add_argument("--held-out", type=int, default=16,
                        help="procedural shapes of another seed, never trained on, to evaluate on")
    parser.add_argument("--channels", type=int, nargs=LEVELS, default=[8, 16, 32, 32])
    # Held-out IoU at resolution 64 (batch 16, 5000 iterations, 4096 shapes), channels per cell and KL
    # weight: 8 and 1e-4, 0.77; 16 and 1e-5, 0.82; 16 and 1e-6, 0.82; 32 and 1e-5, 0.80.
    parser.add_argument("--latent", type=int, default=16,
                        help="latent channels per cell of the (resolution / 16)^3 latent cube (16 x 64 numbers per "
                        "shape at resolution 64)")
    # The BCE is a mean per voxel and the KL a sum over the whole latent cube per shape (1024 numbers at
    # resolution 64), so the weight is small; with a single code of 32 numbers, 1e-3 already outweighed
    # what the code carried about the shape.
    parser.add_argument("--kl-weight", type=float, default=1e-5,
                        help="weight of the KL term (per shape) against the occupancy BCE (a mean per voxel)")
    parser.add_argument("--lr", type=float, default=5e-3, help="Adam's initial learning rate, decayed to 0 "
                        "along a cosine over the iterations")
    parser.add_argument("--teacher-forcing", type=float, default=1 / 3,
                        help="the fraction of the iterations, the first ones, in which the decoder also keeps "
                        "the target's voxels at each level")
    parser.add_argument("--autocast", choices=("bfloat16", "none"), default="none",
                        help="forward pass and loss in torch.autocast with this dtype (CUDA only; the parameters, "
                        "their gradients and Adam stay float32; float16 would need loss scaling, not offered); "
                        "none: float32 throughout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--norm", choices=("torch", "fused"), default="torch",
                        help="batch norm and ELU as torch's modules, or fused in sparsegrid.nn.BatchNorm")
    parser.add_argument("--print-every", type=int, default=20)
    parser.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                        help="print only the total time per iteration (no per-call timing spans)")
    parser.add_argument("--output", default=None, help="directory for loss.png and reconstructions.png")
    parser.add_argument("--world-size", type=int, default=1,
                        help="processes (torch.distributed: NCCL, one GPU each, on CUDA; gloo on the CPU)")
    args = parser.parse_args(argv)
    check_resolution(args.resolution)
    if args.iterations < 1 or args.batch < 1 or args.shapes < 1:
        raise SystemExit(f"--iterations, --batch and --shapes must be >= 1, got {args.iterations}, {args.batch}, "
                         f"{args.shapes}")
    if not 0 <= args.teacher_forcing <= 1:
        raise SystemExit(f"--teacher-forcing must be in [0, 1], got {args.teacher_forcing}")
    args.device = resolve_device(args.device)
    args.autocast = autocast_choice(args.autocast, args.device)
    if args.device == "cuda" and args.world_size > torch.cuda.device_count():
        raise SystemExit(f"--world-size {args.world_size} needs one GPU per process, torch sees "
                         f"{torch.cuda.device_count()}")
    return args


def build_model(args, device):
    """Encoder and decoder with the initial parameters of torch.manual_seed(args.seed), on device."""
    torch.manual_seed(args.seed)
    norm = getattr(args, "norm", "torch")
    encoder = Encoder(args.channels, args.latent, cube_side=args.resolution // 2 ** LEVELS + 1, norm=norm)
    decoder = Decoder(list(reversed(args.channels)), args.latent, seed_side=args.resolution // 2 ** LEVELS,
                      norm=norm)
    return encoder.to(device), decoder.to(device)


def occupancy_loss(outputs):
    """The mean over the levels of each level's mean occupancy BCE (a level left without voxels counts
    0). Each level counts alike: the coarse ones decide which regions the fine ones may fill at all."""
    bce = nn.functional.binary_cross_entropy_with_logits
    total = sum(bce(logits, labels.float(), reduction="sum") / max(logits.numel(), 1) for logits, labels in outputs)
    return total / len(outputs)


def make_optimizer(params, lr, device):
    """Adam; on CUDA its fused form, one launch for all parameters instead of several per group of
    tensors (the step is launch-bound at these sizes)."""
    return torch.optim.Adam(params, lr=lr, fused=device.type == "cuda")


def cosine_schedule(optimizer, iterations):
    """The learning rate from its initial value down to 0 along a half cosine over `iterations` steps:
    large steps while the model is far off, then small ones that settle it (at a constant rate the loss
    kept jumping around its level and so did the reconstructions)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, iterations) / max(iterations, 1))))


def vae_step(encoder, decoder, optimizer, target, kl_weight, profiler, keep_targets=True, autocast=None):
    """One training step on the grid batch target: returns the loss (a detached device scalar) and the
    number of voxels the decoder generated over its levels (host metadata). keep_targets: as in
    Decoder.forward. autocast: None, or a dtype (torch.bfloat16) for a forward pass and loss inside
    torch.autocast on CUDA (the parameters, their gradients and the optimizer stay float32)."""
    device = next(decoder.parameters()).device
    x = snn.SparseFeatures(target, torch.ones(target.num_voxels, 1, device=device))
    # Every grid of the step that does not depend on the predictions, in one pass: the encoder's levels
    # and the decoder's targets (on CUDA one host synchronisation; the decoder's prunes take one each).
    with profiler.span("pyramid"):
        pyramid, levels = target_pyramid(target, LEVELS)
    with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        mean, log_var = encoder(x, levels)
        z = mean + torch.randn_like(mean) * torch.exp(0.5 * log_var)
        _, _, outputs = decoder(z, pyramid, keep_targets=keep_targets)
        reconstruction = occupancy_loss(outputs)
        kl = -0.5 * torch.mean(torch.sum(1 + log_var - mean.square() - log_var.exp(), dim=(1, 2, 3, 4)))
        loss = reconstruction + kl_weight * kl
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach(), sum(logits.numel() for logits, _ in outputs)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(rank, world_size, args):
    distributed = world_size > 1
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    shapes = sg.synthetic_shapes(args.shapes, args.resolution, args.seed)
    if args.meshes:
        shapes += [mesh_shape(path, args.resolution) for path in args.meshes]
    shapes = [shape.to(device) for shape in shapes]
    encoder, decoder = build_model(args, device)  # identical initial parameters on every rank
    if distributed:
        device_ids = [device.index] if device.type == "cuda" else None
        encoder = nn.parallel.DistributedDataParallel(encoder, device_ids=device_ids)
        decoder = nn.parallel.DistributedDataParallel(decoder, device_ids=device_ids)
    params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer = make_optimizer(params, args.lr, device)
    schedule = cosine_schedule(optimizer, args.iterations)
    teacher_iterations = round(args.teacher_forcing * args.iterations)
    profiler = StepProfiler(device, enabled=args.breakdown).install()
    sampler = torch.Generator().manual_seed(args.seed * 1000 + rank)  # each rank its own batches
    log = print if rank == 0 else (lambda *a, **k: None)
    backend = f", {torch.distributed.get_backend()}" if distributed else ""
    log(f"shape VAE on {device.type}: {len(shapes)} shapes ({args.shapes} procedural, {len(args.meshes)} meshes) "
        f"at resolution {args.resolution}, batch {args.batch} x {world_size} processes{backend}, "
        f"{sum(p.numel() for p in params)} parameters, {torch.get_num_threads()} torch threads"
        f"{f', {args.autocast} autocast' if args.autocast else ''}; the target's voxels "
        f"kept for the first {teacher_iterations} iterations", flush=True)
    progress = Progress(args.iterations, args.print_every, profiler, log)
    # Throughput over all but the first fifth of the iterations (allocator growth, the decoder's early
    # voxel counts); the ranks step together, so rank 0's clock times them all.
    timed_from = args.iterations // 5
    start = None
    for iteration in range(args.iterations):
        if iteration == timed_from:
            synchronize(device)
            start = time.perf_counter()
        pick = torch.randint(0, len(shapes), (args.batch,), generator=sampler).tolist()
        members = [shapes[i] for i in pick]
        if args.augment:
            members = [symmetric_copy(shape, args.resolution, sampler) for shape in members]
        target = sg.GridBatch.from_ijk(members)
        progress.step(*vae_step(encoder, decoder, optimizer, target, args.kl_weight, profiler,
                                keep_targets=iteration < teacher_iterations,
                                autocast=getattr(torch, args.autocast) if args.autocast else None))
        schedule.step()
    synchronize(device)
    seconds = time.perf_counter() - start
    profiler.uninstall()
    timed = args.iterations - timed_from
    log(f"throughput: {args.batch * world_size * timed / seconds:.1f} shapes/s (batch {args.batch} x {world_size} "
        f"processes, {1e3 * seconds / timed:.1f} ms per iteration over iterations {timed_from + 1}..{args.iterations})")

    if distributed:
        # DDP keeps the replicas identical: every rank's parameters must match rank 0's.
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        gathered = [torch.zeros_like(flat) for _ in range(world_size)]
        torch.distributed.all_gather(gathered, flat)
        same = all(torch.equal(gathered[0], other) for other in gathered[1:])
        log(f"parameters identical on all {world_size} ranks: {'yes' if same else 'NO'}")
        encoder, decoder = encoder.module, decoder.module
    if rank != 0:
        return
    encoder.eval()
    decoder.eval()
    shown = list(range(min(args.batch, 6))) + list(range(args.shapes, len(shapes)))
    target, predicted, scores, distances = reconstruct(encoder, decoder, [shapes[i] for i in shown], device)
    # Shapes never trained on: procedural shapes of another seed, and the meshes turned a quarter turn.
    held_out = sg.synthetic_shapes(args.held_out, args.resolution, args.seed + 7919)
    held_out += [rotated(mesh_shape(path, args.resolution), 1) for path in args.meshes]
    held_target, held_predicted, held_scores, held_distances = reconstruct(
        encoder, decoder, [shape.to(device) for shape in held_out], device)
    windows = progress.window_means()
    print(f"loss: first window {windows[0]:.4f}, last window {windows[-1]:.4f}")
    print("reconstruction IoU on training shapes (procedural, then meshes): "
          + " ".join(f"{v:.2f}" for v in scores.tolist()) + f" (mean {scores.mean():.3f}); Chamfer "
          + chamfer_summary(distances))
    procedural = held_scores[:args.held_out]
    print(f"held-out reconstruction ({args.held_out} procedural shapes of another seed, "
          f"{len(args.meshes)} meshes turned a quarter turn): IoU mean {held_scores.mean():.3f} "
          f"(procedural {procedural.mean():.3f}, min {procedural.min():.2f}; meshes "
          + (" ".join(f"{v:.2f}" for v in held_scores[args.held_out:].tolist()) or "none")
          + "), Chamfer " + chamfer_summary(held_distances))
    if args.output:
        write_figures(pathlib.Path(args.output), progress.curve(), target, predicted, scores, teacher_iterations)
        pick = (list(range(min(6, args.held_out))) + list(range(args.held_out, held_target.batch_size)))[:8]
        write_held_out_figure(pathlib.Path(args.output), held_target, held_predicted, held_scores, pick)


def chamfer_summary(distances):
    """Mean Chamfer distance over the members with a prediction, and how many had none."""
    finite = distances[torch.isfinite(distances)]
    empty = distances.numel() - finite.numel()
    mean = f"mean {finite.mean():.2f} voxels" if finite.numel() else "undefined"
    return mean + (f" ({empty} of {distances.numel()} predictions empty)" if empty else "")


def reconstruct(encoder, decoder, shapes, device, batch=16):
    """The decoder's voxels from the encoder's mean latent, in batches: (target, predicted, IoU, Chamfer)."""
    targets, predictions, scores, distances = [], [], [], []
    with torch.no_grad():
        for start in range(0, len(shapes), batch):
            target = sg.GridBatch.from_ijk(shapes[start:start + batch])
            mean, _ = encoder(snn.SparseFeatures(target, torch.ones(target.num_voxels, 1, device=device)))
            grid, occupied, _ = decoder(mean)
            predicted = grid.pruned_grid(occupied)
            targets.append(target)
            predictions.append(predicted)
            scores.append(iou(predicted, target))
            distances.append(chamfer(predicted, target))
    return (merge(targets), merge(predictions), torch.cat(scores), torch.cat(distances))


def merge(grids):
    """One grid batch of the members of several (same device)."""
    if len(grids) == 1:
        return grids[0]
    members = []
    for grid in grids:
        offsets = grid.joffsets.tolist()
        members += [grid.ijk[offsets[m]:offsets[m + 1]] for m in range(grid.batch_size)]
    return sg.GridBatch.from_ijk(members)


def figures_available():
    """Whether matplotlib is importable (the figures are skipped, with a message, when it is not)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def plot_loss(path, curve, label, teacher_iterations=0):
    """The loss per iteration and its running mean, as a PNG; with teacher_iterations, a line where the
    decoder stops keeping the target's voxels (the loss steps up there: from then on it is measured on
    the decoder's own voxels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(curve, linewidth=0.6, alpha=0.5, label="iteration")
    window = max(1, len(curve) // 50)
    smooth = [sum(curve[max(0, i - window):i + 1]) / len(curve[max(0, i - window):i + 1]) for i in range(len(curve))]
    ax.plot(smooth, linewidth=1.5, label=f"mean of {window + 1}")
    if 0 < teacher_iterations < len(curve):
        ax.axvline(teacher_iterations, color="grey", linestyle=":", linewidth=1, label="end of teacher forcing")
    ax.set_xlabel("iteration")
    ax.set_ylabel(label)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def shaded_image(ijk, lo, size, scale=3):
    """An RGB image (numpy, float in [0, 1]) of voxels seen from +k: each pixel the nearest voxel along k,
    lit by the normal of that depth map (Lambert, with a depth cue), each voxel a scale x scale cell with
    a darker rim, so that the cubes show. ijk: [N, 3] integer coordinates, lo: their box's lower corner,
    size: its extent."""
    import numpy as np

    p = (ijk - lo).numpy().astype(np.int64)
    depth = np.full((size, size), -np.inf)
    if p.shape[0]:
        np.maximum.at(depth, (size - 1 - p[:, 1], p[:, 0]), p[:, 2].astype(np.float64))
    occupied = np.isfinite(depth)
    if not occupied.any():
        return np.ones((size * scale, size * scale, 3))
    filled = np.where(occupied, depth, depth[occupied].min() - 2.0)
    gy, gx = np.gradient(filled)
    normal = np.stack([-gx, gy, np.ones_like(gx)], axis=-1)
    normal /= np.linalg.norm(normal, axis=-1, keepdims=True)
    light = np.array([-0.45, 0.55, 0.70])
    lambert = np.clip(normal @ (light / np.linalg.norm(light)), 0.0, 1.0)
    near = (filled - filled[occupied].min()) / max(1.0, np.ptp(filled[occupied]))
    shade = 0.22 + 0.78 * lambert * (0.65 + 0.35 * near)
    base = np.array([0.30, 0.52, 0.78])
    cell = np.ones((scale, scale))
    cell[0, :] = cell[:, 0] = 0.8  # the rim of each voxel's face
    image = np.kron(shade, cell)[..., None] * base
    inside = np.kron(occupied, np.ones((scale, scale), dtype=bool))
    image[~inside] = 1.0
    return image


def render_rows(path, rows, scores, scored_row, members=None):
    """One row of shaded voxel renders per (grid, title) in rows, one column per member (all, or the
    given indices), members seen from +k in one box per column; the IoU scores are printed under the
    members of row scored_row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    members = list(range(rows[0][0].batch_size)) if members is None else members
    slices = []
    for grid, _ in rows:
        offsets, ijk = grid.joffsets.tolist(), grid.ijk.cpu()
        slices.append([ijk[offsets[m]:offsets[m + 1]] for m in members])
    fig = plt.figure(figsize=(2.4 * len(members), 2.5 * len(rows)))
    for column, m in enumerate(members):
        present = [row[column] for row in slices if row[column].shape[0]]
        both = torch.cat(present) if present else torch.zeros(1, 3, dtype=torch.int32)
        lo = both.min(0).values
        size = int((both.max(0).values - lo).max()) + 1
        for row, (_, title) in enumerate(rows):
            ax = fig.add_subplot(len(rows), len(members), row * len(members) + column + 1)
            ax.imshow(shaded_image(slices[row][column], lo, size), interpolation="nearest")
            ax.set_title(f"{title} {m}" + (f"\nIoU {scores[m]:.2f}" if row == scored_row else ""), fontsize=8)
            ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_held_out_figure(directory, target, predicted, scores, members):
    if not figures_available():
        return
    render_rows(directory / "held_out.png", [(target, "held-out input"), (predicted, "reconstruction")], scores, 1,
                members)
    print(f"wrote {directory / 'held_out.png'}")


def write_figures(directory, curve, target, predicted, scores, teacher_iterations=0):
    if not figures_available():
        print(f"matplotlib is not installed: no figures written to {directory}")
        return
    plot_loss(directory / "loss.png", curve, "loss (occupancy BCE + KL)", teacher_iterations)
    render_rows(directory / "reconstructions.png", [(target, "input"), (predicted, "reconstruction")], scores, 1)
    print(f"wrote {directory / 'loss.png'} and {directory / 'reconstructions.png'}")


def worker(rank, world_size, port, args):
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if args.device == "cuda" else "gloo"
    torch.distributed.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world_size)
    try:
        train(rank, world_size, args)
    finally:
        torch.distributed.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    args = parse_args(argv)
    if args.world_size > 1:
        if args.device == "cuda":
            # NVLink multicast (NVLS) stays off unless the environment turns it on: DDP's all-reduces of a
            # few MB gain nothing from it, and it needs multicast support that not every host grants.
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        torch.multiprocessing.spawn(worker, args=(args.world_size, free_port(), args), nprocs=args.world_size)
    else:
        train(0, 1, args)


if __name__ == "__main__":
    main()
