#!/usr/bin/env python3
"""Torch-native baseline for sparsegrid's topology benchmark.

What it measures: the time a PyTorch user's hand-written version of sparsegrid's topology operations
takes on the same batch and the same machine as `sparsegrid bench`. Everything is plain torch ops (no
custom kernels, no Python loops over voxels or batch members): every voxel (member, i, j, k) is packed
into one int64 key, and the operations are sort / unique / searchsorted on those keys.

Key layout: ``key = member << 3b | (i + bias) << 2b | (j + bias) << b | (k + bias)``. The field width b
and the bias are computed once from the batch so that every coordinate any operation below can produce
or look up fits in a field (see KeyCodec); then adding a tap offset to a key is the same as adding it to
the coordinates, and sorted keys are in member-major, lexicographic voxel order.

Semantics are exactly sparsegrid's (see DESIGN.md, "Semantics"): per axis pb = (K - 1) // 2 and the
edge relation is ``fine = S*coarse + tap - pb`` with 0 <= tap < K, taps numbered
t = t0*K1*K2 + t1*K2 + t2 (t0 along i). Rows, with the names `sparsegrid bench` uses:

- conv_transpose_grid(2,2): unique of S*c + tap - pb over all coarse voxels c and taps.
- conv_grid(2,2), conv_grid(3,2), conv_grid(3,1): unique of every c = (f - tap + pb) / S over fine
  voxels f and taps where the division is exact (floor division, so negative indices are right).
- neighbour_map k3s1: the [N, 27] int32 map of the grid onto itself, map[v][t] = index of the voxel at
  v + tap(t) - pb, -1 where absent (searchsorted on the sorted keys plus an equality check).
- transposed plan k2s2 (grid + map): conv_transpose_grid(2,2) together with its transposed-direction
  map [N_fine, 8], map[f][t] = index of the coarse c with 2c + tap(t) = f, -1 where none (scattered
  from unique's inverse).

Every grid result is complete, as sparsegrid returns it: sorted unique keys decoded back to int32 ijk
[N, 3] plus member offsets [B + 1]. Voxel order differs from sparsegrid's (lexicographic here, Morton
there); voxel sets and output counts are the same. Building the input grid from the file is not timed.

Timing: after --warmup runs, each of --repeats runs is timed on its own, with CUDA events on a GPU
(synchronising after each run) or time.perf_counter on the CPU; the table and JSON give median and min.

Usage:
    python3 bench/torch_baseline.py --input data/reference_batch_r64.txt --members 16 --json torch16.json

Works with torch 1.13 and 2.x.
"""

import argparse
import json
import statistics
import sys
import time
from typing import Callable, List, NamedTuple, Optional, Tuple

import torch


# ---- input ---------------------------------------------------------------------------------------


def read_batch(path: str, members: Optional[int]) -> Tuple[torch.Tensor, List[int]]:
    """The first `members` members of a reference batch file (all when None): int32 ijk [N, 3] and the
    member offsets [members + 1]. Format: member count B, then B + 1 offsets, then one `i j k` per voxel."""
    with open(path) as file:
        tokens = file.read().split()
    if not tokens:
        raise ValueError(f"'{path}' is empty")
    available = int(tokens[0])
    offsets = [int(t) for t in tokens[1 : available + 2]]
    if len(offsets) != available + 1 or offsets[0] != 0 or offsets != sorted(offsets):
        raise ValueError(f"'{path}': bad member offsets")
    count = available if members is None else members
    if not 1 <= count <= available:
        raise ValueError(f"--members must be in [1, {available}] for '{path}', got {count}")
    first = available + 2
    coordinates = tokens[first : first + 3 * offsets[count]]
    if len(coordinates) != 3 * offsets[count]:
        raise ValueError(f"'{path}' holds fewer voxels than its offsets promise")
    ijk = torch.tensor([int(t) for t in coordinates], dtype=torch.int32).view(-1, 3)
    return ijk, offsets[: count + 1]


# ---- packed keys ---------------------------------------------------------------------------------


