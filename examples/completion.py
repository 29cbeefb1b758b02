"""Shape completion on sparse voxel grids: from a partial surface (a random half-space of the shape cut
away) to the full shape. The network is the VAE's encoder and generative decoder without the sampling:
the code of the partial input is decoded level by level, generating and pruning the topology, with the
full shape's voxels kept as well in the first --teacher-forcing part of training (as in vae.py, with the
same per-level loss and cosine learning-rate decay). A completion keeps the input's voxels (they are
observed) and adds the decoder's. It is scored on training shapes and on --held-out shapes of another
seed, cut by other planes, against the partial inputs' own IoU.

Runs on --device (auto: CUDA when torch sees a GPU). Prints a progress line with the loss and the
per-iteration time split (vae.StepProfiler) and the completion IoU against the full shapes; with
--output it writes completion_loss.png and completions.png (partial input, completion, full shape).
Usage: PYTHONPATH=python python3 examples/completion.py [--device auto] [--iterations 800] [--output DIR]
"""

import argparse
import pathlib
import sys

import torch

import sparsegrid as sg
from sparsegrid import nn as snn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import vae  # noqa: E402  (the shared encoder, decoder and helpers)


def cut(grid, generator, tries=8):
    """Per member of grid, the voxels on one side of a random plane through the member's centre: the
    first of `tries` random planes that keeps at least a quarter of the member's voxels (the whole member
    when none does). Batched on the grid's device; the planes come from the CPU generator."""
    ijk = grid.ijk.float()
    device = ijk.device
    member = vae.member_index(grid)
    counts = grid.joffsets.diff().to(device)
    centres = torch.zeros(grid.batch_size, 3, device=device).index_add(0, member, ijk)
    centres = centres / counts.clamp(min=1).unsqueeze(1)
    normals = torch.randn(grid.batch_size, tries, 3, generator=generator).to(device)
    above = torch.einsum("nc,ntc->nt", ijk - centres[member], normals[member]) > 0  # [N, tries]
    kept = torch.zeros(grid.batch_size, tries, device=device).index_add(0, member, above.float())
    enough = kept * 4 >= counts.unsqueeze(1)
    # The first plane that keeps enough (argmax returns the first maximum), else column `tries`: all.
    choice = torch.where(enough.any(1), enough.float().argmax(1), torch.full_like(counts, tries))
    above = torch.cat([above, torch.ones(grid.num_voxels, 1, dtype=torch.bool, device=device)], 1)
    return grid.pruned_grid(above.gather(1, choice[member].unsqueeze(1)).squeeze(1))


def unit_voxels(grid):
    """The grid's voxels with the inputs' transform (voxel size 1, origin 0): the decoder's grids carry
    the transform of its seed cube, and merged grids must share one."""
    offsets = grid.joffsets.tolist()
    return sg.GridBatch.from_ijk([grid.ijk[offsets[m]:offsets[m + 1]] for m in range(grid.batch_size)])


