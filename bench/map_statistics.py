#!/usr/bin/env python3
"""Statistics of the k3s1 neighbour map of a voxel batch that decide how a convolution kernel should group
its rows, computed on the CPU with numpy alone (no build needed).

For blocks of BM consecutive rows in a given row order it prints
- the tap efficiency: edges / (sum over blocks of BM x the taps any row of the block has), the share of
  the tensor-core work of an output-stationary kernel that skips absent taps block by block which is
  not multiplication by zero rows;
- the active taps per block;
- the unique source rows per block (mean, 95th percentile and largest) against its edges: how many input
  rows a block would load if it loaded each source row once (a "halo" in shared memory) instead of once
  per edge; a halo's shared memory must hold the largest.

Row orders: voxel order (lexicographic keys), sorted by tap set (the plans' row order), the tap-set sort
within superblocks of S voxel-order rows, and the tap sets in reflected Gray code order.

Usage: bench/map_statistics.py [--input data/reference_batch_r64.txt] [--members 16]"""

import argparse
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def read_batch(path, members):
    lines = pathlib.Path(path).read_text().split("\n")
    offsets = [int(v) for v in lines[1].split()]
    count = offsets[members]
    ijk = np.array([[int(v) for v in line.split()] for line in lines[2:2 + count]], dtype=np.int64)
    member = np.zeros(count, dtype=np.int64)
    for m in range(members):
        member[offsets[m]:offsets[m + 1]] = m
    return ijk, member


def neighbour_map(ijk, member):
    """[N, 27] source row of each tap (-1 where absent), rows and sources in voxel (sorted key) order."""
    lo = ijk.min(0) - 1
    span = ijk.max(0) - lo + 2
    def key(c):
        c = c - lo
        return ((member * span[0] + c[:, 0]) * span[1] + c[:, 1]) * span[2] + c[:, 2]
    order = np.argsort(key(ijk), kind="stable")
    ijk, member = ijk[order], member[order]
    keys = key(ijk)
    out = np.full((len(ijk), 27), -1, dtype=np.int64)
    tap = 0
    for di in (-1, 0, 1):
        for dj in (-1, 0, 1):
            for dk in (-1, 0, 1):
                query = key(ijk + np.array([di, dj, dk]))
                position = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
                hit = keys[position] == query
                out[hit, tap] = position[hit]
                tap += 1
    return out


def statistics(neighbours, masks, perm, block):
    """Tap efficiency, and per block the mean active taps, the mean, 95th percentile and largest
    number of unique source rows (a halo must hold the largest), and the mean edges."""
    edges = int((neighbours >= 0).sum())
    active_total = blocks = 0
    unique = []
    for start in range(0, len(perm), block):
        rows = perm[start:start + block]
        active_total += bin(int(np.bitwise_or.reduce(masks[rows]))).count("1")
        sources = neighbours[rows].ravel()
        unique.append(len(np.unique(sources[sources >= 0])))
        blocks += 1
    unique = np.array(unique)
    return (edges / (active_total * block), active_total / blocks, unique.mean(), np.percentile(unique, 95),
            unique.max(), edges / blocks)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", default=str(ROOT / "data/reference_batch_r64.txt"))
    parser.add_argument("--members", type=int, default=16)
    args = parser.parse_args()
    ijk, member = read_batch(args.input, args.members)
    neighbours = neighbour_map(ijk, member)
    masks = ((neighbours >= 0).astype(np.int64) << np.arange(27)).sum(1)
    rows = len(ijk)
    print(f"{rows} voxels, {int((neighbours >= 0).sum())} k3s1 edges")
    voxel = np.arange(rows)
    by_taps = np.argsort(masks, kind="stable")
    gray_inverse = masks.copy()
    shift = masks >> 1
    while shift.any():
        gray_inverse ^= shift
        shift >>= 1
    orders = [("voxel order", voxel), ("sorted by tap set", by_taps),
              ("tap sets in Gray order", np.argsort(gray_inverse, kind="stable"))]
    for superblock in (1024, 4096):
        perm = np.concatenate([start + np.argsort(masks[start:start + superblock], kind="stable")
                               for start in range(0, rows, superblock)])
        orders.append((f"sorted within {superblock} rows", perm))
    print(f"{'order':28} {'BM':>4} {'tap efficiency':>15} {'active taps':>12} {'unique sources':>15} "
          f"{'p95':>5} {'max':>5} {'edges':>7}")
    for name, perm in orders:
        for block in (64, 128, 256):
            efficiency, active, unique, p95, largest, edges = statistics(neighbours, masks, perm, block)
            print(f"{name:28} {block:>4} {efficiency:>15.3f} {active:>12.1f} {unique:>15.0f} {p95:>5.0f} "
                  f"{largest:>5} {edges:>7.0f}")


if __name__ == "__main__":
    main()
