"""2D and 2D+t through the CLI: YX, TYX and CYX stores written by ome-zarr-py go through
``train``, ``predict`` and ``predict --instances`` with a 2D model, and come back as NGFF
labels with the store's axes (no ``c``) that napari-ome-zarr opens."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from napari_finetune.io.omezarr import open_volume, save_corrections
from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint
from napari_finetune.model.unet import UNet
from ngff_validation import assert_napari_ome_zarr_reads_labels, assert_valid_ngff
from test_cli import assert_one_line_error, run_cli
from test_cli_axes import image_of, model_file, write_store
from test_cli_instances import same_up_to_relabelling

PLANE = (48, 48)
NAMES = ["a", "b"]
TRAIN_2D = ["--patch-shape", "16", "16", "--batch-size", "2", "--device", "cpu", "-q"]
# Blocks smaller than the plane, so the objects are joined across block borders; the halo
# covers the model's receptive field, so the blocks give the whole plane's probabilities.
PREDICT_2D = ["--block-shape", "16", "16", "--halo", "16", "16", "--device", "cpu", "-q"]
OBJECTS = ["--instances", "--role", "a=object"]


def model_2d(path: Path, in_channels: int = 1, norm: Literal["none", "group"] = "none") -> Path:
    """An untrained 2D UNet of two output channels, ``a`` and ``b``. Without normalisation
    layers (the default) a block's output depends on its receptive field alone (module doc
    of :mod:`napari_finetune.predict.volume`); with GroupNorm its masks vary with the input
    even untrained."""
    model = UNet(dims=2, in_channels=in_channels, depth=2, features=4, out_channels=2,
                 norm=norm)
    return save_checkpoint(path, model, {"channel_names": NAMES})


def painted_plane() -> np.ndarray:
    corrections = np.zeros(PLANE, np.uint8)
    corrections[5:15, 5:15] = 1
    corrections[20:30, 20:30] = 2
    return corrections


def frame(seed: int) -> np.ndarray:
    """A plane whose 1st and 99th percentiles are 10 and 240 whatever ``seed``: a time
    series is normalised over all its frames, so each frame alone is normalised alike."""
    plane = image_of(PLANE, seed)
    plane[:3], plane[-3:] = 10, 240
    return plane


def labels(store: Path, name: str) -> tuple[list[str], np.ndarray]:
    """A labels image's axes and level-0 data."""
    volume = open_volume(store / "labels" / name, keep_axes=True)
    return list(volume.axes), np.asarray(volume.data)


def train(capsys, store: Path, model: Path, out: Path, *extra: object) -> None:
    code, stdout, err = run_cli(capsys, "train", store, "-c", model, "-o", out, "--steps", "2",
                                *TRAIN_2D, *extra)
    assert code == 0, err
    assert "finished after 2/2 steps" in stdout


def test_a_2d_image_trains_and_predicts_masks_and_objects(capsys, tmp_path):
    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.objects import ChannelRole, instances_of
    from napari_finetune.predict import predict_volume

    store = write_store(tmp_path / "yx.zarr", image_of(PLANE), "yx")
    save_corrections(store, painted_plane())
    out = tmp_path / "tuned.pt"
    train(capsys, store, model_2d(tmp_path / "m.pt"), out)
    run = load_checkpoint(out).metadata["run"]
    assert run["painted_voxels"] == int((painted_plane() > 0).sum())

    code, stdout, err = run_cli(capsys, "predict", out, store, *OBJECTS, *PREDICT_2D)
    assert code == 0, err
    for name in ("prediction-a", "prediction-b", "objects-a"):
        assert f"labels/{name}" in stdout
        axes, data = labels(store, name)
        assert axes == ["y", "x"] and data.shape == PLANE, (name, axes, data.shape)
    assert_valid_ngff(store)
    assert_napari_ome_zarr_reads_labels(store, ["prediction-a", "prediction-b", "objects-a"])
    # Blockwise objects are those of the whole plane's probability in one call. Its
    # threshold at the median gives many objects (the model is hardly trained), on a copy
    # of the image without painting (whose objects would set the role's min size).
    ckpt = load_checkpoint(out)
    image = open_volume(store).data
    probs = np.asarray(predict_volume(ckpt.model, image,
                                      intensity_range(image, ckpt.normalization)))
    role = ChannelRole("object", threshold=float(np.median(probs[0])))
    textured = save_checkpoint(tmp_path / "textured.pt", ckpt.model,
                               {**ckpt.metadata, "instance_roles": {"a": role.to_dict()}})
    unpainted = write_store(tmp_path / "unpainted.zarr", image_of(PLANE), "yx")
    code, _, err = run_cli(capsys, "predict", textured, unpainted, "--instances", *PREDICT_2D)
    assert code == 0, err
    objects = labels(unpainted, "objects-a")[1]
    assert objects.dtype == np.uint32 and objects.max() > 1
    assert same_up_to_relabelling(objects, instances_of(probs, {"a": role}, NAMES)["a"])


