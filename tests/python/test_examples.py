"""The training examples and the training-step benchmark run end to end, in one process and with DDP
over 2 processes (gloo on the CPU; NCCL when 2 GPUs are present), on the CPU and, when torch sees a GPU
and the library has its CUDA backend (or SPARSEGRID_REQUIRE_CUDA=1 demands it), on CUDA."""

import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import completion  # noqa: E402
import sparsegrid as sg  # noqa: E402
import vae  # noqa: E402

CUDA = torch.cuda.is_available() and sg.cuda_backend_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA or os.environ.get("SPARSEGRID_REQUIRE_CUDA") == "1" else [])


def run_script(path, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    result = subprocess.run([sys.executable, str(ROOT / path), *args], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def run_example(*args, script="vae.py"):
    return run_script(pathlib.Path("examples") / script, *args)


@pytest.mark.parametrize("device", DEVICES)
def test_vae_trains_and_writes_figures(tmp_path, device):
    out = run_example("--device", device, "--iterations", "4", "--print-every", "2", "--batch", "2", "--shapes", "4",
                      "--held-out", "3", "--output", str(tmp_path))
    assert f"shape VAE on {device}" in out
    assert "iteration     4/4" in out and "topology+plans" in out and "reconstruction IoU" in out
    assert "held-out reconstruction (3 procedural shapes of another seed, 1 meshes turned a quarter turn)" in out
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert (tmp_path / "reconstructions.png").stat().st_size > 0
    assert (tmp_path / "held_out.png").stat().st_size > 0


def test_evaluation_helpers():
    one = sg.GridBatch.from_ijk([torch.tensor([[0, 0, 0]]), torch.tensor([[1, 1, 1], [2, 1, 1]])])
    other = sg.GridBatch.from_ijk([torch.tensor([[3, 4, 0]]), torch.tensor([[1, 1, 1], [2, 1, 1]])])
    assert vae.chamfer(one, other).tolist() == [10.0, 0.0]  # 5 voxels each way; identical
    empty = sg.GridBatch.from_ijk([torch.zeros(0, 3, dtype=torch.int32), torch.tensor([[0, 0, 0]])])
    distances = vae.chamfer(empty, sg.GridBatch.from_ijk([torch.tensor([[0, 0, 0]])] * 2))
    assert distances[0] == float("inf") and distances[1] == 0.0
    assert "1 of 2 predictions empty" in vae.chamfer_summary(distances)
    shape = sg.synthetic_shapes(1, 16, seed=2)[0]
    turned = vae.rotated(shape, 1)
    assert not torch.equal(turned, shape - shape.min(0).values + 1)
    back = vae.rotated(turned, 3)
    assert set(map(tuple, back.tolist())) == set(map(tuple, (shape - shape.min(0).values + 1).tolist()))
    generator = torch.Generator().manual_seed(1)
    for _ in range(8):
        copy = vae.symmetric_copy(shape, 16, generator)
        assert copy.dtype == shape.dtype and copy.shape == shape.shape
        assert int(copy.min()) >= 0 and int(copy.max()) < 16
        # A symmetry of the cube: the extents are permuted and the distance between any two voxels kept.
        extent = lambda t: sorted((t.max(0).values - t.min(0).values).tolist())
        assert extent(copy) == extent(shape)
        assert torch.equal(torch.cdist(copy.double(), copy.double()), torch.cdist(shape.double(), shape.double()))
    image = vae.shaded_image(shape, shape.min(0).values, 16, scale=3)
    assert image.shape == (48, 48, 3) and image.min() >= 0.0 and image.max() <= 1.0
    assert (image == 1.0).all(axis=-1).any() and (image < 1.0).any()  # background and lit voxels


def test_vae_data_parallel_keeps_replicas_identical():
    out = run_example("--device", "cpu", "--iterations", "3", "--print-every", "3", "--batch", "2", "--shapes", "4",
                      "--world-size", "2")
    assert "gloo" in out
    assert "parameters identical on all 2 ranks: yes" in out
    assert "shapes/s (batch 2 x 2 processes" in out


@pytest.mark.skipif(not CUDA or torch.cuda.device_count() < 2, reason="needs 2 GPUs and the CUDA backend")
def test_vae_data_parallel_on_two_gpus_uses_nccl():
    out = run_example("--device", "cuda", "--iterations", "3", "--print-every", "3", "--batch", "2", "--shapes", "4",
                      "--world-size", "2")
    assert "nccl" in out
    assert "parameters identical on all 2 ranks: yes" in out


@pytest.mark.parametrize("device", DEVICES)
def test_completion_trains_and_writes_figures(tmp_path, device):
    out = run_example("--device", device, "--iterations", "3", "--print-every", "3", "--batch", "2", "--shapes", "4",
                      "--held-out", "3", "--output", str(tmp_path), script="completion.py")
    assert f"shape completion on {device}" in out
    assert "IoU with the full shapes" in out and "held-out (3 shapes of another seed)" in out
    assert (tmp_path / "completions.png").stat().st_size > 0


def test_step_profiler_counts_forward_and_backward_convolutions():
    # On the CPU every call is synchronous and each span encloses the library's own timed region, so the
    # spans' convolution time is at least the library's counter, which includes the backward passes.
    args = vae.parse_args(["--device", "cpu", "--resolution", "16", "--batch", "2"])
    encoder, decoder = vae.build_model(args, torch.device("cpu"))
    optimizer = torch.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()))
    target = sg.GridBatch.from_ijk(sg.synthetic_shapes(2, 16, seed=3))
    original_execute = sg.ConvolutionPlan.execute
    profiler = vae.StepProfiler("cpu").install()
    try:
        profiler.collect()
        before = sg.convolution_seconds()
        for _ in range(2):
            vae.vae_step(encoder, decoder, optimizer, target, args.kl_weight, profiler)
        counted = sg.convolution_seconds() - before
        seconds = profiler.collect()
    finally:
        profiler.uninstall()
    assert seconds["convolutions"] >= counted > 0
    assert all(seconds[category] > 0 for category in ("grids", "plans", "pruning", "labels", "pyramid"))
    assert sg.ConvolutionPlan.execute is original_execute


