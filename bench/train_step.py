"""Training-step benchmark: one step of the shape VAE of examples/vae.py (encoder, generative decoder with
pruning, loss, backward, Adam), per batch size, split into topology and plan construction, convolutions
and the rest, with the GPU's busy fraction.

Workload: at resolution 64 the first B members of data/reference_batch_r64.txt (batch 16: the 150,605
voxels of the topology benchmark), at other resolutions B procedural shapes (sg.synthetic_shapes); the
same batch every step, while the decoder's generated and pruned grids change with the weights. Each
batch size starts from the same freshly seeded model.

Method, per batch size:
  1. --warmup steps, untimed: allocator growth, lazy initialisation, and the first steps of training,
     in which the decoder's voxel count falls fast as it stops predicting everything.
  2. 2 x --iterations steps, alternating plain and timed, each between two device synchronisations
     (wall clock, perf_counter). Plain steps give "step ms": the step with nothing added, and "host ms":
     the time until the step's Python call returned, before the closing synchronisation (the host's
     share; close to step ms when the host, not the GPU, sets the pace). Timed steps run
     with vae.StepProfiler's spans (CUDA event pairs on the stream, read after the step; perf_counter on
     the CPU) around every topology call and every convolution, forward and backward:
       topology ms  grids (input batch, decoder seed), plans (kernel maps and generated grids), pruning,
                    label lookups, and the ground-truth pyramid (the target at every decoder level, also
                    in its own column);
       conv ms      forward, input-gradient and weight-gradient convolutions;
       rest ms      timed step - topology - conv (dense layers, loss, masks, optimizer, Python);
       topology %   topology / timed step.
     A span also counts time the GPU waited for the host inside it (Python, host synchronisations), and
     never counts the earlier work still queued when it began, so the spans are disjoint on the stream.
     "syncs" counts the library's host synchronisations per step (sparsegrid.host_synchronizations),
     and on CUDA "torch syncs" those of torch's own operations in one further step (the warnings of
     torch.cuda.set_sync_debug_mode("warn"), e.g. boolean indexing or .item()).
  3. On CUDA, --profile-iterations further steps under torch.profiler with CUDA activity (CUPTI): each
     step is a record_function range that ends after a synchronisation; GPU busy = the length of the
     union of the kernel, memcpy and memset intervals inside the range / the range's length, and
     kernels = the kernels launched in it. The profiler's per-launch overhead lengthens the steps, so
     the busy fraction, if anything, understates the unprofiled one.
Each column is the median of its own samples, so the columns need not add up exactly. The last column
compares growth with the first batch size: (topology / first topology) / (voxels / first voxels),
counting input and decoder voxels; at most about 1 means topology cost grows no faster than voxels.

Usage: PYTHONPATH=python python3 bench/train_step.py [--device cuda] [--batch 16 32 48] [--autocast bfloat16]
       [--tf32] [--channels 32 64 128 256] [--host-profile DIR] [--json PATH]
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import warnings

import torch

import sparsegrid as sg

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))
import vae  # noqa: E402  (the model and its training step)
from conv_bench import read_batch  # noqa: E402

REFERENCE = ROOT / "data" / "reference_batch_r64.txt"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Training-step benchmark of the shape VAE")
    vae.add_device_argument(parser)
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 32, 48], help="batch sizes, one row each")
    parser.add_argument("--resolution", type=int, default=64, help="a multiple of 16")
    parser.add_argument("--input", default=None,
                        help="voxel batch file whose first B members form the batch (default: the reference "
                             "batch at resolution 64, procedural shapes otherwise)")
    parser.add_argument("--warmup", type=int, default=40, help="untimed training steps first")
    parser.add_argument("--iterations", type=int, default=20, help="plain steps, and as many timed steps")
    parser.add_argument("--profile-iterations", type=int, default=5, help="steps under torch.profiler (CUDA)")
    parser.add_argument("--channels", type=int, nargs=vae.LEVELS, default=[8, 16, 32, 32])
    parser.add_argument("--latent", type=int, default=16, help="latent channels per cell (as examples/vae.py)")
    parser.add_argument("--kl-weight", type=float, default=1e-3)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--norm", choices=("torch", "fused"), default="torch",
                        help="batch norm and ELU as torch's modules, or fused in sparsegrid.nn.BatchNorm "
                             "(as examples/vae.py)")
    parser.add_argument("--autocast", choices=("bfloat16", "float16"), default=None,
                        help="the forward pass and loss inside torch.autocast on CUDA in this dtype (the "
                             "convolutions run in it; parameters, gradients and Adam stay float32; float16 "
                             "without a gradient scaler, for timing)")
    parser.add_argument("--tf32", action="store_true",
                        help="allow TF32 for float32 matrix products (torch.backends.cuda.matmul.allow_tf32, "
                             "which the sparse convolutions follow)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON")
    parser.add_argument("--host-profile", default=None, metavar="DIR",
                        help="also run --profile-iterations steps under torch.profiler (host side) and cProfile, "
                             "writing the operators by self CPU time, the Python functions by own time and, on "
                             "CUDA, the kernels by launches per step to DIR, with the profiled steps' timeline "
                             "(a Chrome trace)")
    args = parser.parse_args(argv)
    vae.check_resolution(args.resolution)
    if args.iterations < 1 or args.warmup < 0 or args.profile_iterations < 0:
        raise SystemExit("--iterations must be >= 1, --warmup and --profile-iterations >= 0")
    args.device = vae.resolve_device(args.device)
    if args.autocast and args.device != "cuda":
        raise SystemExit(f"--autocast {args.autocast}: 16-bit convolutions run on CUDA only (--device is "
                         f"{args.device})")
    if args.input is None and args.resolution == 64:
        args.input = str(REFERENCE)
    return args


def shape_pool(args):
    """The members batches are taken from (CPU tensors), and a description of them."""
    largest = max(args.batch)
    if args.input:
        members = read_batch(args.input, None)
        if largest > len(members):
            raise SystemExit(f"--batch {largest}: {args.input} has only {len(members)} members")
        return members, f"{args.input}, first B members"
    return sg.synthetic_shapes(largest, args.resolution, args.seed), f"procedural shapes, seed {args.seed}"


def precision(args):
    """The step's arithmetic, as the header and the JSON give it."""
    if args.autocast:
        return f"{args.autocast} autocast"
    return "float32 with TF32" if args.tf32 else "float32"


