#!/usr/bin/env bash
# Stages in .device/ (ignored by git, carried to a GPU machine with `carry: [".device"]`) what
# scripts/gpu-check.sh can use there: GoogleTest from this machine's Debian packages (.device/gtest,
# for a GPU machine without it) and, with a commit argument, that commit's tree as
# .device/baseline.tar.gz for the `baseline` phase (SPARSEGRID_BASELINE=.device/baseline.tar.gz).
# Usage: scripts/stage-device.sh [BASELINE_COMMIT]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
stage="$root/.device"
mkdir -p "$stage/gtest/include" "$stage/gtest/lib"
cp -r /usr/include/gtest /usr/include/gmock "$stage/gtest/include/"
multiarch=$(gcc -print-multiarch)
mkdir -p "$stage/gtest/lib/$multiarch/cmake"
cp /usr/lib/"$multiarch"/libgtest*.a /usr/lib/"$multiarch"/libgmock*.a "$stage/gtest/lib/$multiarch/"
cp -r /usr/lib/"$multiarch"/cmake/GTest "$stage/gtest/lib/$multiarch/cmake/"
if [ $# -gt 0 ]; then
  git -C "$root" archive -o "$stage/baseline.tar.gz" "$1"
  echo "staged $1 as .device/baseline.tar.gz"
fi
du -sh "$stage"
