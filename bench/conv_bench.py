"""Sparse convolution benchmark: sparsegrid against, in the same run, (a) a per-tap gather / matmul /
index_add written with torch ops over the same kernel map, (b) dense conv3d / conv_transpose3d on the
members' bounding canvas, and (c) one dense GEMM (torch.mm) with the same FLOP count.

Layers: k3s1 on the input grid (submanifold) and the generative k2s2 transposed convolution.
Timing: median of --repeats runs after --warmup (CUDA events on a GPU, perf_counter on the CPU).
"vs GEMM" is sparsegrid's time over the GEMM's (one for the forward pass, three for forward+backward).
--tf32 allows TF32 for float32 matrix products (torch.backends.cuda.matmul.allow_tf32), which sparsegrid
follows as torch.mm does: sparsegrid, the per-tap ops and the GEMM then all run on TF32 tensor cores.
Dense conv3d follows torch.backends.cudnn.allow_tf32 instead (PyTorch's default: allowed).

--passes adds the forward pass, the input gradient and the weight gradient each on its own (through the
plan's own entry points, no autograd), with their rates in TFLOP/s counted over the map's edges
(2 x edges x Cin x Cout per pass) and as a fraction of the dense tensor-core peak of an H200 (989 TFLOP/s
float16 / bfloat16, 495 TF32, 67 float32), next to the equal-FLOP GEMM; --no-baselines skips the per-tap
and dense comparisons (slow at wide channels).

Per-layer host overhead: on a small grid (so that the device is never the bottleneck), the host time
of building a k3s1 plan on existing grids and executing it, per layer, averaged over many layers queued
without synchronisation.
Usage: PYTHONPATH=python python3 bench/conv_bench.py --input data/reference_batch_r64.txt --members 16
"""

import argparse
import json
import pathlib
import statistics
import time

import torch
import torch.nn.functional as F

import sparsegrid as sg
from sparsegrid import nn as snn


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
    offsets = grid.joffsets.cpu()
    lo = ijk.min(0).values - pad
    size = (ijk.max(0).values - lo + 1 + pad).tolist()
    canvas = torch.zeros(grid.batch_size, x.shape[1], *size, dtype=x.dtype, device=x.device)
    member = torch.repeat_interleave(torch.arange(grid.batch_size), offsets.diff()).to(x.device)
    c = ijk - lo
    canvas[member, :, c[:, 0], c[:, 1], c[:, 2]] = x
    return canvas


def host_us(fn, device, calls):
    """Host microseconds per call of fn after 20 warm-up calls, the calls queued back to back (the last
    result kept until the device has finished)."""
    for _ in range(20):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        y = fn()
    elapsed = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.synchronize()
    del y
    return elapsed / calls * 1e6


def host_overhead_us(device, dtype, layers=300):
    """Host microseconds per layer on a 16-voxel grid (so that the device is never the bottleneck),
    averaged over `layers` calls queued without synchronisation: the whole layer (k3s1 plan on existing
    grids + execute) and its parts, the two backward passes, next to a trivial method call of the layer
    and a small torch op."""
    ijk = torch.stack(torch.meshgrid(*[torch.arange(2)] * 3, indexing="ij"), -1).reshape(-1, 3).int()
    grid = sg.GridBatch.from_ijk([ijk, ijk + 4], device=device)
    x = torch.randn(grid.num_voxels, 8, dtype=dtype, device=device)
    w = torch.randn(8, 8, 3, 3, 3, dtype=dtype, device=device)
    xg = x.clone().requires_grad_(True)
    g = torch.randn_like(x)
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 1, grid)
    # The nn layer as a network calls it: its plan found in the grid's cache, its weight a parameter.
    layer = snn.SparseConv3d(8, 8, 3, bias=False).to(device=device, dtype=dtype)
    sparse_x = snn.SparseFeatures(grid, x)

    def layer_no_grad():
        with torch.no_grad():
            return layer(sparse_x)

    parts = {
        "plan + execute (the layer)": lambda: sg.ConvolutionPlan.from_grid(grid, 3, 1, grid).execute(x, w),
        "plan + execute, input requiring grad": lambda: sg.ConvolutionPlan.from_grid(grid, 3, 1, grid).execute(xg, w),
        "plan only": lambda: sg.ConvolutionPlan.from_grid(grid, 3, 1, grid),
        "execute only (existing plan)": lambda: plan.execute(x, w),
        "SparseConv3d layer (weight requiring grad)": lambda: layer(sparse_x),
        "SparseConv3d layer, no grad": layer_no_grad,
        # The backward passes as autograd calls them, one call each (a step's backward also pays the
        # autograd engine once, which these leave out).
        "input gradient pass": lambda: plan._handle.backward_input(g, w),
        "weight gradient pass": lambda: plan._handle.backward_weight(x, g, w.dtype),
        "layer method call (num_voxels)": lambda: grid._handle.num_voxels(),
        "torch op (x @ 8x8 matrix)": lambda: x @ w[:, :, 0, 0, 0],
    }
    result = {name: host_us(fn, device, layers) for name, fn in parts.items()}
    if device.type == "cuda":
        # Launches per layer, from the profiler (device kernels and copies).
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                parts["plan + execute (the layer)"]()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        result["device launches per layer"] = len(kernels) / 10
        names = {}
        for e in kernels:
            names[e.name] = names.get(e.name, 0) + 1
        result["launches"] = {k[:90]: v / 10 for k, v in sorted(names.items(), key=lambda kv: -kv[1])}
    return result


# Dense peaks of one H200 (datasheet, TFLOP/s), for the fraction-of-peak columns.
PEAK_TFLOPS = {"float16": 989.0, "bfloat16": 989.0, "tf32": 495.0, "float32": 67.0, "float64": 34.0}