def median(values):
    return statistics.median(values) if values else None


def gpu_activity(step, count):
    """Median GPU busy fraction, kernels and profiled step ms over `count` steps under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(count):
            torch.cuda.synchronize()
            with record_function("train_step"):
                step()
                torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    events = [e for e in (trace["traceEvents"] if isinstance(trace, dict) else trace)
              if e.get("ph") == "X" and "dur" in e]
    category = lambda e: str(e.get("cat", "")).lower()  # noqa: E731
    ranges = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                    if e.get("name") == "train_step" and not category(e).startswith("gpu"))
    device = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), category(e) == "kernel") for e in events
                    if category(e) in ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"))
    busy, kernels, lengths = [], [], []
    for begin, end in ranges:
        covered, reach, launched = 0.0, begin, 0
        for start, stop, is_kernel in device:
            if stop <= begin or start >= end:
                continue
            launched += is_kernel
            start, stop = max(start, reach), min(stop, end)
            if stop > start:
                covered += stop - start
                reach = stop
        busy.append(covered / (end - begin))
        kernels.append(launched)
        lengths.append((end - begin) * 1e-3)
    return median(busy), median(kernels), median(lengths)


def write_kernels(averages, count, path):
    """The device events of a profile's key averages, by launches per step, with device us per step."""
    try:
        kernels = sorted(((e.count, e.key,
                           getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0))
                          for e in averages if e.device_type == torch.autograd.DeviceType.CUDA), reverse=True)
        lines = ["launches per step, device us per step, kernel"]
        lines += [f"{n / count:8.1f} {t / count:10.1f}  {name[:150]}" for n, name, t in kernels]
    except (AttributeError, TypeError) as error:  # a torch whose profiler events differ
        lines = [f"no kernel listing: {error!r}"]
    pathlib.Path(path).write_text("\n".join(lines) + "\n")


