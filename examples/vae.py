"""Generative shape VAE on sparse voxel grids, trained on procedural closed shapes.

Encoder: 4 levels of (strided k3s2 conv, k3s1 conv), batch norm and ELU, then per-member mean pooling
to a Gaussian latent. Decoder: from a 2^3 seed grid per shape, 4 levels of (generative transposed k2s2
conv, k3s1 conv, 1x1 occupancy classifier, prune): the topology is generated and pruned anew at every
step, which is what sparsegrid is built for. During training the voxels of the target at each level are
kept as well, so every level sees its ground truth.

Trains on procedural shapes plus triangle meshes (by default the bundled Stanford bunny), voxelised as
surfaces at the training resolution. Prints the loss and a per-iteration time split (topology and plan
construction, convolution compute, everything else), and at the end the intersection-over-union of
reconstructions with their inputs; with --output it writes loss.png and reconstructions.png. With
--world-size N it trains N processes with torch.distributed (gloo) and DistributedDataParallel: each
rank samples its own batches and builds its own topology; gradients are averaged by DDP.
Usage: PYTHONPATH=python python3 examples/vae.py [--resolution 32] [--batch 8] [--iterations 300]
"""

import argparse
import pathlib
import socket
import time

import torch
from torch import nn

import sparsegrid as sg
from sparsegrid import nn as snn

LEVELS = 4


def conv_block(cin, cout, kernel, stride):
    return [snn.SparseConv3d(cin, cout, kernel, stride), snn.Features(nn.BatchNorm1d(cout)), snn.Features(nn.ELU())]


class Encoder(nn.Module):
    def __init__(self, channels, latent):
        super().__init__()
        layers, cin = [], 1
        for c in channels:
            layers += conv_block(cin, c, 3, 2) + conv_block(c, c, 3, 1)
            cin = c
        self.body = nn.Sequential(*layers)
        self.pool = snn.GlobalPool("mean")
        self.head = nn.Linear(cin, 2 * latent)

    def forward(self, x):
        mean, log_var = self.head(self.pool(self.body(x))).chunk(2, dim=1)
        return mean, log_var


class Decoder(nn.Module):
    def __init__(self, channels, latent):
        super().__init__()
        self.seed_channels = channels[0]
        self.seed = nn.Linear(latent, 8 * channels[0])
        self.up = nn.ModuleList()
        self.refine = nn.ModuleList()
        self.classify = nn.ModuleList()
        cin = channels[0]
        for c in channels:
            self.up.append(nn.Sequential(snn.SparseConvTranspose3d(cin, c, 2, 2), snn.Features(nn.BatchNorm1d(c)),
                                         snn.Features(nn.ELU())))
            self.refine.append(nn.Sequential(*conv_block(c, c, 3, 1)))
            self.classify.append(snn.SparseConv3d(c, 1, 1))
            cin = c
        self.prune = snn.Prune()

    def forward(self, z, targets=None):
        """targets: the target grid at each level (training), or None. Returns the final voxels and the
        per-level (logits, labels) for the loss."""
        batch = z.shape[0]
        cube = torch.tensor([[i, j, k] for i in range(2) for j in range(2) for k in range(2)], dtype=torch.int32)
        grid = sg.GridBatch.from_ijk([cube] * batch)
        # The cube's 8 voxels come out in the same (voxel) order for every member.
        x = snn.SparseFeatures(grid, self.seed(z).reshape(batch * 8, self.seed_channels))
        outputs = []
        for level in range(LEVELS):
            x = self.refine[level](self.up[level](x))
            logits = self.classify[level](x).features.squeeze(1)
            labels = None
            keep = logits > 0
            if targets is not None:
                labels = contained_in(x.grid, targets[level])
                keep = keep | labels
            outputs.append((logits, labels))
            if level + 1 < LEVELS:
                x = self.prune(x, keep)
        return x.grid, logits > 0, outputs


def contained_in(grid, target):
    """For each voxel of grid: is it a voxel of target (same member)?"""
    offsets = grid.joffsets.tolist()
    ijk = grid.ijk
    queries = [ijk[offsets[m]:offsets[m + 1]] for m in range(grid.batch_size)]
    return target.ijk_to_index(queries) >= 0