def pass_rows(args, measure, layer, plan, channels, edges, dtype, device, peak):
    """The forward pass, input gradient and weight gradient on their own, against an equal-FLOP GEMM."""
    handle = plan._handle
    k = round(plan.target_map().shape[1] ** (1 / 3))
    x = torch.randn(plan.source_grid.num_voxels, channels, dtype=dtype, device=device)
    w = torch.randn(channels, channels, k, k, k, dtype=dtype, device=device) / channels
    g = torch.randn(plan.target_grid.num_voxels, channels, dtype=dtype, device=device)
    a = torch.randn(edges, channels, dtype=dtype, device=device)
    b = torch.randn(channels, channels, dtype=dtype, device=device)
    flops = 2.0 * edges * channels * channels
    gemm = measure(lambda: a @ b, args.repeats, args.warmup)
    rows = []
    total = 0.0
    for name, fn in (("forward", lambda: handle.forward(x, w)), ("input gradient", lambda: handle.backward_input(g, w)),
                     ("weight gradient", lambda: handle.backward_weight(x, g))):
        ms = measure(fn, args.repeats, args.warmup)
        total += ms
        rows.append((name, ms, flops))
    rows.append(("forward+backward", total, 3 * flops))
    out = []
    for name, ms, work in rows:
        gemm_ms = gemm * work / flops
        rate = work / ms / 1e9
        out.append({"layer": layer, "channels": channels, "pass": name, "edges": edges, "sparsegrid_ms": ms,
                    "tflops": rate, "peak_fraction": rate / peak, "gemm_ms": gemm_ms})
        print(f"| {layer} | {channels} | {name} | {ms:.3f} | {rate:.2f} | {100 * rate / peak:.1f}% | {gemm_ms:.3f} | "
              f"{ms / gemm_ms:.2f}x |")
    return out


def run(args):
    device = torch.device(args.device)
    measure = timer(device)
    grid = sg.GridBatch.from_ijk([m.to(device) for m in read_batch(args.input, args.members)])
    dtype = getattr(torch, args.dtype)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    precision = f"{args.dtype}{', TF32 allowed' if args.tf32 else ''}"
    print(f"sparsegrid conv benchmark: {grid.batch_size} members, {grid.num_voxels} voxels, device {device}, "
          f"dtype {precision}, median of {args.repeats} runs after {args.warmup} warm-up runs")
    rows = []
    if args.passes:
        peak = PEAK_TFLOPS["tf32" if args.tf32 and args.dtype == "float32" else args.dtype]
        header = ("layer", "C", "pass", "sparsegrid ms", "TFLOP/s", f"of peak ({peak:.0f})", "GEMM ms", "vs GEMM")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for channels in args.channels:
            for layer, (k, s, transposed) in {"k3s1 submanifold": (3, 1, False),
                                              "k2s2 transposed": (2, 2, True)}.items():
                plan = (sg.ConvolutionPlan.from_grid_transposed(grid, k, s) if transposed
                        else sg.ConvolutionPlan.from_grid(grid, k, s, grid))
                edges = int((plan.target_map() >= 0).sum())
                rows += pass_rows(args, measure, layer, plan, channels, edges, dtype, device, peak)
        print()
    header = ("layer", "C", "pass", "sparsegrid ms", "per-tap ms", "dense ms", "GEMM ms", "vs GEMM")
    if args.baselines:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
    for channels in args.channels if args.baselines else []:
        for layer, (k, s, transposed) in {"k3s1 submanifold": (3, 1, False), "k2s2 transposed": (2, 2, True)}.items():
            if transposed:
                plan = sg.ConvolutionPlan.from_grid_transposed(grid, k, s)
            else:
                plan = sg.ConvolutionPlan.from_grid(grid, k, s, grid)
            neighbours = plan.target_map()
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
                rows.append({"layer": layer, "channels": channels, "pass": mode, "edges": edges,
                             "sparsegrid_ms": times[0], "per_tap_ms": times[1], "dense_ms": times[2],
                             "gemm_ms": gemm})
                print(f"| {layer} | {channels} | {mode} | {times[0]:.3f} | {times[1]:.3f} | {times[2]:.3f} | "
                      f"{gemm:.3f} | {times[0] / gemm:.2f}x |")
            canvas = None  # freed before the next canvas is allocated
    parts, overhead = {}, None
    if args.host_overhead:
        parts = host_overhead_us(device, dtype)
        overhead = parts["plan + execute (the layer)"]
        print(f"host overhead per layer (k3s1 plan on existing grids + execute, from Python): {overhead:.1f} us")
        for name, value in parts.items():
            print(f"  {name}: {value if isinstance(value, dict) else f'{value:.1f}'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "dtype": args.dtype, "tf32": args.tf32, "voxels": grid.num_voxels, "rows": rows,
                       "host_overhead_us": overhead, "host_overhead_parts": parts}, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", default=str(pathlib.Path(__file__).resolve().parents[1] / "data" /
                                               "reference_batch_r64.txt"))
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--channels", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
    parser.add_argument("--tf32", action="store_true",
                        help="allow TF32 for float32 matrix products (sparsegrid and torch.mm alike)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--passes", action="store_true",
                        help="each pass on its own, with TFLOP/s and the fraction of the dense peak")
    parser.add_argument("--no-baselines", dest="baselines", action="store_false",
                        help="skip the per-tap torch and dense conv3d comparisons")
    parser.add_argument("--no-host-overhead", dest="host_overhead", action="store_false",
                        help="skip the per-layer host overhead measurement")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
