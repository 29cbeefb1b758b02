#!/usr/bin/env python3
"""The mesh-loading fuzz campaign: every seed file of a corpus, and mutations of it (truncations, bit
flips, overwritten header bytes, appended garbage, an empty file), is loaded by `sparsegrid mesh FILE`
in a child process of its own. A file must either load (exit 0) or be refused with an error that names
it (exit 1); a signal, a timeout or any other exit is a crash. Prints the counts per outcome and per
extension, lists every crash, and exits 1 when there was one.

Usage: scripts/mesh-fuzz.py --tool build/test/tools/sparsegrid [--corpus DIR]... [--mutations N]
       [--seed S] [--limit N] [--timeout SECONDS] [--keep DIR]
The default corpus is Debian's assimp-testmodels (/usr/share/assimp/models) plus data/bunny.ply."""

import argparse
import collections
import os
import pathlib
import random
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def seed_files(corpora, limit):
    files = []
    for corpus in corpora:
        path = pathlib.Path(corpus)
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return files[:limit] if limit else files


def mutations(data, rng, count):
    """(name, bytes) mutants of one file's bytes, chosen by `rng`."""
    out = [("empty", b"")]
    for n in range(count):
        kind = ("truncate", "bitflip", "header", "append")[n % 4]
        buf = bytearray(data)
        if kind == "truncate" and buf:
            buf = buf[:rng.randrange(len(buf))]
        elif kind == "bitflip" and buf:
            for _ in range(1 + len(buf) // 512):
                i = rng.randrange(len(buf))
                buf[i] ^= 1 << rng.randrange(8)
        elif kind == "header" and buf:
            # Counts and sizes live near the start of most formats: overwrite bytes there with extremes.
            for _ in range(4):
                i = rng.randrange(min(len(buf), 256))
                buf[i] = rng.choice((0x00, 0x7F, 0x80, 0xFF, ord("9"), ord("-")))
        else:
            buf += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        out.append((f"{kind}{n}", bytes(buf)))
    return out


def run(tool, path, timeout):
    try:
        result = subprocess.run([tool, "mesh", str(path)], capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "crashed", f"timeout after {timeout} s"
    text = (result.stdout + result.stderr).decode(errors="replace").strip()
    if result.returncode == 0:
        return "loaded", text
    if result.returncode == 1 and str(path) in text and "error:" in text:
        return "refused", text
    return "crashed", f"exit {result.returncode}: {text[-300:]}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool", default=str(ROOT / "build/test/tools/sparsegrid"))
    parser.add_argument("--corpus", action="append")
    parser.add_argument("--mutations", type=int, default=4, help="mutants per seed file (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0, help="at most this many seed files (default all)")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--keep", help="copy every crashing input into this folder")
    args = parser.parse_args()
    corpora = args.corpus or ["/usr/share/assimp/models", str(ROOT / "data/bunny.ply")]
    files = seed_files(corpora, args.limit)
    if not files:
        sys.exit(f"mesh-fuzz: no seed files in {corpora}")
    rng = random.Random(args.seed)
    counts = collections.Counter()
    by_extension = collections.defaultdict(collections.Counter)
    crashes = []
    with tempfile.TemporaryDirectory() as scratch:
        for seed_file in files:
            extension = seed_file.suffix.lower() or "(none)"
            inputs = [(seed_file, "seed")]
            for name, data in mutations(seed_file.read_bytes(), rng, args.mutations):
                mutant = pathlib.Path(scratch) / f"{seed_file.stem}.{name}{seed_file.suffix}"
                mutant.write_bytes(data)
                inputs.append((mutant, name))
            for path, name in inputs:
                outcome, detail = run(args.tool, path, args.timeout)
                counts[outcome] += 1
                by_extension[extension][outcome] += 1
                if outcome == "crashed":
                    crashes.append(f"{seed_file} [{name}]: {detail}")
                    if args.keep:
                        os.makedirs(args.keep, exist_ok=True)
                        keep = pathlib.Path(args.keep) / f"{len(crashes):04d}_{path.name}"
                        keep.write_bytes(path.read_bytes())
    total = sum(counts.values())
    print(f"mesh-fuzz: {len(files)} seed files, {total} files tried: {counts['loaded']} loaded, "
          f"{counts['refused']} refused, {counts['crashed']} crashed (seed {args.seed}, {args.mutations} mutants each)")
    print("extension  loaded  refused  crashed")
    for extension, c in sorted(by_extension.items(), key=lambda item: -sum(item[1].values())):
        print(f"{extension:9} {c['loaded']:7} {c['refused']:8} {c['crashed']:8}")
    for line in crashes:
        print("CRASH", line)
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
