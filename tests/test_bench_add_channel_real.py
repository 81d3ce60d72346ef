"""``benchmarks/bench_add_channel_real.py``: its freezing, replay and drift, without a run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from napari_finetune.model.add_channel import widen_model
from napari_finetune.model.unet import UNet

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """``bench_add_channel_real`` imported as the script imports it (its folder on the path)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_add_channel_real

    return bench_add_channel_real


def _wide() -> torch.nn.Module:
    torch.manual_seed(0)
    # The output-row layout: the variants that freeze or thaw shared layers use it.
    return widen_model(UNet(dims=3, in_channels=1, out_channels=2, depth=2, features=4),
                       own_weights=False)


def test_iou_of_masks(bench):
    a = np.array([1, 1, 0, 0], bool)
    b = np.array([1, 0, 1, 0], bool)
    assert bench.iou(a, b) == pytest.approx(1 / 3)
    assert bench.iou(a, a) == 1.0
    assert bench.iou(~(a | True), ~(b | True)) == 1.0  # both empty: nothing changed


def test_the_shared_parameters_are_all_but_the_output_layer(bench):
    model = _wide()
    shared = {id(p) for p in bench.shared_parameters(model)}
    assert id(model.head.weight) not in shared and id(model.head.bias) not in shared
    assert len(shared) == len(list(model.parameters())) - 2


def test_frozen_shared_layers_do_not_move_and_learn_again_when_thawed(bench):
    model = _wide()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    shared = bench.shared_parameters(model)
    start = [p.detach().clone() for p in shared]
    head = model.head.weight.detach().clone()
    frozen = bench.Freeze(model)
    x = torch.randn(2, 1, 4, 8, 8)

    def step() -> None:
        optimizer.zero_grad()
        model(x)[:, 2].mean().backward()
        optimizer.step()

    step()
    for p, p0 in zip(shared, start, strict=True):
        torch.testing.assert_close(p.detach(), p0, rtol=0, atol=0)
    assert not torch.equal(model.head.weight.detach(), head)
    frozen.on = False
    step()
    assert any(not torch.equal(p.detach(), p0) for p, p0 in zip(shared, start, strict=True))
    frozen.remove()
    assert all(not p._backward_hooks for p in shared)


class _Sampler:
    def __init__(self) -> None:
        self.patch_shape = (2, 4, 4)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        return (np.full((n, 1, *self.patch_shape), 7.0, np.float32),
                np.full((n, *self.patch_shape), 3, np.int64))


def test_replay_replaces_a_share_of_each_batch_with_unpainted_patches(bench):
    sampler = _Sampler()
    trainer = SimpleNamespace(_get_sampler=lambda: sampler)
    replay = SimpleNamespace(patches=lambda k, shape: np.zeros((k, 1, *shape), np.float32))
    bench.replay_into(trainer, replay, 0.5)
    images, labels = sampler.sample(4)
    assert (labels[:2] == 3).all() and (images[:2] == 7).all()
    assert (labels[2:] == 0).all() and (images[2:] == 0).all()
    # A batch of one keeps its painted patch.
    images, labels = sampler.sample(1)
    assert (labels == 3).all()


def test_the_hold_weight_is_restored(bench):
    import napari_finetune.trainer.losses as losses

    before = losses.HOLD_WEIGHT
    with bench.hold_weight(5.0):
        assert losses.HOLD_WEIGHT == 5.0
    assert losses.HOLD_WEIGHT == before


def test_only_the_own_weights_row_uses_the_librarys_default_layout(bench):
    # Every other added-* row keeps the output-row layout it was measured with.
    assert bench.VARIANTS["added-own"].own_weights
    rows = [v for k, v in bench.VARIANTS.items() if k.startswith("added") and k != "added-own"]
    assert rows and not any(v.own_weights for v in rows)


def test_each_rows_objects_are_the_widgets(bench, monkeypatch):
    # Both rows are scored on the objects a user of the widget would get: sizes from
    # the row's painting, distances in the volume's voxel size (cli.real.widget_objects).
    import napari_finetune.cli.real as real

    calls = []

    def widget_objects(checkpoint, probs, painting, channel, voxel_size):
        calls.append((checkpoint, painting, channel, voxel_size))
        return np.ones((2, 2), np.int32)

    monkeypatch.setattr(real, "widget_objects", widget_objects)
    volume = SimpleNamespace(voxel_size=(2.0, 0.5, 0.5))
    painting = np.zeros((2, 2), np.uint8)
    out = bench.row_objects("ckpt", np.zeros((3, 2, 2)), painting, 2, volume)
    assert out.sum() == 4
    assert calls == [("ckpt", painting, 2, (2.0, 0.5, 0.5))]