def host_profile(step, count, prefix, device):
    """`count` steps under torch.profiler (CPU activity: operators and CUDA runtime calls, with the
    time spent waiting in synchronisations; on CUDA also the kernels, by launches per step) and `count`
    under cProfile (Python functions), written to prefix + _operators.txt, _kernels.txt and _python.txt, with
    the profiler's timeline of its steps in prefix + _trace.json."""
    import cProfile
    import pstats
    from torch.profiler import ProfilerActivity, profile

    prefix.parent.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(count):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    # Every operator and runtime call with its time, for attributing launches to the calls that make them
    # (chrome://tracing or Perfetto).
    prof.export_chrome_trace(f"{prefix}_trace.json")
    averages = prof.key_averages()
    table = averages.table(sort_by="self_cpu_time_total", row_limit=60)
    pathlib.Path(f"{prefix}_operators.txt").write_text(f"{count} steps\n{table}\n")
    if device.type == "cuda":
        # The device's kernels by launches per step (where the launches of a step come from).
        write_kernels(averages, count, f"{prefix}_kernels.txt")
    python = cProfile.Profile()
    python.enable()
    for _ in range(count):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    python.disable()
    with open(f"{prefix}_python.txt", "w") as f:
        f.write(f"{count} steps\n")
        stats = pstats.Stats(python, stream=f)
        stats.sort_stats("tottime").print_stats(50)
        stats.sort_stats("cumtime").print_stats(60)
    kernels = f", {prefix}_kernels.txt" if device.type == "cuda" else ""
    print(f"host profile: {prefix}_operators.txt{kernels}, {prefix}_python.txt, {prefix}_trace.json", flush=True)


# The warning torch.cuda.set_sync_debug_mode("warn") gives at each synchronising operation. Setting the
# mode warns too ("... does not yet detect all synchronizing operations"), which is not a wait.
TORCH_SYNC_WARNING = "called a synchronizing CUDA operation"