class Grid(NamedTuple):
    keys: torch.Tensor     # int64 [N], sorted, unique
    ijk: torch.Tensor      # int32 [N, 3]
    offsets: torch.Tensor  # int64 [B + 1]


def tap_table(kernel: int, device: torch.device) -> torch.Tensor:
    """int32 [K^3, 3]: tap (t0, t1, t2) of linear tap index t = t0*K*K + t1*K + t2."""
    axis = torch.arange(kernel, dtype=torch.int32, device=device)
    t0, t1, t2 = torch.meshgrid(axis, axis, axis, indexing="ij")
    return torch.stack([t0.reshape(-1), t1.reshape(-1), t2.reshape(-1)], dim=1)


class KeyCodec:
    """Packs (member, i, j, k) into int64 keys and back, with field widths computed from the batch."""

    def __init__(self, ijk: torch.Tensor, batch_size: int, device: torch.device):
        lo = int(ijk.min()) if ijk.numel() else 0
        hi = int(ijk.max()) if ijk.numel() else 0
        # Every coordinate an operation with K <= 3, S <= 2 produces or looks up: stride-2 transposed
        # outputs span [2*lo - 1, 2*hi + 1]; stride-1 outputs and look-ups [lo - 1, hi + 1]; stride-2
        # conv outputs, and the floor quotients of taps that do not divide, [(lo - 1) // 2, (hi + 1) // 2].
        field_lo = min(2 * lo - 1, lo - 1, (lo - 1) // 2)
        field_hi = max(2 * hi + 1, hi + 1, (hi + 1) // 2)
        self.bias = -field_lo
        self.bits = max(1, (field_hi - field_lo).bit_length())
        self.member_bits = max(1, (batch_size - 1).bit_length())
        if 3 * self.bits + self.member_bits > 63:
            raise ValueError(f"coordinates in [{lo}, {hi}] with {batch_size} members do not fit in 63-bit keys")
        self.batch_size = batch_size
        self.member_shift = 3 * self.bits
        self.field_mask = (1 << self.bits) - 1
        self.field_shifts = torch.tensor([2 * self.bits, self.bits, 0], dtype=torch.int64, device=device)
        self.field_weights = torch.tensor([1 << (2 * self.bits), 1 << self.bits, 1], dtype=torch.int64, device=device)
        self.unit = (1 << (2 * self.bits)) + (1 << self.bits) + 1  # key offset of (1, 1, 1)
        self.member_ids = torch.arange(batch_size + 1, dtype=torch.int64, device=device)

    def pack(self, member: torch.Tensor, ijk: torch.Tensor) -> torch.Tensor:
        """Keys of coordinates ijk [..., 3] in members `member` (int64, broadcast against ijk[..., 0])."""
        fields = (ijk.to(torch.int64) + self.bias) << self.field_shifts
        return fields.sum(dim=-1) | (member << self.member_shift)

    def offset(self, delta: torch.Tensor) -> torch.Tensor:
        """int64 [T]: what adding the coordinate offsets delta [T, 3] does to a key."""
        return (delta.to(torch.int64) * self.field_weights).sum(dim=1)

    def members_of(self, keys: torch.Tensor) -> torch.Tensor:
        return keys >> self.member_shift

    def decode(self, keys: torch.Tensor) -> Grid:
        """The grid of sorted unique keys: int32 ijk and member offsets."""
        ijk = (((keys.unsqueeze(1) >> self.field_shifts) & self.field_mask) - self.bias).to(torch.int32)
        offsets = torch.searchsorted(self.members_of(keys), self.member_ids)
        return Grid(keys, ijk, offsets)


# ---- the operations ------------------------------------------------------------------------------


class TorchTopology:
    """sparsegrid's topology operations on one grid, written with torch ops on packed keys; cubic kernels
    with K in {1, 2, 3} and strides S in {1, 2} (the range KeyCodec's fields are sized for)."""

    def __init__(self, grid: Grid, codec: KeyCodec):
        self.grid = grid
        self.codec = codec
        self.member = codec.members_of(grid.keys)  # int64 [N], part of the input like grid.ijk
        device = grid.keys.device
        # Constant tables, built once: taps [T, 3] and their key offsets [T] per kernel size.
        self.taps = {kernel: tap_table(kernel, device) for kernel in (1, 2, 3)}
        self.tap_keys = {kernel: codec.offset(taps) for kernel, taps in self.taps.items()}

    def _check(self, kernel: int, stride: int) -> None:
        if kernel not in self.taps or stride not in (1, 2):
            raise ValueError(f"kernel {kernel}, stride {stride}: only K in 1..3 and S in 1..2 are supported")

    def conv_transpose_grid(self, kernel: int, stride: int) -> Grid:
        """{S*c + tap - pb : c in the grid, tap}."""
        self._check(kernel, stride)
        pb = (kernel - 1) // 2
        base = self.codec.pack(self.member, self.grid.ijk * stride - pb)
        candidates = base.unsqueeze(1) + self.tap_keys[kernel].unsqueeze(0)  # [N, T]
        return self.codec.decode(torch.unique(candidates.view(-1)))

    def conv_grid(self, kernel: int, stride: int) -> Grid:
        """{c : exists tap with S*c + tap - pb in the grid}, enumerated from the fine voxels."""
        self._check(kernel, stride)
        pb = (kernel - 1) // 2
        if stride == 1:  # every tap divides: c = f - tap + pb, a key offset
            shifts = pb * self.codec.unit - self.tap_keys[kernel]
            candidates = self.grid.keys.unsqueeze(1) + shifts.unsqueeze(0)
            return self.codec.decode(torch.unique(candidates.view(-1)))
        numerator = self.grid.ijk.unsqueeze(1) + (pb - self.taps[kernel]).unsqueeze(0)  # [N, T, 3]
        exact = (torch.remainder(numerator, stride) == 0).all(dim=2)        # [N, T]
        coarse = torch.div(numerator, stride, rounding_mode="floor")
        candidates = self.codec.pack(self.member.unsqueeze(1), coarse)[exact]
        return self.codec.decode(torch.unique(candidates))

    def neighbour_map(self, kernel: int) -> torch.Tensor:
        """Stride-1 map of the grid onto itself: int32 [N, K^3], map[v][t] = index of v + tap(t) - pb or -1."""
        self._check(kernel, 1)
        pb = (kernel - 1) // 2
        keys = self.grid.keys
        queries = keys.unsqueeze(1) + (self.tap_keys[kernel] - pb * self.codec.unit).unsqueeze(0)  # [N, T]
        if keys.numel() == 0:
            return torch.full(queries.shape, -1, dtype=torch.int32, device=keys.device)
        index = torch.searchsorted(keys, queries).clamp_(max=keys.numel() - 1)
        index.masked_fill_(keys[index] != queries, -1)
        return index.to(torch.int32)

    def transposed_plan(self, kernel: int, stride: int) -> Tuple[Grid, torch.Tensor]:
        """conv_transpose_grid(K, S) and its transposed-direction map int32 [N_fine, K^3]:
        map[f][t] = index of the coarse c with S*c + tap(t) - pb = f, -1 where there is none."""
        self._check(kernel, stride)
        pb = (kernel - 1) // 2
        num_taps = self.tap_keys[kernel].numel()
        base = self.codec.pack(self.member, self.grid.ijk * stride - pb)
        candidates = base.unsqueeze(1) + self.tap_keys[kernel].unsqueeze(0)  # [N, T]
        fine_keys, inverse = torch.unique(candidates.view(-1), return_inverse=True)
        device = fine_keys.device
        plan = torch.full((fine_keys.numel(), num_taps), -1, dtype=torch.int32, device=device)
        coarse_index = torch.arange(base.numel(), dtype=torch.int32, device=device).unsqueeze(1)
        tap_index = torch.arange(num_taps, device=device).unsqueeze(0)
        plan[inverse.view(candidates.shape), tap_index] = coarse_index.expand(candidates.shape)
        return self.codec.decode(fine_keys), plan


# ---- timing --------------------------------------------------------------------------------------


class Row(NamedTuple):
    operation: str
    output_voxels: int
    median_ms: float
    min_ms: float


def measure(run: Callable[[], int], device: torch.device, warmup: int, repeats: int) -> Tuple[int, float, float]:
    """Output size, median and min ms of `repeats` runs after `warmup` runs."""
    output = 0
    for _ in range(warmup):
        output = run()
    samples = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        for _ in range(repeats):
            start.record()
            output = run()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop))
    else:
        for _ in range(repeats):
            begin = time.perf_counter()
            output = run()
            samples.append((time.perf_counter() - begin) * 1e3)
    return output, statistics.median(samples), min(samples)


