"""Grids survive pickle, torch.save / torch.load (with map_location), copy.deepcopy and data-loader
workers: the same voxels in the same order, offsets, transforms and device, and everything built on them
afterwards equal. Plans refuse pickling with a clear error. On CPU, and on CUDA where present."""

import copy
import io
import pickle

import pytest
import torch

import sparsegrid as sg

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and sg.cuda_backend_available() else [])


def sample_grid(device):
    members = sg.synthetic_shapes(3, 12, seed=7)
    members.insert(1, torch.zeros(0, 3, dtype=torch.int32))  # an empty member keeps its place
    return sg.GridBatch.from_ijk(members, voxel_sizes=[[0.5, 0.25, 1.0], [1, 1, 1], [2, 2, 2], [1, 2, 3]],
                                 origins=[[1.0, -2.0, 0.5], [0, 0, 0], [0, 0, 0.25], [-1, -1, -1]], device=device)


def assert_same_grid(a, b):
    assert a.device == b.device
    assert a.batch_size == b.batch_size and a.num_voxels == b.num_voxels
    assert torch.equal(a.ijk.cpu(), b.ijk.cpu())
    assert torch.equal(a.joffsets.cpu(), b.joffsets.cpu())
    assert torch.equal(a.voxel_sizes.cpu(), b.voxel_sizes.cpu())
    assert torch.equal(a.origins.cpu(), b.origins.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_pickle_round_trip(device):
    grid = sample_grid(device)
    restored = pickle.loads(pickle.dumps(grid))
    assert_same_grid(restored, grid)
    # What is built on the restored grid equals what is built on the original.
    assert_same_grid(restored.conv_grid(2, 2), grid.conv_grid(2, 2))
    a = sg.ConvolutionPlan.from_grid(grid, 3, 1, target=grid).target_map()
    b = sg.ConvolutionPlan.from_grid(restored, 3, 1, target=restored).target_map()
    assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_save_and_load_with_map_location(device):
    grid = sample_grid(device)
    features = torch.randn(grid.num_voxels, 4, device=device)
    buffer = io.BytesIO()
    torch.save({"grid": grid, "features": features, "step": 3}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert_same_grid(loaded["grid"], grid)
    assert torch.equal(loaded["features"], features) and loaded["step"] == 3
    buffer.seek(0)
    on_cpu = torch.load(buffer, map_location="cpu")
    assert on_cpu["grid"].device == torch.device("cpu")
    assert torch.equal(on_cpu["grid"].ijk, grid.ijk.cpu())


@pytest.mark.skipif(not hasattr(torch.serialization, "add_safe_globals"),
                    reason=f"torch {torch.__version__} cannot allow classes in weights_only loading")
def test_weights_only_loading_accepts_grids():
    grid = sample_grid("cpu")
    buffer = io.BytesIO()
    torch.save({"grid": grid}, buffer)
    buffer.seek(0)
    assert_same_grid(torch.load(buffer, weights_only=True)["grid"], grid)


@pytest.mark.parametrize("device", DEVICES)
def test_copies_share_the_immutable_grid(device):
    grid = sample_grid(device)
    assert copy.copy(grid) is grid and copy.deepcopy(grid) is grid
    state = copy.deepcopy({"grids": [grid, grid.conv_grid(2, 2)], "tensor": torch.ones(2)})
    assert state["grids"][0] is grid
    plan = sg.ConvolutionPlan.from_grid(grid, 3, 1)
    assert copy.deepcopy(plan) is plan
    with pytest.raises(TypeError, match="ConvolutionPlan cannot be pickled: pickle its grids"):
        pickle.dumps(plan)


class GridDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        members = sg.synthetic_shapes(2, 10, seed=int(index))
        return index, sg.GridBatch.from_ijk(members)


def keep_as_list(batch):
    return batch


def test_grids_travel_through_data_loader_workers():
    loader = torch.utils.data.DataLoader(GridDataset(), batch_size=2, num_workers=2, collate_fn=keep_as_list)
    seen = 0
    for batch in loader:
        for index, grid in batch:
            assert_same_grid(grid, sg.GridBatch.from_ijk(sg.synthetic_shapes(2, 10, seed=int(index))))
            seen += 1
    assert seen == 4