def torch_syncs(step):
    """Host synchronisations of torch's own operations in one step: the warnings of
    torch.cuda.set_sync_debug_mode("warn") (the library's are counted by sg.host_synchronizations)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return sum(TORCH_SYNC_WARNING in str(w.message) for w in caught)


def run_batch(args, device, members):
    shapes = [member.to(device) for member in members]
    encoder, decoder = vae.build_model(args, device)
    optimizer = vae.make_optimizer(list(encoder.parameters()) + list(decoder.parameters()), args.lr, device)
    profiler = vae.StepProfiler(device).install()

    def step():
        target = sg.GridBatch.from_ijk(shapes)
        return vae.vae_step(encoder, decoder, optimizer, target, args.kl_weight, profiler,
                            autocast=getattr(torch, args.autocast) if args.autocast else None)

    try:
        for _ in range(args.warmup):
            step()
        profiler.collect()
        plain, host, timed, split, voxels, syncs = [], [], [], [], [], []
        for index in range(2 * args.iterations):
            profiler.enabled = index % 2 == 1
            profiler.synchronize()
            syncs_before = sg.host_synchronizations()
            start = time.perf_counter()
            _, decoder_voxels = step()
            returned = time.perf_counter()
            profiler.synchronize()
            seconds = time.perf_counter() - start
            syncs.append(sg.host_synchronizations() - syncs_before)
            if profiler.enabled:
                timed.append(seconds)
                split.append(profiler.collect())
                voxels.append(decoder_voxels)
            else:
                plain.append(seconds)
                host.append(returned - start)
        profiler.enabled = False
        activity = (None, None, None)
        torch_sync_count = torch_syncs(step) if device.type == "cuda" else None
        if device.type == "cuda" and args.profile_iterations:
            activity = gpu_activity(step, args.profile_iterations)
        if args.host_profile and args.profile_iterations:
            host_profile(step, args.profile_iterations, pathlib.Path(args.host_profile) / f"b{len(members)}",
                         device)
    finally:
        profiler.uninstall()

    def ms(samples):
        return 1e3 * median(samples)

    topology = [sum(s[c] for c in vae.StepProfiler.TOPOLOGY) for s in split]
    row = {
        "batch": len(members),
        "input_voxels": sum(int(m.shape[0]) for m in members),
        "decoder_voxels": int(median(voxels)),
        "step_ms": ms(plain),
        "step_min_ms": 1e3 * min(plain),
        "host_ms": ms(host),
        "timed_step_ms": ms(timed),
        "topology_ms": ms(topology),
        "convolution_ms": ms([s["convolutions"] for s in split]),
        "rest_ms": ms([t - topo - s["convolutions"] for t, topo, s in zip(timed, topology, split)]),
        "topology_fraction": median([topo / t for topo, t in zip(topology, timed)]),
        "host_syncs_per_step": median(syncs),
        "torch_syncs_per_step": torch_sync_count,
        "gpu_busy": activity[0],
        "kernels_per_step": activity[1],
        "profiled_step_ms": activity[2],
    }
    for category in vae.StepProfiler.TOPOLOGY:
        row[f"{category}_ms"] = ms([s[category] for s in split])
    return row


def table(rows, on_cuda):
    def cell(value, digits=2):
        return "-" if value is None else f"{value:.{digits}f}"

    first = rows[0]
    first_voxels = first["input_voxels"] + first["decoder_voxels"]
    header = ("| batch | input voxels | decoder voxels | step ms | host ms | topology ms | plans ms | pyramid ms "
              "| conv ms | rest ms | topology % | syncs | torch syncs | GPU busy | kernels "
              "| topology growth / voxel growth |")
    lines = [header, "|" + "|".join("---:" for _ in range(header.count("|") - 1)) + "|"]
    for row in rows:
        voxel_growth = (row["input_voxels"] + row["decoder_voxels"]) / first_voxels
        growth = (row["topology_ms"] / first["topology_ms"]) / voxel_growth if first["topology_ms"] else None
        busy = None if row["gpu_busy"] is None else 100 * row["gpu_busy"]
        lines.append(
            f"| {row['batch']} | {row['input_voxels']} | {row['decoder_voxels']} | {cell(row['step_ms'])} "
            f"| {cell(row['host_ms'])} | {cell(row['topology_ms'])} | {cell(row['plans_ms'])} "
            f"| {cell(row['pyramid_ms'])} "
            f"| {cell(row['convolution_ms'])} | {cell(row['rest_ms'])} | {cell(100 * row['topology_fraction'], 1)} "
            f"| {cell(row['host_syncs_per_step'], 0)} | {cell(row['torch_syncs_per_step'], 0)} "
            f"| {cell(busy, 1) + ' %' if on_cuda and busy is not None else '-'} "
            f"| {cell(row['kernels_per_step'], 0)} | {cell(growth)} |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    members, source = shape_pool(args)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU, {torch.get_num_threads()} torch threads"
    print(f"VAE training step on {device.type} ({name}), torch {torch.__version__}: resolution {args.resolution}, "
          f"{source}; channels {args.channels}, latent {args.latent}; {precision(args)}; norm {args.norm}; "
          f"warm-up {args.warmup}, "
          f"medians of {args.iterations} plain and {args.iterations} timed steps", flush=True)
    rows = []
    for batch in args.batch:
        rows.append(run_batch(args, device, members[:batch]))
        print(f"batch {batch}: step {rows[-1]['step_ms']:.2f} ms", flush=True)
    print()
    print(table(rows, device.type == "cuda"))
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"device": device.type, "device_name": name, "torch": torch.__version__,
                       "resolution": args.resolution, "input": source, "channels": args.channels,
                       "precision": precision(args), "norm": args.norm,
                       "latent": args.latent, "warmup": args.warmup, "iterations": args.iterations,
                       "profile_iterations": args.profile_iterations, "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