def benchmark(topology: TorchTopology, device: torch.device, warmup: int, repeats: int) -> List[Row]:
    cases = [
        ("conv_transpose_grid(2,2)", lambda: topology.conv_transpose_grid(2, 2).keys.numel()),
        ("conv_grid(2,2)", lambda: topology.conv_grid(2, 2).keys.numel()),
        ("conv_grid(3,2)", lambda: topology.conv_grid(3, 2).keys.numel()),
        ("conv_grid(3,1)", lambda: topology.conv_grid(3, 1).keys.numel()),
        ("neighbour_map k3s1", lambda: topology.neighbour_map(3).shape[0]),
        ("transposed plan k2s2 (grid + map)", lambda: topology.transposed_plan(2, 2)[1].shape[0]),
    ]
    rows = []
    with torch.no_grad():
        for name, run in cases:
            output, median_ms, min_ms = measure(run, device, warmup, repeats)
            rows.append(Row(name, int(output), median_ms, min_ms))
    return rows


# ---- reporting -----------------------------------------------------------------------------------


def print_table(rows: List[Row]) -> None:
    table = [["operation", "output voxels", "median ms", "min ms"]]
    table += [[r.operation, str(r.output_voxels), f"{r.median_ms:.3f}", f"{r.min_ms:.3f}"] for r in rows]
    widths = [max(len(line[c]) for line in table) for c in range(len(table[0]))]
    for n, line in enumerate(table):
        cells = [line[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(line[1:], widths[1:])]
        print(" | ".join(cells))
        if n == 0:
            print("-|-".join("-" * w for w in widths))


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads)"


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="reference batch file (data/README.md format)")
    parser.add_argument("--members", type=int, default=None, help="use the first N members (default: all)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="default: cuda when available, else cpu")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    try:
        ijk_host, offsets = read_batch(args.input, args.members)
    except (OSError, ValueError) as error:
        print(f"torch_baseline: {error}", file=sys.stderr)
        return 2
    members = len(offsets) - 1
    member_host = torch.repeat_interleave(
        torch.arange(members, dtype=torch.int64), torch.tensor(offsets[1:]) - torch.tensor(offsets[:-1]))

    # The input grid (untimed): sorted unique keys of the file's voxels.
    codec = KeyCodec(ijk_host, members, device)
    input_keys = codec.pack(member_host.to(device), ijk_host.to(device))
    grid = codec.decode(torch.unique(input_keys))
    topology = TorchTopology(grid, codec)

    print(f"torch-native topology baseline (torch {torch.__version__})")
    print(f"batch:   first {members} members of {args.input}")
    print(f"voxels:  {ijk_host.shape[0]} input voxels, {grid.keys.numel()} in the grid")
    print(f"device:  {device_description(device)}")
    print(f"keys:    member << {codec.member_shift} | 3 x {codec.bits}-bit fields, bias {codec.bias}")
    print(f"timing:  median and min of {args.repeats} runs after {args.warmup} warm-up runs "
          f"({'CUDA events' if device.type == 'cuda' else 'time.perf_counter'})\n")

    rows = benchmark(topology, device, args.warmup, args.repeats)
    print_table(rows)
    if args.json:
        result = {
            "device": args.device,
            "device_name": device_description(device),
            "torch": torch.__version__,
            "input": args.input,
            "members": members,
            "voxels": int(grid.keys.numel()),
            "repeats": args.repeats,
            "warmup": args.warmup,
            "rows": [r._asdict() for r in rows],
        }
        with open(args.json, "w") as file:
            json.dump(result, file, indent=2)
            file.write("\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