class Timers:
    """Seconds spent building topology and plans (timed around plan construction) and executing
    convolutions (the library's own counter, forward and backward)."""

    def __init__(self):
        self.plans = 0.0

    @property
    def convs(self):
        return sg.convolution_seconds()

    def install(self):
        original_plan = snn._plan
        timers = self

        def timed_plan(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original_plan(*args, **kwargs)
            finally:
                timers.plans += time.perf_counter() - start

        snn._plan = timed_plan


def target_pyramid(target):
    """The target at the resolution of each decoder level, coarsest first."""
    return [target.coarsened_grid(2 ** (LEVELS - 1 - level)) for level in range(LEVELS)]


def iou(predicted, target):
    hit = contained_in(predicted, target)
    inter = torch.zeros(predicted.batch_size)
    offsets = predicted.joffsets.tolist()
    for m in range(predicted.batch_size):
        inter[m] = hit[offsets[m]:offsets[m + 1]].sum()
    pred_count = predicted.joffsets.diff().double()
    target_count = target.joffsets.diff().double()
    return inter / (pred_count + target_count - inter).clamp(min=1)


ROOT = pathlib.Path(__file__).resolve().parents[1]


def mesh_shape(path, resolution):
    """The surface voxels of a mesh scaled to fit [1, resolution - 1)^3."""
    vertices, faces = sg.load_mesh(path)
    lo = vertices.min(0).values
    extent = float((vertices.max(0).values - lo).max())
    size = extent / (resolution - 3)
    grid = sg.GridBatch.from_mesh([(vertices, faces)], voxel_sizes=size, origins=lo - size)
    return grid.ijk


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Shape VAE on sparse voxel grids")
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8, help="shapes per batch and process")
    parser.add_argument("--shapes", type=int, default=64, help="procedural shapes in the training set")
    parser.add_argument("--meshes", nargs="*", default=[str(ROOT / "data" / "bunny.ply")],
                        help="mesh files added to the training set")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--channels", type=int, nargs=LEVELS, default=[8, 16, 32, 32])
    parser.add_argument("--latent", type=int, default=32)
    parser.add_argument("--kl-weight", type=float, default=1e-3)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-every", type=int, default=20)
    parser.add_argument("--output", default=None, help="directory for loss.png and reconstructions.png")
    parser.add_argument("--world-size", type=int, default=1, help="processes (torch.distributed, gloo)")
    args = parser.parse_args(argv)
    if args.resolution % 2 ** LEVELS != 0 or args.resolution // 2 ** LEVELS != 2:
        raise SystemExit(f"--resolution must be {2 * 2 ** LEVELS} (the decoder grows a 2^3 seed {LEVELS} times)")
    return args


def train(rank, world_size, args):
    distributed = world_size > 1
    torch.manual_seed(args.seed)  # identical initial parameters on every rank
    shapes = sg.synthetic_shapes(args.shapes, args.resolution, args.seed)
    shapes += [mesh_shape(path, args.resolution) for path in args.meshes]
    encoder, decoder = Encoder(args.channels, args.latent), Decoder(list(reversed(args.channels)), args.latent)
    if distributed:
        encoder = nn.parallel.DistributedDataParallel(encoder)
        decoder = nn.parallel.DistributedDataParallel(decoder)
    params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer = torch.optim.Adam(params, lr=args.lr)
    bce = nn.BCEWithLogitsLoss()
    timers = Timers()
    timers.install()
    sampler = torch.Generator().manual_seed(args.seed * 1000 + rank)  # each rank its own batches
    log = print if rank == 0 else (lambda *a, **k: None)
    log(f"shape VAE: {len(shapes)} shapes ({args.shapes} procedural, {len(args.meshes)} meshes) at resolution "
        f"{args.resolution}, batch {args.batch} x {world_size} processes, {sum(p.numel() for p in params)} "
        f"parameters, {torch.get_num_threads()} torch threads")
    window = {"loss": 0.0, "total": 0.0, "plans": 0.0, "convs": 0.0, "voxels": 0, "count": 0}
    curve = []
    for iteration in range(1, args.iterations + 1):
        start = time.perf_counter()
        plans_before, convs_before = timers.plans, timers.convs
        pick = torch.randint(0, len(shapes), (args.batch,), generator=sampler).tolist()
        target = sg.GridBatch.from_ijk([shapes[i] for i in pick])
        x = snn.SparseFeatures(target, torch.ones(target.num_voxels, 1))
        mean, log_var = encoder(x)
        z = mean + torch.randn_like(mean) * torch.exp(0.5 * log_var)
        _, _, outputs = decoder(z, target_pyramid(target))
        reconstruction = sum(bce(logits, labels.float()) for logits, labels in outputs) / LEVELS
        kl = -0.5 * torch.mean(torch.sum(1 + log_var - mean.square() - log_var.exp(), dim=1))
        loss = reconstruction + args.kl_weight * kl
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        curve.append(loss.item())
        accumulate(window, loss.item(), start, timers, plans_before, convs_before,
                   voxels=sum(logits.numel() for logits, _ in outputs))
        if iteration % args.print_every == 0 or iteration == args.iterations:
            log(window_report(iteration, window), flush=True)
            window = {key: 0 for key in window}

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
    with torch.no_grad():
        shown = list(range(min(args.batch, 6))) + list(range(args.shapes, len(shapes)))
        target = sg.GridBatch.from_ijk([shapes[i] for i in shown])
        mean, _ = encoder(snn.SparseFeatures(target, torch.ones(target.num_voxels, 1)))
        grid, occupied, _ = decoder(mean)
        predicted = grid.pruned_grid(occupied)
        scores = iou(predicted, target)
    windows = [sum(curve[i:i + args.print_every]) / len(curve[i:i + args.print_every])
               for i in range(0, len(curve), args.print_every)]
    print(f"loss: first window {windows[0]:.4f}, last window {windows[-1]:.4f}")
    print("reconstruction IoU (procedural shapes, then meshes): " + " ".join(f"{v:.2f}" for v in scores.tolist())
          + f" (mean {scores.mean():.3f})")
    if args.output:
        write_figures(pathlib.Path(args.output), curve, target, predicted, scores)


