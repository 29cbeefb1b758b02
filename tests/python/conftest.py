"""The suite imports python/sparsegrid from the source tree, whatever the collection order and with or
without PYTHONPATH; SPARSEGRID_TORCH_LIBRARY (or the build directories) gives the compiled layer."""

import pathlib
import sys

_PACKAGE_ROOT = str(pathlib.Path(__file__).resolve().parents[2] / "python")
if _PACKAGE_ROOT not in sys.path:
    sys.path.insert(0, _PACKAGE_ROOT)