def test_a_2d_time_series_trains_on_its_painted_frames_and_predicts_each_frame(
    capsys, tmp_path
):
    frames = np.stack([frame(seed) for seed in range(3)])
    store = write_store(tmp_path / "tyx.zarr", frames, "tyx")
    corrections = np.zeros((3, *PLANE), np.uint8)
    corrections[0] = painted_plane()  # frames 0 and 2 painted, frame 1 not
    corrections[2, 30:40, 5:20] = 2
    save_corrections(store, corrections)
    out = tmp_path / "tuned.pt"
    # The same tiling frame by frame and alone: GroupNorm's masks (not empty) compare equal.
    train(capsys, store, model_2d(tmp_path / "m.pt", norm="group"), out)
    metadata = load_checkpoint(out).metadata
    assert metadata["run"]["painted_voxels"] == int((corrections > 0).sum())
    assert metadata["input_axes"] == "tyx"

    code, _, err = run_cli(capsys, "predict", out, store, *OBJECTS, *PREDICT_2D)
    assert code == 0, err
    assert_valid_ngff(store)
    assert_napari_ome_zarr_reads_labels(store, ["prediction-a", "prediction-b", "objects-a"])
    for name in ("prediction-a", "prediction-b", "objects-a"):
        axes, data = labels(store, name)
        assert axes == ["t", "y", "x"] and data.shape == (3, *PLANE), (name, axes, data.shape)
    # Each frame is predicted as that frame alone, its objects numbered from 1 per frame.
    assert all(labels(store, "objects-a")[1][t].max() > 0 for t in range(3))
    for t in range(3):
        alone = write_store(tmp_path / f"t{t}.zarr", frames[t], "yx")
        assert run_cli(capsys, "predict", out, alone, *OBJECTS, *PREDICT_2D)[0] == 0
        for name in ("prediction-a", "prediction-b", "objects-a"):
            np.testing.assert_array_equal(labels(store, name)[1][t], labels(alone, name)[1],
                                          err_msg=f"{name} at t={t}")


def test_a_two_channel_2d_model_reads_both_channels_of_a_cyx_store(capsys, tmp_path):
    store = write_store(tmp_path / "cyx.zarr", np.stack([image_of(PLANE, 0),
                                                         image_of(PLANE, 1)]), "cyx")
    save_corrections(store, painted_plane())
    out = tmp_path / "tuned.pt"
    train(capsys, store, model_2d(tmp_path / "m.pt", in_channels=2, norm="group"), out)
    assert load_checkpoint(out).metadata["input_axes"] == "cyx"
    code, _, err = run_cli(capsys, "predict", out, store, *OBJECTS, *PREDICT_2D)
    assert code == 0, err
    assert_valid_ngff(store)
    for name in ("prediction-a", "prediction-b", "objects-a"):
        axes, data = labels(store, name)
        assert axes == ["y", "x"] and data.shape == PLANE, (name, axes, data.shape)
    # The second channel reaches the model: another second channel, another prediction.
    other = write_store(tmp_path / "other.zarr", np.stack([image_of(PLANE, 0),
                                                           image_of(PLANE, 2)]), "cyx")
    assert run_cli(capsys, "predict", out, other, *PREDICT_2D)[0] == 0
    assert not np.array_equal(
        np.stack([labels(store, f"prediction-{n}")[1] for n in NAMES]),
        np.stack([labels(other, f"prediction-{n}")[1] for n in NAMES]),
    )


def test_a_one_channel_2d_model_on_a_cyx_store_predicts_the_channel_asked_for(
    capsys, tmp_path
):
    store = write_store(tmp_path / "cyx.zarr", np.stack([image_of(PLANE, 0),
                                                         image_of(PLANE, 1)]), "cyx")
    save_corrections(store, painted_plane())
    model = model_2d(tmp_path / "m.pt")
    code, _, err = run_cli(capsys, "train", store, "-c", model, "-o", tmp_path / "x.pt",
                           *TRAIN_2D)
    assert_one_line_error(code, err, expected=2)
    assert "the store has 2 channels and the model takes 1: pass --channel 0 or --channel 1." \
        in err
    out = tmp_path / "tuned.pt"
    train(capsys, store, model, out, "--channel", "1")
    code, _, err = run_cli(capsys, "predict", out, store, "--channel", "1", *PREDICT_2D)
    assert code == 0, err
    alone = write_store(tmp_path / "alone.zarr", image_of(PLANE, 1), "yx")
    assert run_cli(capsys, "predict", out, alone, *PREDICT_2D)[0] == 0
    for name in NAMES:
        np.testing.assert_array_equal(labels(store, f"prediction-{name}")[1],
                                      labels(alone, f"prediction-{name}")[1])


@pytest.mark.parametrize("command", ["train", "predict"])
def test_a_3d_model_on_a_2d_store_is_one_line(capsys, tmp_path, command):
    store = write_store(tmp_path / "yx.zarr", image_of(PLANE), "yx")
    save_corrections(store, painted_plane())
    model = model_file(tmp_path / "m3d.pt")
    argv = (["train", store, "-c", model, "-o", tmp_path / "x.pt", *TRAIN_2D]
            if command == "train" else ["predict", model, store, "--device", "cpu", "-q"])
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err)
    assert "the model is 3D but the image has shape (48, 48); use a 3D (ZYX) image, or a " \
        "2D model." in err
    assert not (tmp_path / "x.pt").exists()
