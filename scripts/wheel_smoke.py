"""Run by the installed wheel's interpreter (scripts/gpu-check.sh, phase wheel): sparsegrid must come from
the installed package, with its compiled layer beside it and no environment variable, and convolve on
CUDA when torch sees a GPU (on the CPU otherwise)."""

import os
import sys

import torch

import sparsegrid as sg

print(f"sparsegrid from {sg.__file__}, layer {sg.library_path}")
package_dir = os.path.dirname(os.path.abspath(sg.__file__))
if not package_dir.startswith(os.path.abspath(sys.prefix) + os.sep):
    sys.exit(f"sparsegrid was not imported from the environment at {sys.prefix}")
if not os.path.abspath(sg.library_path).startswith(package_dir + os.sep):
    sys.exit("the layer was not loaded from the installed package")
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.float16 if device == "cuda" else torch.float32
grid = sg.GridBatch.from_ijk(sg.synthetic_shapes(2, 16), device=device)
plan = sg.ConvolutionPlan.from_grid(grid, 3, 1, grid)
x = torch.randn(grid.num_voxels, 8, device=device, dtype=dtype)
w = torch.randn(8, 8, 3, 3, 3, device=device, dtype=dtype)
y = plan.execute(x, w)
reference = sg.ConvolutionPlan.from_grid(grid.cpu(), 3, 1, grid.cpu()).execute(x.cpu().double(), w.cpu().double())
error = float((y.cpu().double() - reference).norm() / reference.norm())
print(f"convolution on {device}: {tuple(y.shape)}, relative error against float64 on the CPU {error:.1e}")
if not error < 1e-2:
    sys.exit("the installed wheel's convolution is wrong")
