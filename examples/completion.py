"""Shape completion on sparse voxel grids: from a partial surface (a random half-space of the shape cut
away) to the full shape. The network is the VAE's encoder and generative decoder without the sampling:
the code of the partial input is decoded level by level, generating and pruning the topology, with the
full shape's voxels kept during training.

Prints the loss, the per-iteration time split and the completion IoU against the full shapes; with
--output it writes completion_loss.png and completions.png (partial input, completion, full shape).
Usage: PYTHONPATH=python python3 examples/completion.py [--iterations 300]
"""

import argparse
import pathlib
import sys
import time

import torch
from torch import nn

import sparsegrid as sg
from sparsegrid import nn as snn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import vae  # noqa: E402  (the shared encoder, decoder and helpers)


def cut(shape, generator):
    """The voxels on one side of a random plane through the shape's centre (at least a quarter kept)."""
    points = shape.float()
    centre = points.mean(0)
    for _ in range(10):
        normal = torch.randn(3, generator=generator)
        keep = (points - centre) @ normal > 0
        if keep.sum() >= shape.shape[0] // 4:
            return shape[keep]
    return shape


def main():
    parser = argparse.ArgumentParser(description="Shape completion on sparse voxel grids")
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--shapes", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--channels", type=int, nargs=vae.LEVELS, default=[8, 16, 32, 32])
    parser.add_argument("--latent", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-every", type=int, default=20)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    if args.resolution != 2 * 2 ** vae.LEVELS:
        raise SystemExit(f"--resolution must be {2 * 2 ** vae.LEVELS}")

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    shapes = sg.synthetic_shapes(args.shapes, args.resolution, args.seed)
    encoder = vae.Encoder(args.channels, args.latent)
    decoder = vae.Decoder(list(reversed(args.channels)), args.latent)
    params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer = torch.optim.Adam(params, lr=args.lr)
    bce = nn.BCEWithLogitsLoss()
    timers = vae.Timers()
    timers.install()
    print(f"shape completion: {args.shapes} procedural shapes at resolution {args.resolution}, batch {args.batch}")
    curve, window = [], {"loss": 0.0, "total": 0.0, "plans": 0.0, "convs": 0.0, "voxels": 0, "count": 0}
    for iteration in range(1, args.iterations + 1):
        start = time.perf_counter()
        plans_before, convs_before = timers.plans, timers.convs
        pick = torch.randint(0, args.shapes, (args.batch,), generator=generator).tolist()
        full = sg.GridBatch.from_ijk([shapes[i] for i in pick])
        partial = sg.GridBatch.from_ijk([cut(shapes[i], generator) for i in pick])
        code, _ = encoder(snn.SparseFeatures(partial, torch.ones(partial.num_voxels, 1)))
        _, _, outputs = decoder(code, vae.target_pyramid(full))
        loss = sum(bce(logits, labels.float()) for logits, labels in outputs) / vae.LEVELS
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        curve.append(loss.item())
        vae.accumulate(window, loss.item(), start, timers, plans_before, convs_before)
        if iteration % args.print_every == 0 or iteration == args.iterations:
            print(vae.window_report(iteration, window), flush=True)
            window = {key: 0 for key in window}

    encoder.eval()
    decoder.eval()
    with torch.no_grad():
        shown = list(range(min(args.batch, 6)))
        full = sg.GridBatch.from_ijk([shapes[i] for i in shown])
        partial = sg.GridBatch.from_ijk([cut(shapes[i], torch.Generator().manual_seed(i)) for i in shown])
        code, _ = encoder(snn.SparseFeatures(partial, torch.ones(partial.num_voxels, 1)))
        grid, occupied, _ = decoder(code)
        completed = grid.pruned_grid(occupied)
        scores = vae.iou(completed, full)
        partial_scores = vae.iou(partial, full)
    print("IoU with the full shapes: partial inputs " + " ".join(f"{v:.2f}" for v in partial_scores.tolist())
          + f" (mean {partial_scores.mean():.3f}); completions " + " ".join(f"{v:.2f}" for v in scores.tolist())
          + f" (mean {scores.mean():.3f})")
    if args.output:
        directory = pathlib.Path(args.output)
        vae.plot_loss(directory / "completion_loss.png", curve, "occupancy BCE")
        vae.render_rows(directory / "completions.png",
                        [(partial, "partial"), (completed, "completion"), (full, "full")], scores, 1)
        print(f"wrote {directory / 'completion_loss.png'} and {directory / 'completions.png'}")


if __name__ == "__main__":
    main()
