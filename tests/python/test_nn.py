"""sparsegrid.nn modules: shapes, composition, plan reuse, gradients and pooling against brute force."""

import pytest
import torch

import sparsegrid as sg
from sparsegrid import nn as snn


def make_input(seed=0, channels=4, batch=3):
    g = torch.Generator().manual_seed(seed)
    members = []
    for m in range(batch):
        if m == 1:
            members.append(torch.zeros((0, 3), dtype=torch.int32))
            continue
        members.append(torch.randint(-6, 6, (40, 3), generator=g).to(torch.int32))
    grid = sg.GridBatch.from_ijk(members)
    return snn.SparseFeatures(grid, torch.randn(grid.num_voxels, channels, generator=g, dtype=torch.float64))


def test_encoder_decoder_round_trip_shapes_and_gradients():
    torch.manual_seed(0)
    x = make_input()
    net = torch.nn.Sequential(
        snn.SparseConv3d(4, 8, 3),
        snn.Features(torch.nn.ELU()),
        snn.SparseConv3d(8, 8, 3, stride=2),
        snn.Features(torch.nn.BatchNorm1d(8)),
        snn.SparseConvTranspose3d(8, 4, 2, stride=2),
    ).double()
    y = net(x)
    assert y.features.shape == (y.grid.num_voxels, 4)
    assert y.grid.voxel_sizes.tolist() == [[1.0, 1.0, 1.0]] * 3  # 1, then 2 after stride 2, then 1 again
    y.features.square().sum().backward()
    for p in net.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()


def test_stride_one_keeps_the_grid():
    x = make_input(8)
    y = snn.SparseConv3d(4, 4, 3).double()(x)
    assert y.grid is x.grid
    y = snn.SparseConvTranspose3d(4, 4, 3).double()(x)
    assert y.grid is x.grid


def test_generated_grids_follow_conv_semantics():
    x = make_input(1)
    conv = snn.SparseConv3d(4, 2, 3, stride=2).double()
    y = conv(x)
    assert torch.equal(y.grid.ijk, x.grid.conv_grid(3, 2).ijk)
    up = snn.SparseConvTranspose3d(2, 2, 2, stride=2).double()(y)
    assert torch.equal(up.grid.ijk, y.grid.conv_transpose_grid(2, 2).ijk)


def test_plans_are_reused_for_the_same_grid():
    x = make_input(2)
    a = snn.SparseConv3d(4, 4, 3).double()
    b = snn.SparseConv3d(4, 4, 3).double()
    a(x)
    plans = dict(x.grid._plans)
    b(x)
    assert x.grid._plans == plans and len(plans) == 1


def test_conv_to_a_given_target():
    x = make_input(3)
    target = x.grid.dilated_grid(1)
    y = snn.SparseConv3d(4, 3, 3).double()(x, target)
    assert y.grid is target and y.features.shape == (target.num_voxels, 3)


def test_prune_keeps_rows_and_gradients():
    x = make_input(4)
    x.features.requires_grad_(True)
    mask = torch.arange(x.grid.num_voxels) % 3 == 0
    y = snn.Prune()(x, mask)
    assert torch.equal(y.grid.ijk, x.grid.ijk[mask])
    assert torch.equal(y.features, x.features[mask])
    y.features.sum().backward()
    assert torch.equal(x.features.grad, mask.double().unsqueeze(1).expand(-1, 4))
    # A uint8 mask keeps where nonzero, any value.
    bytes_mask = mask.to(torch.uint8) * torch.randint(1, 255, mask.shape, dtype=torch.uint8)
    z = snn.Prune()(x, bytes_mask)
    assert torch.equal(z.grid.ijk, y.grid.ijk) and torch.equal(z.features, y.features)


def test_pruned_grid_returns_the_kept_indices():
    x = make_input(6)
    for mask in (torch.arange(x.grid.num_voxels) % 4 != 1, torch.zeros(x.grid.num_voxels, dtype=torch.bool),
                 torch.ones(x.grid.num_voxels, dtype=torch.uint8)):
        grid, kept_index = x.grid.pruned_grid(mask, return_index=True)
        assert kept_index.dtype == torch.int64
        assert torch.equal(kept_index, torch.nonzero(mask).reshape(-1))
        assert torch.equal(grid.ijk, x.grid.ijk[kept_index])
        assert torch.equal(grid.ijk, x.grid.pruned_grid(mask).ijk)
        assert torch.equal(grid.joffsets, x.grid.pruned_grid(mask).joffsets)


def test_pooling_matches_brute_force():
    x = make_input(5, channels=2)
    ijk = x.grid.ijk.tolist()
    offsets = x.grid.joffsets.tolist()
    member = [m for m in range(x.grid.batch_size) for _ in range(offsets[m], offsets[m + 1])]
    for pool, reduce in ((snn.SparseMaxPool3d(2), "max"), (snn.SparseAvgPool3d(2), "mean")):
        y = pool(x)
        groups = {}
        for n, (m, v) in enumerate(zip(member, ijk)):
            groups.setdefault((m, tuple(c // 2 for c in v)), []).append(n)
        out_ijk = y.grid.ijk.tolist()
        out_offsets = y.grid.joffsets.tolist()
        for m in range(y.grid.batch_size):
            for r in range(out_offsets[m], out_offsets[m + 1]):
                rows = groups[(m, tuple(out_ijk[r]))]
                expected = x.features[rows].max(0).values if reduce == "max" else x.features[rows].mean(0)
                torch.testing.assert_close(y.features[r], expected)


def test_global_pool_per_member():
    x = make_input(6)
    offsets = x.grid.joffsets.tolist()
    mean = snn.GlobalPool("mean")(x)
    top = snn.GlobalPool("max")(x)
    for m in range(x.grid.batch_size):
        rows = x.features[offsets[m]:offsets[m + 1]]
        if rows.shape[0] == 0:
            assert mean[m].abs().sum() == 0 and top[m].abs().sum() == 0
        else:
            torch.testing.assert_close(mean[m], rows.mean(0))
            torch.testing.assert_close(top[m], rows.max(0).values)


def test_wrong_channel_count_raises():
    x = make_input(7)
    with pytest.raises(ValueError, match="input channels"):
        snn.SparseConv3d(5, 2, 3)(x)
    with pytest.raises(ValueError, match="features must have shape"):
        snn.SparseFeatures(x.grid, torch.zeros(x.grid.num_voxels + 1, 2))


def test_cpu_autocast_leaves_convolutions_in_the_features_dtype():
    # 16-bit convolutions run on CUDA only: inside torch.autocast("cpu") a layer on float32 features
    # stays float32, bitwise as outside.
    torch.manual_seed(0)
    x = make_input()
    x = snn.SparseFeatures(x.grid, x.features.float())
    layer = snn.SparseConv3d(4, 8, 3)
    outside = layer(x).features
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = layer(x).features
    assert inside.dtype == torch.float32
    assert torch.equal(inside, outside)
