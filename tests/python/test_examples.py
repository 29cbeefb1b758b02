"""The training example runs end to end, in one process and with DDP over 2 gloo processes."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_example(*args, script="vae.py"):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    result = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_vae_trains_and_writes_figures(tmp_path):
    out = run_example("--iterations", "4", "--print-every", "2", "--batch", "2", "--shapes", "4",
                      "--output", str(tmp_path))
    assert "iteration     4" in out and "reconstruction IoU" in out
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert (tmp_path / "reconstructions.png").stat().st_size > 0


def test_vae_data_parallel_keeps_replicas_identical():
    out = run_example("--iterations", "3", "--print-every", "3", "--batch", "2", "--shapes", "4",
                      "--world-size", "2")
    assert "parameters identical on all 2 ranks: yes" in out


def test_completion_trains_and_writes_figures(tmp_path):
    out = run_example("--iterations", "3", "--print-every", "3", "--batch", "2", "--shapes", "4",
                      "--output", str(tmp_path), script="completion.py")
    assert "IoU with the full shapes" in out
    assert (tmp_path / "completions.png").stat().st_size > 0
