"""``train`` and ``predict`` on stores with channels (CZYX) and time points (TZYX), written
by ome-zarr-py: every channel for a model that takes them, ``--channel`` for one that
takes one, every time point predicted into labels with the store's axes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from napari_finetune.io.omezarr import open_volume, save_corrections
from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint
from napari_finetune.model.unet import UNet
from ngff_stores import omero_metadata
from ngff_validation import assert_napari_ome_zarr_reads_labels, assert_valid_ngff
from test_cli import TRAIN_FAST, assert_one_line_error, run_cli

SPATIAL = (16, 40, 40)
NAMES = ["a", "b"]
PREDICT_FAST = ["--device", "cpu", "-q"]


def write_store(path: Path, image: np.ndarray, axes: str,
                channel_labels: list[str] | None = None) -> Path:
    """A real NGFF 0.5 store of ``image`` (through ome-zarr-py), optionally with omero
    channel labels."""
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    group = zarr.group(store=parse_url(str(path), mode="w").store)
    write_image(image, group, axes=axes, scaler=None)
    if channel_labels:
        ome = dict(group.attrs["ome"])
        ome["omero"] = omero_metadata(channel_labels)
        group.attrs["ome"] = ome
    return path


def image_of(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random(shape) * 200 + 20).astype(np.uint8)


def painted(shape: tuple[int, ...] = SPATIAL) -> np.ndarray:
    corrections = np.zeros(shape, np.uint8)
    corrections[..., 4, 5:15, 5:15] = 1
    corrections[..., 4, 20:25, 20:30] = 2
    return corrections


def model_file(path: Path, in_channels: int = 1) -> Path:
    model = UNet(dims=3, in_channels=in_channels, depth=2, features=4, out_channels=2)
    return save_checkpoint(path, model, {"channel_names": NAMES})


def labels_of(store: Path, name: str) -> np.ndarray:
    return np.asarray(open_volume(store / "labels" / name, keep_axes=True).data)


@pytest.fixture
def czyx(tmp_path):
    """Two channels with omero labels, corrections painted."""
    store = write_store(tmp_path / "czyx.zarr", np.stack([image_of(SPATIAL, 0),
                                                          image_of(SPATIAL, 1)]),
                        "czyx", ["DAPI", "GFP"])
    save_corrections(store, painted())
    return store


def test_a_two_channel_model_trains_and_predicts_on_both_channels(capsys, tmp_path, czyx):
    out = tmp_path / "tuned.pt"
    code, stdout, err = run_cli(capsys, "train", czyx, "-c", model_file(tmp_path / "m.pt", 2),
                                "-o", out, "--steps", "2", *TRAIN_FAST)
    assert code == 0, err
    assert "finished after 2/2 steps" in stdout
    metadata = load_checkpoint(out).metadata
    assert metadata["input_channels"] == ["DAPI", "GFP"] and metadata["input_axes"] == "czyx"
    code, stdout, err = run_cli(capsys, "predict", out, czyx, *PREDICT_FAST)
    assert code == 0, err
    assert labels_of(czyx, "prediction-a").shape == SPATIAL  # labels have no channel axis
    assert_valid_ngff(czyx)
    # Both channels reach the model: the second one changed, the prediction changes.
    swapped = write_store(tmp_path / "swapped.zarr", np.stack([image_of(SPATIAL, 0),
                                                               image_of(SPATIAL, 2)]), "czyx")
    assert run_cli(capsys, "predict", out, swapped, *PREDICT_FAST)[0] == 0
    assert not np.array_equal(
        np.stack([labels_of(czyx, f"prediction-{n}") for n in NAMES]),
        np.stack([labels_of(swapped, f"prediction-{n}") for n in NAMES]),
    )


def test_a_one_channel_model_needs_channel_and_then_reads_that_channel(capsys, tmp_path, czyx):
    model = model_file(tmp_path / "m.pt")
    out = tmp_path / "tuned.pt"
    for command in (["train", czyx, "-c", model, "-o", out, *TRAIN_FAST],
                    ["predict", model, czyx, *PREDICT_FAST]):
        code, _, err = run_cli(capsys, *command)
        assert_one_line_error(code, err, expected=2)
        assert ("the store has 2 channels (0: DAPI, 1: GFP) and the model takes 1: "
                "pass --channel 0 or --channel 1.") in err
    assert not out.exists()
    code, _, err = run_cli(capsys, "train", czyx, "-c", model, "-o", out, "--channel", "1",
                           "--steps", "1", *TRAIN_FAST)
    assert code == 0, err
    assert load_checkpoint(out).metadata["input_channels"] == ["GFP"]
    code, _, err = run_cli(capsys, "predict", out, czyx, "--channel", "1", *PREDICT_FAST)
    assert code == 0, err
    # The same as the channel saved as its own single-channel store.
    alone = write_store(tmp_path / "alone.zarr", image_of(SPATIAL, 1), "zyx")
    assert run_cli(capsys, "predict", out, alone, *PREDICT_FAST)[0] == 0
    for name in NAMES:
        np.testing.assert_array_equal(labels_of(czyx, f"prediction-{name}"),
                                      labels_of(alone, f"prediction-{name}"))
    code, _, err = run_cli(capsys, "predict", out, czyx, "--channel", "2", *PREDICT_FAST)
    assert_one_line_error(code, err, expected=2)
    assert "--channel 2: the store has 2 channels" in err


def test_channel_counts_that_differ_are_one_line(capsys, tmp_path):
    store = write_store(tmp_path / "three.zarr", image_of((3, *SPATIAL)), "czyx")
    code, _, err = run_cli(capsys, "predict", model_file(tmp_path / "m.pt", 2), store,
                           *PREDICT_FAST)
    assert_one_line_error(code, err, expected=2)
    assert "the store has 3 channels but the model takes 2 input channels" in err


def test_a_time_series_trains_on_two_painted_time_points_and_predicts_them_all(
    capsys, tmp_path
):
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    frames = np.stack([image_of(SPATIAL, seed) for seed in range(3)])
    store = write_store(tmp_path / "tzyx.zarr", frames, "tzyx")
    corrections = np.zeros((3, *SPATIAL), np.uint8)
    corrections[0] = painted()  # two time points painted, the middle one not
    corrections[2, 8, 10:20, 10:20] = 2
    save_corrections(store, corrections)
    out = tmp_path / "tuned.pt"
    code, stdout, err = run_cli(capsys, "train", store, "-c", model_file(tmp_path / "m.pt"),
                                "-o", out, "--steps", "2", *TRAIN_FAST)
    assert code == 0, err
    run = load_checkpoint(out).metadata["run"]
    assert run["painted_voxels"] == int((corrections > 0).sum())
    code, stdout, err = run_cli(capsys, "predict", out, store, "--instances",
                                "--role", "a=object", *PREDICT_FAST)
    assert code == 0, err
    assert_valid_ngff(store)
    assert_napari_ome_zarr_reads_labels(store, ["prediction-a", "prediction-b", "objects-a"])
    listed = {Path(node.zarr.path).name: node for node in Reader(parse_url(str(store)))()}
    for name in ("prediction-a", "prediction-b", "objects-a"):
        axes = [a["name"] for a in listed[name].metadata["axes"]]
        assert axes == ["t", "z", "y", "x"], (name, axes)
        assert listed[name].data[0].shape == (3, *SPATIAL)
    # Each time point predicted as that frame alone; objects numbered per time point.
    objects = labels_of(store, "objects-a")
    for t in range(3):
        alone = write_store(tmp_path / f"t{t}.zarr", frames[t], "zyx")
        assert run_cli(capsys, "predict", out, alone, "--instances", "--role", "a=object",
                       *PREDICT_FAST)[0] == 0
        np.testing.assert_array_equal(labels_of(store, "prediction-a")[t],
                                      labels_of(alone, "prediction-a"))
        np.testing.assert_array_equal(objects[t], labels_of(alone, "objects-a"))


def test_a_2d_time_series_with_channels_trains_and_predicts(capsys, tmp_path):
    frames = image_of((3, 2, 48, 48))
    store = write_store(tmp_path / "tcyx.zarr", frames, "tcyx")
    corrections = np.zeros((3, 48, 48), np.uint8)
    corrections[0, 5:15, 5:15] = 1
    corrections[2, 20:30, 20:30] = 2
    save_corrections(store, corrections)
    model = save_checkpoint(tmp_path / "m.pt", UNet(dims=2, in_channels=2, depth=2, features=4,
                                                     out_channels=2), {"channel_names": NAMES})
    out = tmp_path / "tuned.pt"
    code, _, err = run_cli(capsys, "train", store, "-c", model, "-o", out, "--steps", "2",
                           "--patch-shape", "16", "16", "--batch-size", "2", "--device", "cpu",
                           "-q")
    assert code == 0, err
    assert load_checkpoint(out).metadata["input_axes"] == "tcyx"
    code, _, err = run_cli(capsys, "predict", out, store, *PREDICT_FAST)
    assert code == 0, err
    labels = open_volume(store / "labels" / "prediction-a", keep_axes=True)
    assert labels.axes == ["t", "y", "x"] and labels.shape == (3, 48, 48)
    assert_valid_ngff(store)
