"""``train --add-channel NAME:ROLE``: a new structure on the sample model, end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from napari_finetune.model.checkpoint import load_checkpoint
from napari_finetune.samples.synthetic_em import generate_volume, sample_checkpoint_path
from test_cli import assert_one_line_error, run_cli

SHAPE = (16, 64, 64)
# The smallest IoU of an old channel's mask before and after six held steps at a learning
# rate of 3e-4; measured 0.992 (membrane) and 0.982 (mitochondria), at 1e-3 0.982 and
# 0.971; without the new row's fit on the painting (zero row, 1e-3) 0.973 and 0.964.
MIN_OLD_IOU = 0.975


def _store(path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """The sample model's own domain, written by ome-zarr-py; a new structure painted."""
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    from napari_finetune.io.omezarr import save_corrections

    image, truth = generate_volume(SHAPE, seed=3, domain="source")
    group = zarr.group(store=parse_url(str(path), mode="w").store)
    write_image(image, group, axes="zyx", scaler=None)
    # The "nuclei": a few slices of the mitochondria, painted as the NEW channel's label
    # (2 + the model's 2 channels), and background strokes where neither is.
    corrections = np.zeros(SHAPE, np.uint8)
    for z in (4, 8, 12):
        corrections[z][truth[z] == 2] = 4
        cytoplasm = np.argwhere(truth[z] == 0)[::25]
        corrections[z][tuple(cytoplasm.T)] = 1
    save_corrections(path, corrections)
    return path, image, truth


def _probs(model: torch.nn.Module, image: np.ndarray) -> np.ndarray:
    from napari_finetune.config import PredictConfig
    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.predict import predict_volume

    low_high = intensity_range(image, {"method": "percentile", "low": 1.0, "high": 99.0})
    config = PredictConfig(device="cpu", block_shape=(16, 64, 64))
    return predict_volume(model, image, low_high, config)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def test_train_add_channel_trains_exports_and_keeps_the_old_channels(capsys, tmp_path):
    store, image, _ = _store(tmp_path / "em.zarr")
    from napari_finetune.io.omezarr import load_corrections

    painted = np.asarray(load_corrections(store, "corrections"))
    out = tmp_path / "with-nuclei.pt"
    code, stdout, err = run_cli(
        capsys, "train", store, "-c", sample_checkpoint_path(), "-o", out,
        "--add-channel", "nuclei:object", "--steps", "6", "--learning-rate", "3e-4",
        "--batch-size", "2",
        "--patch-shape", "16", "32", "32", "--device", "cpu", "-q",
    )
    assert code == 0, err
    assert "added channel nuclei (object): paint it with label 4" in err
    assert "finished after 6/6 steps" in stdout
    raw = torch.load(out, weights_only=True)
    assert raw["architecture"]["kwargs"]["out_channels"] == 3
    tuned = load_checkpoint(out)
    assert tuned.channel_names == ["membrane", "mitochondria", "nuclei"]
    roles = {k: v["role"] for k, v in tuned.metadata["instance_roles"].items()}
    # The sample's default roles are written beside the new one, not dropped.
    assert roles == {"membrane": "boundary", "mitochondria": "object", "nuclei": "object"}

    code, stdout, err = run_cli(capsys, "info", out)
    assert code == 0, err
    assert "membrane (boundary), mitochondria (object), nuclei (object)" in stdout

    before = _probs(load_checkpoint(sample_checkpoint_path()).model, image) > 0.5
    probs = _probs(tuned.model, image)
    after = probs[:2] > 0.5
    # The new channel learns from its painting: higher where painted 4 than where painted 1.
    new = probs[2]
    assert new[painted == 4].mean() > new[painted == 1].mean() + 0.01
    for channel, name in enumerate(("membrane", "mitochondria")):
        iou = _iou(before[channel], after[channel])
        print(f"{name}: IoU of the starting and the tuned model's masks {iou:.4f}")
        assert iou >= MIN_OLD_IOU, name

    package = tmp_path / "with-nuclei.zip"
    code, stdout, err = run_cli(capsys, "export", out, "--bioimageio", package,
                                "--volume", store, "--no-check")
    assert code == 0, err
    reloaded = load_checkpoint(package)
    assert reloaded.channel_names == ["membrane", "mitochondria", "nuclei"]
    assert reloaded.metadata["instance_roles"]["nuclei"]["role"] == "object"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("nuclei", "NAME:ROLE"), ("nuclei:blob", "object, boundary")],
)
def test_a_bad_add_channel_is_one_line(capsys, tmp_path, store, checkpoint, value, expected):
    code, _, err = run_cli(capsys, "train", store, "-c", checkpoint, "-o", tmp_path / "o.pt",
                           "--add-channel", value)
    assert_one_line_error(code, err, expected=2)
    assert expected in err


def test_a_taken_name_is_one_line(capsys, tmp_path, painted_store, checkpoint):
    code, _, err = run_cli(capsys, "train", painted_store, "-c", checkpoint, "-o",
                           tmp_path / "o.pt", "--add-channel", "membrane:boundary")
    assert_one_line_error(code, err, expected=2)
    assert "already has a channel named 'membrane'" in err
    assert not (tmp_path / "o.pt").exists()


def test_a_model_that_cannot_have_one_is_one_line(capsys, tmp_path, painted_store):
    from napari_finetune.model.checkpoint import save_checkpoint
    from third_party import monai_nets

    # Residual units add a skip path after the last convolution.
    model = monai_nets().UNet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2), num_res_units=1)
    ckpt = save_checkpoint(tmp_path / "monai.pt", model)
    code, _, err = run_cli(capsys, "train", painted_store, "-c", ckpt, "-o", tmp_path / "o.pt",
                           "--add-channel", "nuclei:object")
    assert_one_line_error(code, err, expected=2)
    assert "cannot add a channel to UNet" in err and "num_res_units=0" in err
