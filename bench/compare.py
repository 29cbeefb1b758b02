#!/usr/bin/env python3
"""Side-by-side table of `sparsegrid bench` and the torch-native baseline (bench/torch_baseline.py).

Each --pair names the C++ benchmark's JSON (`sparsegrid bench --json`) and torch_baseline.py's JSON for
the same batch; give one pair per batch size (16, 32, 48). For every operation both measured, it prints a
markdown row: both medians, their ratio (torch / sparsegrid: how many times faster sparsegrid is),
whether both produced the same number of output voxels, sparsegrid's host syncs and peak memory, and, on
the batch-16 workload, whether sparsegrid's median meets its target.

Usage:
    python3 bench/compare.py --pair cpp16.json torch16.json --pair cpp32.json torch32.json ...

Exit status: 0, or 1 when an operation's output voxel counts differ between the two.
"""

import argparse
import json
import sys
from typing import Dict, List, Optional, Tuple

# The rows torch_baseline.py measures, in its order (the names `sparsegrid bench` uses).
OPERATIONS = [
    "conv_transpose_grid(2,2)",
    "conv_grid(2,2)",
    "conv_grid(3,2)",
    "conv_grid(3,1)",
    "neighbour_map k3s1",
    "transposed plan k2s2 (grid + map)",
]

# Targets for sparsegrid's median on the batch-16 reference workload, in ms.
TARGET_BATCH = 16
TARGETS_MS = {
    "conv_transpose_grid(2,2)": 0.03,
    "conv_grid(2,2)": 0.03,
    "conv_grid(3,1)": 0.15,
    "conv_grid(3,2)": 0.10,
    "neighbour_map k3s1": 0.04,
    "transposed plan k2s2 (grid + map)": 0.06,
}


def load(path: str) -> dict:
    with open(path) as file:
        return json.load(file)


def rows_by_operation(report: dict) -> Dict[str, dict]:
    return {row["operation"]: row for row in report.get("rows", [])}


def ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def compare_pair(cpp: dict, torch: dict) -> Tuple[List[str], bool]:
    """Markdown lines for one batch, and whether every output voxel count agrees."""
    batch = torch.get("members", cpp.get("batch_size"))
    lines = [f"### Batch {batch}: {torch.get('voxels', '?')} voxels; "
             f"sparsegrid on {cpp.get('device', '?')}, torch on {torch.get('device_name', torch.get('device', '?'))}",
             ""]
    if cpp.get("batch_size") != torch.get("members") or cpp.get("grid_voxels") != torch.get("voxels"):
        lines += [f"**Warning: different batches** — sparsegrid {cpp.get('batch_size')} members / "
                  f"{cpp.get('grid_voxels')} voxels, torch {torch.get('members')} members / "
                  f"{torch.get('voxels')} voxels.", ""]
    with_targets = batch == TARGET_BATCH
    header = ["operation", "sparsegrid ms", "torch-native ms", "ratio (torch/sparsegrid)",
              "output voxels equal?", "syncs", "peak MB"]
    if with_targets:
        header.append(f"target (batch {TARGET_BATCH})")
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]

    cpp_rows, torch_rows = rows_by_operation(cpp), rows_by_operation(torch)
    names = [name for name in OPERATIONS if name in cpp_rows or name in torch_rows]
    names += [name for name in torch_rows if name not in names]
    all_equal = True
    for name in names:
        c, t = cpp_rows.get(name), torch_rows.get(name)
        c_ms = c["median_ms"] if c else None
        t_ms = t["median_ms"] if t else None
        ratio = f"{t_ms / c_ms:.1f}x" if c_ms and t_ms is not None else "-"
        if c and t:
            equal = c["output_voxels"] == t["output_voxels"]
            all_equal &= equal
            voxels = f"yes ({c['output_voxels']})" if equal else \
                f"**NO** ({c['output_voxels']} vs {t['output_voxels']})"
        else:
            voxels = "-"
        cells = [name, ms(c_ms), ms(t_ms), ratio, voxels,
                 str(c["host_syncs"]) if c else "-",
                 f"{c['peak_bytes'] / 1e6:.2f}" if c else "-"]
        if with_targets:
            target = TARGETS_MS.get(name)
            if target is None or c_ms is None:
                cells.append("-")
            else:
                cells.append(f"<= {target:.2f}: {'met' if c_ms <= target else '**missed**'}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines, all_equal


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", nargs=2, action="append", required=True, metavar=("CPP.json", "TORCH.json"),
                        help="sparsegrid bench JSON and torch_baseline.py JSON of one batch (repeatable)")
    args = parser.parse_args(argv)
    try:
        pairs = [(load(cpp_path), load(torch_path)) for cpp_path, torch_path in args.pair]
    except (OSError, ValueError) as error:
        print(f"compare: {error}", file=sys.stderr)
        return 2
    all_equal = True
    for n, (cpp, torch) in enumerate(pairs):
        lines, equal = compare_pair(cpp, torch)
        all_equal &= equal
        print(("\n" if n else "") + "\n".join(lines))
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
