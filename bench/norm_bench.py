#!/usr/bin/env python3
"""Batch norm + ELU over voxel features: sparsegrid.nn.BatchNorm(C, activation="elu") against
torch.nn.BatchNorm1d(C) followed by torch.nn.ELU(), in training mode, measured in the same run.

For each row count, channel count and dtype it prints the median device time of the forward pass and of
forward + backward (CUDA events after warm-up; wall time on the CPU), and the host time per forward call
(the call alone, queued without synchronisation), with the ratio torch / sparsegrid. 16-bit features
take float32 parameters, as under autocast.

Usage: bench/norm_bench.py [--device cuda] [--rows 150605 525272] [--channels 8 32 128]
       [--dtypes float32 bfloat16] [--repeats 30] [--warmup 5] [--json PATH]"""

import argparse
import json
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from sparsegrid import nn as snn  # noqa: E402

# timer: median ms (CUDA events after warm-up, wall time on the CPU); host_us: host time per queued call.
from conv_bench import host_us, timer  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, nargs="+", default=[150605, 525272],
                        help="feature rows (defaults: the batch-16 reference input and the VAE decoder's voxels)")
    parser.add_argument("--channels", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"batch norm + ELU, training, on {name} (torch {torch.__version__}); median ms of {args.repeats}")
    header = ("| rows | C | dtype | torch fwd | ours fwd | ratio | torch fwd+bwd | ours fwd+bwd | ratio | "
              "torch host us | ours host us | ratio |")
    print(header)
    print("|" + "---:|" * 3 + "---:|" * 9)
    timed = timer(device)
    rows_out = []
    for rows in args.rows:
        for channels in args.channels:
            for dtype_name in args.dtypes:
                dtype = getattr(torch, dtype_name)
                if dtype in (torch.float16, torch.bfloat16) and device.type != "cuda":
                    continue
                x = torch.randn(rows, channels, device=device).to(dtype).requires_grad_(True)
                grad = torch.randn(rows, channels, device=device).to(dtype)
                torch_layer = torch.nn.Sequential(torch.nn.BatchNorm1d(channels), torch.nn.ELU()).to(device)
                ours = snn.BatchNorm(channels, activation="elu").to(device)
                if dtype == torch.float64:
                    torch_layer, ours = torch_layer.double(), ours.double()
                result = {"rows": rows, "channels": channels, "dtype": dtype_name}
                for label, layer in (("torch", torch_layer), ("ours", ours)):
                    result[f"{label}_forward_ms"] = timed(lambda: layer(x), args.repeats, args.warmup)
                    result[f"{label}_forward_backward_ms"] = timed(lambda: layer(x).backward(grad), args.repeats,
                                                                   args.warmup)
                    result[f"{label}_host_us"] = host_us(lambda: layer(x), device, 200)
                rows_out.append(result)
                cells = [rows, channels, dtype_name]
                for key in ("forward_ms", "forward_backward_ms", "host_us"):
                    a, b = result[f"torch_{key}"], result[f"ours_{key}"]
                    cells += [f"{a:.3f}" if key != "host_us" else f"{a:.1f}",
                              f"{b:.3f}" if key != "host_us" else f"{b:.1f}", f"{a / b:.2f}x"]
                print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"device": name, "rows": rows_out}, indent=1))


if __name__ == "__main__":
    main()