def test_vae_autocast_is_cuda_only_and_can_be_turned_off():
    with pytest.raises(SystemExit, match="--autocast bfloat16 needs --device cuda.*--autocast none"):
        vae.parse_args(["--device", "cpu", "--autocast", "bfloat16"])
    assert vae.parse_args(["--device", "cpu", "--autocast", "none"]).autocast is None
    assert vae.parse_args(["--device", "cpu"]).autocast is None


@pytest.mark.skipif(not (CUDA or os.environ.get("SPARSEGRID_REQUIRE_CUDA") == "1"), reason="needs CUDA")
def test_vae_trains_in_bfloat16_autocast():
    out = run_example("--device", "cuda", "--iterations", "3", "--print-every", "3", "--batch", "2", "--shapes", "4",
                      "--held-out", "2", "--autocast", "bfloat16")
    assert "bfloat16 autocast" in out and "held-out reconstruction" in out


def test_completion_autocast_is_cuda_only():
    with pytest.raises(SystemExit, match="--autocast bfloat16 needs --device cuda.*--autocast none"):
        completion.main(["--device", "cpu", "--autocast", "bfloat16"])


@pytest.mark.skipif(not (CUDA or os.environ.get("SPARSEGRID_REQUIRE_CUDA") == "1"), reason="needs CUDA")
def test_completion_trains_in_bfloat16_autocast():
    out = run_example("--device", "cuda", "--iterations", "3", "--print-every", "3", "--batch", "2", "--shapes", "4",
                      "--held-out", "2", "--autocast", "bfloat16", script="completion.py")
    assert "bfloat16 autocast" in out and "IoU with the full shapes" in out


@pytest.mark.parametrize("device", DEVICES)
def test_train_step_benchmark_writes_table_and_json(tmp_path, device):
    path = tmp_path / "train_step.json"
    out = run_script("bench/train_step.py", "--device", device, "--resolution", "16", "--batch", "2", "3",
                     "--iterations", "2", "--warmup", "1", "--profile-iterations", "2", "--json", str(path),
                     "--host-profile", str(tmp_path / "host"))
    assert "| batch | input voxels |" in out and "| host ms |" in out
    rows = json.loads(path.read_text())["rows"]
    assert [row["batch"] for row in rows] == [2, 3]
    for batch in (2, 3):
        assert "self cpu" in (tmp_path / "host" / f"b{batch}_operators.txt").read_text().lower()
        assert "function calls" in (tmp_path / "host" / f"b{batch}_python.txt").read_text()
        if device == "cuda":
            assert "launches per step" in (tmp_path / "host" / f"b{batch}_kernels.txt").read_text()
    for row in rows:
        assert row["step_ms"] > 0 and row["convolution_ms"] > 0 and row["rest_ms"] >= 0
        assert 0 < row["host_ms"] <= row["step_ms"]  # per step the call returns before the closing sync
        assert row["topology_ms"] > 0 and row["plans_ms"] > 0 and row["pyramid_ms"] > 0
        assert 0 < row["topology_fraction"] < 1
        if device == "cuda":
            assert 0 < row["gpu_busy"] <= 1 and row["kernels_per_step"] > 0
            assert row["torch_syncs_per_step"] == 0  # Prune gathers by index (no boolean indexing)
        else:
            assert row["torch_syncs_per_step"] is None