def accumulate(window, loss, start, timers, plans_before, convs_before, voxels=0):
    """Adds one iteration (started at `start`) to the reporting window."""
    window["loss"] += loss
    window["total"] += time.perf_counter() - start
    window["plans"] += timers.plans - plans_before
    window["convs"] += timers.convs - convs_before
    window["voxels"] += voxels
    window["count"] += 1


def window_report(iteration, window):
    """One progress line: mean loss and time split over the iterations since the last report."""
    n = window["count"]
    total = window["total"] / n
    line = (f"iteration {iteration:5d}  loss {window['loss'] / n:.4f}  {1e3 * total:7.1f} ms/iter: "
            f"topology+plans {1e3 * window['plans'] / n:6.1f} ms, convolutions {1e3 * window['convs'] / n:6.1f} ms, "
            f"other {1e3 * (total - (window['plans'] + window['convs']) / n):6.1f} ms")
    if window.get("voxels"):
        line += f"; {window['voxels'] // n} decoder voxels/iter"
    return line


def plot_loss(path, curve, label):
    """The loss per iteration and its running mean, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(curve, linewidth=0.6, alpha=0.5, label="iteration")
    window = max(1, len(curve) // 50)
    smooth = [sum(curve[max(0, i - window):i + 1]) / len(curve[max(0, i - window):i + 1]) for i in range(len(curve))]
    ax.plot(smooth, linewidth=1.5, label=f"mean of {window + 1}")
    ax.set_xlabel("iteration")
    ax.set_ylabel(label)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render_rows(path, rows, scores, scored_row):
    """One row of 3D voxel renders per (grid, title) in rows, one column per member; the IoU scores are
    printed under the members of row scored_row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    count = rows[0][0].batch_size
    fig = plt.figure(figsize=(2.6 * count, 2.6 * len(rows)))
    for row, (grid, title) in enumerate(rows):
        offsets = grid.joffsets.tolist()
        for m in range(count):
            ax = fig.add_subplot(len(rows), count, row * count + m + 1, projection="3d")
            points = grid.ijk[offsets[m]:offsets[m + 1]].float()
            if points.shape[0]:
                ax.scatter(points[:, 0], points[:, 1], points[:, 2], s=2, c=points[:, 2], cmap="viridis",
                           marker="s", linewidths=0)
            ax.set_title(f"{title} {m}" + (f"\nIoU {scores[m]:.2f}" if row == scored_row else ""), fontsize=8)
            ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_figures(directory, curve, target, predicted, scores):
    plot_loss(directory / "loss.png", curve, "loss (occupancy BCE + KL)")
    render_rows(directory / "reconstructions.png", [(target, "input"), (predicted, "reconstruction")], scores, 1)
    print(f"wrote {directory / 'loss.png'} and {directory / 'reconstructions.png'}")


def worker(rank, world_size, port, args):
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
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
        torch.multiprocessing.spawn(worker, args=(args.world_size, free_port(), args), nprocs=args.world_size)
    else:
        train(0, 1, args)


if __name__ == "__main__":
    main()
