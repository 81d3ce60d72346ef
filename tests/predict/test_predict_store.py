"""Prediction into an OME-Zarr store: written aside, swapped in whole, OOM steps down."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from napari_finetune import palette
from napari_finetune.config import PredictConfig
from napari_finetune.io.omezarr import list_labels, load_corrections
from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.predict.store import predict_to_omezarr
from napari_finetune.testing import MemoryBudget, always_oom
from ngff_stores import SHAPE, ngff_store
from test_cli import make_store as make_cli_store

CHANNELS = ["membrane", "mitochondria"]
NAMES = [f"prediction-{c}" for c in CHANNELS]
CONFIG = PredictConfig(block_shape=(8, 24, 24), halo=(4, 8, 8), device="cpu")


def make_store(path: Path, shape: tuple[int, ...] = SHAPE) -> Path:
    """A real NGFF 0.5 store with a uint8 image (the CLI tests' writer, this shape)."""
    return make_cli_store(path, shape)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return make_store(tmp_path / "vol.zarr")


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    model = UNet(dims=3, depth=2, features=4, out_channels=2)
    return save_checkpoint(tmp_path / "model.pt", model, {"channel_names": CHANNELS})


def _hidden_entries(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if p.name.startswith("."))


def test_failed_predict_keeps_previous_prediction(store, checkpoint):
    """Issue 8.6: an OOM mid-run used to delete the old labels and list zero-filled ones."""
    assert predict_to_omezarr(checkpoint, store, config=CONFIG) == NAMES
    before = {name: load_corrections(store, name) for name in NAMES}
    assert all(b.any() for b in before.values())  # a real result, not zeros

    ckpt = load_checkpoint(checkpoint)
    # The first block fits, every later one runs out of memory, whatever its size.
    calls = []

    def fail_after_first(_module, _args):
        calls.append(1)
        if len(calls) > 1:
            raise __import__("torch").OutOfMemoryError("CUDA out of memory. (injected)")

    handle = ckpt.model.register_forward_pre_hook(fail_after_first)
    with pytest.raises(MemoryError, match="out of memory"):
        predict_to_omezarr(ckpt, store, config=CONFIG)
    handle.remove()

    assert set(NAMES) <= set(list_labels(store))
    for name in NAMES:
        np.testing.assert_array_equal(load_corrections(store, name), before[name])


def test_killed_predict_lists_nothing_new(store, checkpoint):
    """Nothing is listed (nor is an old result touched) before every block is written."""
    ckpt = load_checkpoint(checkpoint)
    fault = always_oom(ckpt.model)
    with pytest.raises(MemoryError):
        predict_to_omezarr(ckpt, store, config=CONFIG)
    fault.remove()
    assert list_labels(store) == []
    assert not (store / "labels").exists() or not any(
        (store / "labels" / n).exists() for n in NAMES
    )


def test_oom_steps_down_to_smaller_blocks(store, checkpoint):
    ckpt = load_checkpoint(checkpoint)
    reference_config = PredictConfig(block_shape=(8, 12, 12), halo=(4, 8, 8), device="cpu")
    lines: list[str] = []
    # A budget that holds an 8x12x12 block's activations but not an 8x24x24 one's.
    with MemoryBudget(budget_bytes=_budget_between(ckpt.model)):
        names = predict_to_omezarr(ckpt, store, config=CONFIG, log=lines.append)
    assert names == NAMES
    steps = [line for line in lines if "out of memory" in line]
    assert len(steps) == 1, lines  # one line per step down, and it stuck for later blocks
    assert "8x24x24" in steps[0] and "8x12x12" in steps[0]
    other = make_store(store.parent / "ref.zarr")
    predict_to_omezarr(ckpt, other, config=reference_config)
    for name in NAMES:  # the stepped-down run computed what 8x12x12 blocks compute
        np.testing.assert_array_equal(load_corrections(store, name), load_corrections(other, name))


def test_oom_at_the_smallest_block_is_a_clear_error(store, checkpoint):
    ckpt = load_checkpoint(checkpoint)
    fault = always_oom(ckpt.model)
    lines: list[str] = []
    with pytest.raises(MemoryError, match="smallest block"):
        predict_to_omezarr(ckpt, store, config=CONFIG, log=lines.append)
    fault.remove()
    assert len([line for line in lines if "stepping down" in line]) >= 2


def _budget_between(model) -> int:
    """Between the peak bytes of the reads of 8x12x12 and 8x24x24 cores (halo 4x8x8 on the
    pooling grid of 4: at most 12x28x28 and 12x32x32), measured with MemoryBudget."""
    import torch

    from napari_finetune.predict import predict_block

    def peak(shape: tuple[int, ...]) -> int:
        with MemoryBudget(budget_bytes=1 << 40) as budget:
            predict_block(model, np.zeros(shape, np.float32))
        return budget.peak_bytes

    small, large = peak((12, 28, 28)), peak((12, 32, 32))
    assert small < large
    torch.manual_seed(0)
    return (small + large) // 2


@pytest.mark.parametrize("scale_factors", [(), (2, 4)], ids=["single-scale", "multiscale"])
@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_predictions_are_valid_ngff_with_the_image_levels(tmp_path, checkpoint, version,
                                                          scale_factors):
    """ome-zarr-models 1.7 rejected a 0.5 multiscale store once predictions were written:
    "Number of image label multiscale levels (1) doesn't match ... (3)"."""
    from napari_finetune.io.omezarr import open_volume
    from ngff_validation import assert_napari_ome_zarr_reads_labels, assert_valid_ngff

    store = ngff_store(tmp_path / f"vol{version}.zarr", version, scale_factors)
    assert predict_to_omezarr(checkpoint, store, config=CONFIG) == NAMES
    assert_valid_ngff(store)
    assert_napari_ome_zarr_reads_labels(store, NAMES)
    colors = load_checkpoint(checkpoint).channel_colors
    for name, channel, color in zip(NAMES, CHANNELS, colors, strict=True):
        levels = open_volume(store / "labels" / name).levels
        assert len(levels) == len(scale_factors) + 1  # values: tests/io/test_pyramid.py
        assert np.asarray(levels[0]).any()
        assert image_label(store / "labels" / name) == {  # as napari shows the channel
            "colors": [{"label-value": 1, "rgba": palette.rgba(color)}],
            "properties": [{"label-value": 1, "class": channel}]}


def image_label(group: Path) -> dict:
    """The NGFF image-label colors and properties of a labels image (0.4 or 0.5)."""
    import zarr

    attrs = dict(zarr.open_group(str(group), mode="r").attrs)
    label = attrs.get("ome", attrs)["image-label"]
    return {key: label[key] for key in ("colors", "properties")}


def test_missing_voxels_are_background_in_the_store_as_in_memory(tmp_path):
    """NaN voxels are missing: the store's labels say background there, as predict_volume
    does, even for a model that calls everything foreground (dark input included)."""
    import torch
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.io.omezarr import open_volume
    from napari_finetune.predict import predict_volume

    rng = np.random.default_rng(0)
    image = (rng.random(SHAPE) * 200 + 20).astype(np.float32)
    image[5:9, 10:30, 4:20] = np.nan  # a masked region, across block borders
    path = tmp_path / "float.zarr"
    write_image(image, zarr.group(store=parse_url(str(path), mode="w").store), axes="zyx",
                scale_factors=[])
    model = UNet(dims=3, depth=2, features=4, out_channels=2)
    with torch.no_grad():
        model.head.bias.fill_(20.0)  # foreground wherever it looks
    ckpt = save_checkpoint(tmp_path / "all_foreground.pt", model, {"channel_names": CHANNELS})

    assert predict_to_omezarr(ckpt, path, config=CONFIG) == NAMES
    loaded = load_checkpoint(ckpt)
    low_high = intensity_range(image, loaded.normalization)
    expected = predict_volume(loaded.model, image, low_high, CONFIG) > 0.5
    for name, channel in zip(NAMES, expected, strict=True):
        written = np.asarray(open_volume(path / "labels" / name).data)
        assert not written[5:9, 10:30, 4:20].any(), f"{name}: foreground where the image is NaN"
        np.testing.assert_array_equal(written, channel.astype(np.uint8))