@pytest.mark.skipif(not (CUDA or os.environ.get("SPARSEGRID_REQUIRE_CUDA") == "1"), reason="needs CUDA")
def test_torch_sync_count_sees_waits_and_only_waits():
    # The train-step benchmark's "torch syncs" column: a boolean index waits once, an elementwise op not
    # at all (setting the debug mode warns too, and must not count).
    sys.path.insert(0, str(ROOT / "bench"))
    import train_step
    x = torch.arange(8, device="cuda")
    assert train_step.torch_syncs(lambda: x + 1) == 0
    assert train_step.torch_syncs(lambda: x[x > 3]) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_conv_benchmark_writes_table_and_json(tmp_path, device):
    path = tmp_path / "conv.json"
    out = run_script("bench/conv_bench.py", "--device", device, "--members", "2", "--channels", "8",
                     "--repeats", "1", "--warmup", "1", "--json", str(path))
    assert "| k3s1 submanifold | 8 | forward |" in out and "host overhead per layer" in out
    result = json.loads(path.read_text())
    assert [(row["layer"], row["pass"]) for row in result["rows"]] == [
        ("k3s1 submanifold", "forward"), ("k3s1 submanifold", "forward+backward"),
        ("k2s2 transposed", "forward"), ("k2s2 transposed", "forward+backward")]
    assert all(row["sparsegrid_ms"] > 0 and row["gemm_ms"] > 0 and row["edges"] > 0 for row in result["rows"])
    parts = result["host_overhead_parts"]
    assert result["host_overhead_us"] == parts["plan + execute (the layer)"] > 0
    assert parts["plan only"] > 0 and parts["execute only (existing plan)"] > 0
    assert parts["input gradient pass"] > 0 and parts["weight gradient pass"] > 0
    assert parts["SparseConv3d layer (weight requiring grad)"] > 0 and parts["SparseConv3d layer, no grad"] > 0
    if device == "cuda":
        assert parts["device launches per layer"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_conv_benchmark_times_each_pass(tmp_path, device):
    path = tmp_path / "passes.json"
    out = run_script("bench/conv_bench.py", "--device", device, "--members", "2", "--channels", "8", "16",
                     "--repeats", "1", "--warmup", "1", "--passes", "--no-baselines", "--no-host-overhead",
                     "--json", str(path))
    assert "| k3s1 submanifold | 8 | weight gradient |" in out and "host overhead" not in out
    rows = json.loads(path.read_text())["rows"]
    passes = ["forward", "input gradient", "weight gradient", "forward+backward"]
    assert [(row["layer"], row["channels"], row["pass"]) for row in rows] == [
        (layer, c, p) for c in (8, 16) for layer in ("k3s1 submanifold", "k2s2 transposed") for p in passes]
    for row in rows:
        assert row["sparsegrid_ms"] > 0 and row["gemm_ms"] > 0 and row["tflops"] > 0 and row["peak_fraction"] > 0


@pytest.mark.skipif(not (CUDA or os.environ.get("SPARSEGRID_REQUIRE_CUDA") == "1"), reason="needs CUDA")
def test_vae_step_synchronises_once_for_its_fixed_grids_and_once_per_prune():
    # The encoder's levels and the decoder's targets come from one pyramid call (1 host synchronisation),
    # the seed grid and its plans are kept from the first step, and each decoder level but the last
    # prunes (1 each): nothing else in a step waits for the GPU.
    device = torch.device("cuda")
    args = vae.parse_args(["--device", "cuda", "--resolution", "32", "--batch", "4"])
    encoder, decoder = vae.build_model(args, device)
    optimizer = vae.make_optimizer(list(encoder.parameters()) + list(decoder.parameters()), args.lr, device)
    target = sg.GridBatch.from_ijk(sg.synthetic_shapes(4, 32, seed=3, device=device))
    profiler = vae.StepProfiler("cuda", enabled=False)
    vae.vae_step(encoder, decoder, optimizer, target, args.kl_weight, profiler)  # builds the seed grid
    for keep_targets in (True, False):
        before = sg.host_synchronizations()
        vae.vae_step(encoder, decoder, optimizer, target, args.kl_weight, profiler, keep_targets=keep_targets)
        assert sg.host_synchronizations() - before == 1 + (vae.LEVELS - 1), f"keep_targets={keep_targets}"
    # And torch's own operations in the step wait for nothing (Prune gathers its rows by index, not by
    # boolean indexing): torch.cuda.set_sync_debug_mode("warn") warns at each such wait (and once when
    # the mode is set, a warning that is not a wait).
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            vae.vae_step(encoder, decoder, optimizer, target, args.kl_weight, profiler)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    waits = [str(w.message) for w in caught if "called a synchronizing CUDA operation" in str(w.message)]
    assert not waits, waits
