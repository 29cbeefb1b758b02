"""Sparse convolution benchmark: sparsegrid against, in the same run, (a) a per-tap gather / matmul /
index_add written with torch ops over the same kernel map, (b) dense conv3d / conv_transpose3d on the
members' bounding canvas, and (c) one dense GEMM (torch.mm) with the same FLOP count.

Layers: k3s1 on the input grid (submanifold) and the generative k2s2 transposed convolution.
Timing: median of --repeats runs after --warmup (CUDA events on a GPU, perf_counter on the CPU).
Usage: PYTHONPATH=python python3 bench/conv_bench.py --input data/reference_batch_r64.txt --members 16
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import sparsegrid as sg


def read_batch(path, members):
    with open(path) as f:
        count = int(f.readline())
        offsets = [int(v) for v in f.readline().split()]
        rows = [list(map(int, line.split())) for line in f]
    coords = torch.tensor(rows, dtype=torch.int32)
    members = count if members is None else members
    return [coords[offsets[m]:offsets[m + 1]] for m in range(members)]


def timer(device):
    if device.type == "cuda":
        def measure(fn, repeats, warmup):
            for _ in range(warmup):
                fn()
            samples = []
            for _ in range(repeats):
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                samples.append(start.elapsed_time(stop))
            return statistics.median(samples)
    else:
        def measure(fn, repeats, warmup):
            for _ in range(warmup):
                fn()
            samples = []
            for _ in range(repeats):
                t = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t) * 1e3)
            return statistics.median(samples)
    return measure


def per_tap(x, w, neighbours):
    """out[r] = sum_t W[:, :, t] x[map[r][t]] with one gather / mm / index_add per tap."""
    cout = w.shape[0]
    out = torch.zeros(neighbours.shape[0], cout, dtype=x.dtype, device=x.device)
    wt = w.reshape(cout, w.shape[1], -1)
    for t in range(neighbours.shape[1]):
        rows = (neighbours[:, t] >= 0).nonzero().squeeze(1)
        out.index_add_(0, rows, x[neighbours[rows, t].long()] @ wt[:, :, t].T)
    return out


def dense_canvas(grid, x, pad):
    ijk = grid.ijk.long()
    offsets = grid.joffsets.tolist()
    lo = ijk.min(0).values - pad
    size = (ijk.max(0).values - lo + 1 + pad).tolist()
    canvas = torch.zeros(grid.batch_size, x.shape[1], *size, dtype=x.dtype, device=x.device)
    member = torch.repeat_interleave(torch.arange(grid.batch_size), torch.tensor(offsets).diff())
    c = ijk - lo
    canvas[member, :, c[:, 0], c[:, 1], c[:, 2]] = x
    return canvas


def run(args):
    device = torch.device(args.device)
    measure = timer(device)
    grid = sg.GridBatch.from_ijk(read_batch(args.input, args.members))
    print(f"sparsegrid conv benchmark: {grid.batch_size} members, {grid.num_voxels} voxels, device {device}, "
          f"dtype {args.dtype}, median of {args.repeats} runs")
    dtype = getattr(torch, args.dtype)
    header = ("layer", "C", "pass", "sparsegrid ms", "per-tap ms", "dense ms", "GEMM ms", "vs GEMM")
    print(" | ".join(header))
    for channels in args.channels:
        for layer, (k, s, transposed) in {"k3s1 submanifold": (3, 1, False), "k2s2 transposed": (2, 2, True)}.items():
            if transposed:
                plan = sg.ConvolutionPlan.from_grid_transposed(grid, k, s)
            else:
                plan = sg.ConvolutionPlan.from_grid(grid, k, s, grid)
            neighbours = plan.target_map().to(device)
            edges = int((neighbours >= 0).sum())
            x = torch.randn(grid.num_voxels, channels, dtype=dtype, device=device, requires_grad=True)
            w = torch.randn(channels, channels, k, k, k, dtype=dtype, device=device, requires_grad=True)
            a = torch.randn(edges, channels, dtype=dtype, device=device)
            b = torch.randn(channels, channels, dtype=dtype, device=device)
            canvas = dense_canvas(grid, x.detach(), 1)
            for mode in ("forward", "forward+backward"):
                def ours():
                    y = plan.execute(x, w)
                    if mode != "forward":
                        y.backward(torch.ones_like(y))

                def tap():
                    y = per_tap(x, w, neighbours)
                    if mode != "forward":
                        y.backward(torch.ones_like(y))

                def dense():
                    c = canvas.requires_grad_(mode != "forward")
                    if transposed:
                        y = F.conv_transpose3d(c, w.transpose(0, 1), stride=s)
                    else:
                        y = F.conv3d(c, w, padding=1)
                    if mode != "forward":
                        y.backward(torch.ones_like(y))

                gemms = 1 if mode == "forward" else 3
                times = [measure(fn, args.repeats, args.warmup) for fn in (ours, tap, dense)]
                gemm = measure(lambda: [a @ b for _ in range(gemms)], args.repeats, args.warmup)
                print(f"{layer} | {channels} | {mode} | {times[0]:.3f} | {times[1]:.3f} | {times[2]:.3f} | "
                      f"{gemm:.3f} | {times[0] / gemm:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", default="data/reference_batch_r64.txt")
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--channels", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