def complete(encoder, decoder, shapes, seed, device, batch=16):
    """Cuts the shapes, completes them and scores both: (full, partial, completed, completion IoU, partial
    IoU). A completion keeps its input's voxels (they are observed) and adds the decoder's."""
    generator = torch.Generator().manual_seed(seed)
    parts = {"full": [], "partial": [], "completed": []}
    scores, partial_scores = [], []
    with torch.no_grad():
        for start in range(0, len(shapes), batch):
            full = sg.GridBatch.from_ijk(shapes[start:start + batch])
            partial = cut(full, generator)
            code, _ = encoder(snn.SparseFeatures(partial, torch.ones(partial.num_voxels, 1, device=device)))
            grid, occupied, _ = decoder(code)
            completed = unit_voxels(grid.pruned_grid(occupied)).merged_grid(partial)
            scores.append(vae.iou(completed, full))
            partial_scores.append(vae.iou(partial, full))
            for name, grid_batch in (("full", full), ("partial", partial), ("completed", completed)):
                parts[name].append(grid_batch)
    return (vae.merge(parts["full"]), vae.merge(parts["partial"]), vae.merge(parts["completed"]), torch.cat(scores),
            torch.cat(partial_scores))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Shape completion on sparse voxel grids")
    vae.add_device_argument(parser)
    parser.add_argument("--resolution", type=int, default=32, help="a multiple of 16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--shapes", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=800,
                        help="training steps (at the other defaults the completions' IoU was 0.01 after 300 "
                        "and 0.64 after 800, which take about 2.5 minutes on 2 CPU cores)")
    parser.add_argument("--channels", type=int, nargs=vae.LEVELS, default=[8, 16, 32, 32])
    parser.add_argument("--latent", type=int, default=64, help="code channels per cell of the (resolution / 16)^3 "
                        "code cube (vae.Encoder)")
    parser.add_argument("--lr", type=float, default=5e-3, help="Adam's initial learning rate, decayed to 0 "
                        "along a cosine over the iterations")
    parser.add_argument("--teacher-forcing", type=float, default=1 / 3,
                        help="the fraction of the iterations, the first ones, in which the decoder also keeps "
                        "the full shape's voxels at each level")
    parser.add_argument("--autocast", choices=("bfloat16", "none"), default="none",
                        help="forward pass and loss in torch.autocast with this dtype (CUDA only, as in vae.py)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--held-out", type=int, default=16, help="shapes of another seed to evaluate on")
    parser.add_argument("--print-every", type=int, default=20)
    parser.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                        help="print only the total time per iteration (no per-call timing spans)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    vae.check_resolution(args.resolution)
    if not 0 <= args.teacher_forcing <= 1:
        raise SystemExit(f"--teacher-forcing must be in [0, 1], got {args.teacher_forcing}")
    device = torch.device(vae.resolve_device(args.device))
    precision = vae.autocast_choice(args.autocast, device.type)
    autocast = getattr(torch, precision) if precision else None

    generator = torch.Generator().manual_seed(args.seed)
    shapes = [shape.to(device) for shape in sg.synthetic_shapes(args.shapes, args.resolution, args.seed)]
    encoder, decoder = vae.build_model(args, device)
    optimizer = vae.make_optimizer(list(encoder.parameters()) + list(decoder.parameters()), args.lr, device)
    schedule = vae.cosine_schedule(optimizer, args.iterations)
    teacher_iterations = round(args.teacher_forcing * args.iterations)
    profiler = vae.StepProfiler(device, enabled=args.breakdown).install()
    print(f"shape completion on {device.type}: {args.shapes} procedural shapes at resolution {args.resolution}, "
          f"batch {args.batch}{f', {args.autocast} autocast' if autocast else ''}", flush=True)
    progress = vae.Progress(args.iterations, args.print_every, profiler)
    for iteration in range(args.iterations):
        pick = torch.randint(0, args.shapes, (args.batch,), generator=generator).tolist()
        full = sg.GridBatch.from_ijk([shapes[i] for i in pick])
        partial = cut(full, generator)
        with profiler.span("pyramid"):
            pyramid, _ = vae.target_pyramid(full)
        with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            code, _ = encoder(snn.SparseFeatures(partial, torch.ones(partial.num_voxels, 1, device=device)))
            _, _, outputs = decoder(code, pyramid, keep_targets=iteration < teacher_iterations)
            loss = vae.occupancy_loss(outputs)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        progress.step(loss.detach(), sum(logits.numel() for logits, _ in outputs))
    profiler.uninstall()

    encoder.eval()
    decoder.eval()
    full, partial, completed, scores, partial_scores = complete(
        encoder, decoder, [shapes[i] for i in range(min(args.batch, 6))], args.seed, device)
    print("IoU with the full shapes: partial inputs " + " ".join(f"{v:.2f}" for v in partial_scores.tolist())
          + f" (mean {partial_scores.mean():.3f}); completions " + " ".join(f"{v:.2f}" for v in scores.tolist())
          + f" (mean {scores.mean():.3f})")
    # Shapes never trained on (another seed), cut by planes never seen either.
    held_out = [shape.to(device) for shape in sg.synthetic_shapes(args.held_out, args.resolution, args.seed + 7919)]
    _, _, _, held_scores, held_partial = complete(encoder, decoder, held_out, args.seed + 1, device)
    print(f"held-out ({args.held_out} shapes of another seed): IoU with the full shapes: partial inputs mean "
          f"{held_partial.mean():.3f}; completions mean {held_scores.mean():.3f} (better than the input on "
          f"{int((held_scores > held_partial).sum())} of {args.held_out})")
    if args.output:
        directory = pathlib.Path(args.output)
        if not vae.figures_available():
            print(f"matplotlib is not installed: no figures written to {directory}")
            return
        vae.plot_loss(directory / "completion_loss.png", progress.curve(), "occupancy BCE", teacher_iterations)
        vae.render_rows(directory / "completions.png",
                        [(partial, "partial"), (completed, "completion"), (full, "full")], scores, 1)
        print(f"wrote {directory / 'completion_loss.png'} and {directory / 'completions.png'}")


if __name__ == "__main__":
    main()
