"""Generative shape VAE on sparse voxel grids, trained on procedural closed shapes.

Encoder: 4 levels of (strided k3s2 conv, k3s1 conv), batch norm and ELU, then per-member mean pooling
to a Gaussian latent. Decoder: from a 2^3 seed grid per shape, 4 levels of (generative transposed k2s2
conv, k3s1 conv, 1x1 occupancy classifier, prune): the topology is generated and pruned anew at every
step, which is what sparsegrid is built for. During training the voxels of the target at each level are
kept as well, so every level sees its ground truth.

Prints the loss and a per-iteration time split (topology and plan construction, convolution compute,
everything else), and at the end the intersection-over-union of reconstructions with their inputs.
Usage: PYTHONPATH=python python3 examples/vae.py [--resolution 32] [--batch 8] [--iterations 300]
"""

import argparse
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
    """Seconds spent building topology and plans, and in convolution forward/backward."""

    def __init__(self):
        self.plans = 0.0
        self.convs = 0.0

    def install(self):
        original_plan = snn._plan
        original_forward = sg._SparseConv.forward
        original_backward = sg._SparseConv.backward
        timers = self

        def timed_plan(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original_plan(*args, **kwargs)
            finally:
                timers.plans += time.perf_counter() - start

        def timed(fn):
            def wrapper(ctx, *args):
                start = time.perf_counter()
                try:
                    return fn(ctx, *args)
                finally:
                    timers.convs += time.perf_counter() - start
            return staticmethod(wrapper)

        snn._plan = timed_plan
        sg._SparseConv.forward = timed(original_forward)
        sg._SparseConv.backward = timed(original_backward)


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


def main():
    parser = argparse.ArgumentParser(description="Shape VAE on sparse voxel grids")
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--shapes", type=int, default=64, help="size of the training set")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--channels", type=int, nargs=LEVELS, default=[8, 16, 32, 32])
    parser.add_argument("--latent", type=int, default=32)
    parser.add_argument("--kl-weight", type=float, default=1e-3)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-every", type=int, default=20)
    args = parser.parse_args()
    if args.resolution % 2 ** LEVELS != 0 or args.resolution // 2 ** LEVELS != 2:
        raise SystemExit(f"--resolution must be {2 * 2 ** LEVELS} (the decoder grows a 2^3 seed {LEVELS} times)")

    torch.manual_seed(args.seed)
    shapes = sg.synthetic_shapes(args.shapes, args.resolution, args.seed)
    encoder, decoder = Encoder(args.channels, args.latent), Decoder(list(reversed(args.channels)), args.latent)
    params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer = torch.optim.Adam(params, lr=args.lr)
    bce = nn.BCEWithLogitsLoss()
    timers = Timers()
    timers.install()
    print(f"shape VAE: {args.shapes} procedural shapes at resolution {args.resolution}, batch {args.batch}, "
          f"{sum(p.numel() for p in params)} parameters, {torch.get_num_threads()} torch threads")
    window = {"loss": 0.0, "total": 0.0, "plans": 0.0, "convs": 0.0, "voxels": 0, "count": 0}
    first_loss = None
    for iteration in range(1, args.iterations + 1):
        start = time.perf_counter()
        plans_before, convs_before = timers.plans, timers.convs
        pick = torch.randint(0, args.shapes, (args.batch,)).tolist()
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
        window["loss"] += loss.item()
        window["total"] += time.perf_counter() - start
        window["plans"] += timers.plans - plans_before
        window["convs"] += timers.convs - convs_before
        window["voxels"] += sum(logits.numel() for logits, _ in outputs)
        window["count"] += 1
        if iteration % args.print_every == 0 or iteration == args.iterations:
            n = window["count"]
            average = window["loss"] / n
            first_loss = average if first_loss is None else first_loss
            total = window["total"] / n
            print(f"iteration {iteration:5d}  loss {average:.4f}  {1e3 * total:7.1f} ms/iter: "
                  f"topology+plans {1e3 * window['plans'] / n:6.1f} ms, convolutions {1e3 * window['convs'] / n:6.1f} "
                  f"ms, other {1e3 * (total - (window['plans'] + window['convs']) / n):6.1f} ms; "
                  f"{window['voxels'] // n} decoder voxels/iter", flush=True)
            last_loss = average
            window = {key: 0 for key in window}

    encoder.eval()
    decoder.eval()
    with torch.no_grad():
        target = sg.GridBatch.from_ijk(shapes[: args.batch])
        mean, _ = encoder(snn.SparseFeatures(target, torch.ones(target.num_voxels, 1)))
        grid, occupied, _ = decoder(mean)
        predicted = grid.pruned_grid(occupied)
        scores = iou(predicted, target)
    print(f"loss: first window {first_loss:.4f}, last window {last_loss:.4f}")
    print("reconstruction IoU of the first shapes: " + " ".join(f"{v:.2f}" for v in scores.tolist())
          + f" (mean {scores.mean():.3f})")


if __name__ == "__main__":
    main()
