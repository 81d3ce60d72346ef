"""``napari-finetune predict --instances``: masks and objects over the volume in one command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from napari_finetune.config import PredictConfig
from napari_finetune.io.omezarr import list_labels, open_volume
from napari_finetune.io.staging import STAGING_PREFIX
from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.objects import instances_of, roles_from_metadata
from ngff_stores import ngff_store
from test_cli import assert_one_line_error, run_cli

BLOCK = ["--block-shape", "8", "16", "16", "--halo", "8", "16", "16", "--device", "cpu", "-q"]
OBJECTS = ["objects-membrane", "objects-mitochondria"]
CONFIG = PredictConfig(block_shape=(8, 16, 16), halo=(8, 16, 16), device="cpu")


@pytest.fixture
def seen(monkeypatch) -> dict:
    """role -> the ChannelRole each channel's objects were labelled with (the blockwise
    objects step spied on, still run)."""
    from napari_finetune.predict import store as predict_store

    labelled = {}
    real = predict_store.blockwise_instances

    def spy(prob, params, block_shape, out, **kwargs):
        labelled[params.role] = params
        return real(prob, params, block_shape, out, **kwargs)

    monkeypatch.setattr(predict_store, "blockwise_instances", spy)
    return labelled


def same_up_to_relabelling(a: np.ndarray, b: np.ndarray) -> bool:
    """Background in the same voxels, and one-to-one ids between a and b."""
    if not np.array_equal(a > 0, b > 0):
        return False
    pairs = np.unique(np.stack([a[a > 0], b[b > 0]]), axis=1)
    return pairs.shape[1] == np.unique(a[a > 0]).size == np.unique(b[b > 0]).size


def probabilities(checkpoint: Path, store: Path) -> np.ndarray:
    """The whole volume's probabilities, in memory."""
    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.predict import predict_volume

    ckpt = load_checkpoint(checkpoint)
    image = open_volume(store).data
    return np.asarray(predict_volume(ckpt.model, image,
                                     intensity_range(image, ckpt.normalization), CONFIG))


@pytest.fixture
def textured(tmp_path: Path, checkpoint: Path) -> Path:
    """The test checkpoint with roles whose thresholds sit at its channels' medians on the
    test image, so the untrained model's output gives many objects (the sample roles give
    one or none: its probabilities hardly vary)."""
    probs = probabilities(checkpoint, ngff_store(tmp_path / "probe.zarr", "0.5", ()))
    ckpt = load_checkpoint(checkpoint)
    roles = {
        "membrane": {"role": "boundary", "threshold": float(np.median(probs[0])),
                     "seed_distance": 1.0},
        "mitochondria": {"role": "object", "threshold": float(np.median(probs[1])),
                         "min_size": 3},
    }
    return save_checkpoint(tmp_path / "textured.pt", ckpt.model,
                           {**ckpt.metadata, "instance_roles": roles})


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_predict_instances_writes_valid_uint32_objects_with_the_image_levels(
    capsys, tmp_path, textured, version
):
    from ngff_validation import assert_valid_ngff

    store = ngff_store(tmp_path / f"vol{version}.zarr", version, (2, 4))
    code, out, err = run_cli(capsys, "predict", textured, store, "--instances", *BLOCK)
    assert code == 0, err
    for name in OBJECTS:
        assert f"labels/{name}" in out
        assert name in list_labels(store)
    assert_valid_ngff(store)
    image_levels = open_volume(store).levels
    for name in OBJECTS:
        levels = open_volume(store / "labels" / name).levels
        assert len(levels) == len(image_levels) == 3
        assert [tuple(a.shape) for a in levels] == [tuple(a.shape) for a in image_levels]
        assert all(np.dtype(a.dtype) == np.uint32 for a in levels)
    counts = []
    for name in OBJECTS:  # ids 1..N in each
        labels = np.asarray(open_volume(store / "labels" / name).levels[0])
        ids = np.unique(labels[labels > 0])
        assert ids.tolist() == list(range(1, ids.size + 1))
        counts.append(ids.size)
    assert min(counts) > 1, counts
    assert not list(store.glob(STAGING_PREFIX + "*"))  # staging removed


def test_predict_instances_equals_one_piece_for_the_object_channel(
    capsys, monkeypatch, tmp_path, textured
):
    """The store's objects equal instances_of on the whole volume's probabilities (object
    channel: exactly, up to the numbering) with blocks smaller than the volume. The
    probabilities are the ones the command kept aside (predict_volume's differ in the last
    bits, and this untrained model's sit close to its thresholds)."""
    from napari_finetune.predict import store as predict_store
    seen = {}
    real = predict_store.blockwise_instances

    def spy(prob, params, block_shape, out, **kwargs):
        seen[params.role] = np.asarray(prob[...])  # the test reads it whole, the code not
        return real(prob, params, block_shape, out, **kwargs)

    monkeypatch.setattr(predict_store, "blockwise_instances", spy)
    store = ngff_store(tmp_path / "vol.zarr", "0.5", ())
    code, _, err = run_cli(capsys, "predict", textured, store, "--instances", *BLOCK)
    assert code == 0, err
    ckpt = load_checkpoint(textured)
    roles = roles_from_metadata(ckpt.metadata, ckpt.channel_names)
    whole = instances_of(seen["object"][None], {"m": roles["mitochondria"]}, ["m"])["m"]
    stored = np.asarray(open_volume(store / "labels" / "objects-mitochondria").levels[0])
    assert whole.max() > 1
    assert same_up_to_relabelling(stored, whole)
    mask = np.asarray(open_volume(store / "labels" / "prediction-mitochondria").levels[0])
    assert np.array_equal(mask, seen["object"] > 0.5)  # the same probabilities as the mask's


def test_a_checkpoint_without_roles_says_how_to_set_one(capsys, tmp_path, store):
    model = UNet(dims=3, depth=2, features=4, out_channels=2)
    plain = save_checkpoint(tmp_path / "plain.pt", model, {"channel_names": ["a", "b"]})
    code, _, err = run_cli(capsys, "predict", plain, store, "--instances", *BLOCK)
    assert_one_line_error(code, err, expected=2)
    assert "--role" in err and "a, b" in err
    assert not [n for n in list_labels(store)]  # nothing written
    code, _, err = run_cli(capsys, "predict", plain, store, "--instances", "--role", "b=object",
                           *BLOCK)
    assert code == 0, err
    assert "objects-b" in list_labels(store) and "objects-a" not in list_labels(store)


@pytest.mark.parametrize("role,says", [
    ("membrane", "CHANNEL=ROLE"),
    ("membrane=cells", "CHANNEL=ROLE"),
    ("nucleus=object", "does not have"),
])
def test_a_bad_role_is_a_one_line_error(capsys, store, checkpoint, role, says):
    code, _, err = run_cli(capsys, "predict", checkpoint, store, "--instances", "--role", role,
                           *BLOCK)
    assert_one_line_error(code, err, expected=2)
    assert says in err
    assert list_labels(store) == []


def test_instances_with_workers_checks_the_roles_before_starting_a_cluster(capsys, tmp_path,
                                                                          store):
    model = UNet(dims=3, depth=2, features=4, out_channels=2)
    plain = save_checkpoint(tmp_path / "plain.pt", model, {"channel_names": ["a", "b"]})
    code, out, err = run_cli(capsys, "predict", plain, store, "--instances", "--workers", "2")
    assert_one_line_error(code, err, expected=2)
    assert "--role" in err and "local dask cluster" not in out
    assert list_labels(store) == []


def test_role_none_turns_a_channel_off(capsys, store, checkpoint):
    code, out, err = run_cli(capsys, "predict", checkpoint, store, "--instances",
                             "--role", "membrane=none", *BLOCK)
    assert code == 0, err
    assert "objects-mitochondria" in list_labels(store)
    assert "objects-membrane" not in list_labels(store)


def test_too_many_objects_keep_the_store_as_it_was(capsys, monkeypatch, store, checkpoint):
    from napari_finetune.objects import segment

    assert run_cli(capsys, "predict", checkpoint, store, *BLOCK)[0] == 0
    before = sorted(list_labels(store))
    monkeypatch.setattr(segment, "MAX_ID", 1)
    code, _, err = run_cli(capsys, "predict", checkpoint, store, "--instances", *BLOCK)
    assert_one_line_error(code, err)
    assert "overflow uint32" in err
    assert sorted(list_labels(store)) == before
    assert not list(Path(store).glob(STAGING_PREFIX + "*"))



def test_predict_instances_takes_the_sizes_of_the_objects_painted_in_the_store(
    capsys, seen, tmp_path, store, checkpoint
):
    """Two mitochondria 11 wide painted on two slices: the objects are labelled with the
    painting's seed distance and min size, and one line says so; a size the checkpoint
    records as set by the user stays."""
    from napari_finetune.io.omezarr import save_corrections
    from napari_finetune.objects import roles_to_metadata
    from napari_finetune.objects.roles import SAMPLE_ROLES

    painted = np.zeros((16, 40, 40), np.uint8)
    for z in (4, 8):
        painted[z, 4:15, 4:15] = painted[z, 22:33, 22:33] = 3  # mitochondria: channel 1
    save_corrections(store, painted)
    code, out, err = run_cli(capsys, "predict", checkpoint, store, "--instances", *BLOCK)
    assert code == 0, err
    mito = SAMPLE_ROLES["mitochondria"]
    assert (seen["object"].seed_distance, seen["object"].min_size) == (5.5, 87)
    assert seen["boundary"] == SAMPLE_ROLES["membrane"]  # a boundary's painting: membranes
    painting = "from your painting (4 objects, median extent 11 voxels)"
    assert (f"objects of mitochondria: seed distance 5.5 ({painting}), min size 87 "
            f"({painting})") in out
    assert "objects of membrane" not in out

    ckpt = load_checkpoint(checkpoint)
    mine = save_checkpoint(tmp_path / "mine.pt", ckpt.model, roles_to_metadata(
        SAMPLE_ROLES, ckpt.metadata, {"mitochondria": {"min_size": "set by you"}}))
    code, out, err = run_cli(capsys, "predict", mine, store, "--instances", *BLOCK)
    assert code == 0, err
    assert (seen["object"].seed_distance, seen["object"].min_size) == (5.5, mito.min_size)
    assert f"min size {mito.min_size} (set by you)" in out


def _balls_store(path: Path, radius: int) -> tuple[Path, np.ndarray]:
    """A 24x64x64 store of four bright balls ``2 * radius + 1`` wide on a dark background."""
    from test_cli_axes import write_store

    z, y, x = np.ogrid[:24, :64, :64]
    balls = np.zeros((24, 64, 64), bool)
    for cy, cx in ((16, 16), (16, 47), (47, 16), (47, 47)):
        balls |= (z - 12) ** 2 + (y - cy) ** 2 + (x - cx) ** 2 <= radius**2
    image = np.where(balls, 220, 20).astype(np.uint8)
    return write_store(path, image, "zyx"), image


def _thresholding_model(path: Path, roles: dict) -> Path:
    """A 1x1x1 convolution (torch.nn.Conv3d, a trusted factory) whose channels are the
    inverted and the plain normalised image: its objects are the image's bright balls."""
    import torch

    from napari_finetune.model.bring_your_own import checkpoint_from_factory

    weights = {"weight": torch.tensor([-20.0, 20.0]).reshape(2, 1, 1, 1, 1),
               "bias": torch.tensor([10.0, -10.0])}
    return checkpoint_from_factory(
        path, "torch.nn:Conv3d", {"in_channels": 1, "out_channels": 2, "kernel_size": 1},
        weights, {"channel_names": ["membrane", "mitochondria"], "instance_roles": roles})


def test_predict_instances_takes_the_sizes_of_the_predicted_objects_when_far_off(
    capsys, seen, tmp_path
):
    """Nothing painted, objects 19 voxels wide and the checkpoint's seed distance 4 (for
    objects about 8 wide): the predicted objects' sizes, one line saying why; objects
    of about the checkpoint's size, or a size set by the user, keep theirs."""
    from napari_finetune.objects import roles_to_metadata
    from napari_finetune.objects.from_painting import parameters_for, predicted_objects

    roles = {"mitochondria": {"role": "object", "threshold": 0.5, "seed_distance": 4.0,
                              "min_size": 20}}
    model = _thresholding_model(tmp_path / "balls.pt", roles)
    store, image = _balls_store(tmp_path / "balls.zarr", 9)
    trust = ["--trust-factory", "torch.nn:Conv3d"]
    code, out, err = run_cli(capsys, "predict", model, store, "--instances", *trust, *BLOCK)
    assert code == 0, err
    predicted = predicted_objects((image > 100).astype(np.float32), 0.5)
    assert predicted.count == 4 and predicted.extent > 16  # more than twice 8
    seed_distance, min_size = parameters_for(predicted, 3)
    assert (seen["object"].seed_distance, seen["object"].min_size) == (seed_distance, min_size)
    said = f"from the prediction (4 objects, typical width {predicted.extent:.3g} voxels)"
    assert (f"objects of mitochondria: seed distance {seed_distance:g} ({said}), min size "
            f"{min_size} ({said}); nothing painted sizes them, and the checkpoint's seed "
            "distance 4 is for objects about 8 voxels wide, more than twice off") in out
    assert int(open_volume(store / "labels" / "objects-mitochondria").data[:].max()) == 4

    # Objects about the checkpoint's size (9 wide for 8): its sizes stay, nothing said.
    small, _ = _balls_store(tmp_path / "small.zarr", 4)
    code, out, err = run_cli(capsys, "predict", model, small, "--instances", *trust, *BLOCK)
    assert code == 0, err
    assert (seen["object"].seed_distance, seen["object"].min_size) == (4.0, 20)
    assert "objects of mitochondria" not in out

    # A seed distance the user set stays; the min size still follows the prediction.
    ckpt = load_checkpoint(model, trust=["torch.nn:Conv3d"])
    mine = save_checkpoint(tmp_path / "mine.pt", ckpt.model, roles_to_metadata(
        roles_from_metadata(ckpt.metadata, ckpt.channel_names), ckpt.metadata,
        {"mitochondria": {"seed_distance": "set by you"}}), architecture=ckpt.architecture)
    code, out, err = run_cli(capsys, "predict", mine, store, "--instances", *trust, *BLOCK)
    assert code == 0, err
    assert (seen["object"].seed_distance, seen["object"].min_size) == (4.0, min_size)
    assert "seed distance 4 (set by you)" in out


def test_sizes_given_on_the_command_line_are_used_and_said(capsys, seen, store, checkpoint):
    """--seed-distance and --min-size: the objects are labelled with them, whatever the
    painting says, and the line names them as set by the user."""
    from napari_finetune.io.omezarr import save_corrections

    painted = np.zeros((16, 40, 40), np.uint8)
    for z in (4, 8):
        painted[z, 4:15, 4:15] = painted[z, 22:33, 22:33] = 3  # would give 5.5 and 87
    save_corrections(store, painted)
    code, out, err = run_cli(capsys, "predict", checkpoint, store, "--instances",
                             "--seed-distance", "mitochondria=3", "--min-size",
                             "mitochondria=40", "--seed-distance", "membrane=6", *BLOCK)
    assert code == 0, err
    assert (seen["object"].seed_distance, seen["object"].min_size) == (3.0, 40)
    assert seen["boundary"].seed_distance == 6.0
    assert "objects of mitochondria: seed distance 3 (set by you), min size 40 (set by you)" in out

    # Only the min size given: the seed distance still comes from the painting.
    code, out, err = run_cli(capsys, "predict", checkpoint, store, "--instances",
                             "--min-size", "mitochondria=40", *BLOCK)
    assert code == 0, err
    assert (seen["object"].seed_distance, seen["object"].min_size) == (5.5, 40)


@pytest.mark.parametrize("args,says", [
    (["--seed-distance", "mitochondria=0.5"], ">= 1"),
    (["--seed-distance", "mitochondria=inf"], ">= 1"),
    (["--seed-distance", "mitochondria"], "CHANNEL=VOXELS"),
    (["--min-size", "mitochondria=1.5"], "whole number"),
    (["--min-size", "nucleus=10"], "does not have"),
    (["--seed-distance", "membrane=4", "--role", "membrane=none"], "no instance role"),
])
def test_a_bad_size_is_a_one_line_error(capsys, store, checkpoint, args, says):
    code, _, err = run_cli(capsys, "predict", checkpoint, store, "--instances", *args, *BLOCK)
    assert_one_line_error(code, err, expected=2)
    assert says in err
    assert list_labels(store) == []


def test_sizes_without_instances_say_to_add_it(capsys, store, checkpoint):
    code, _, err = run_cli(capsys, "predict", checkpoint, store, "--min-size",
                           "mitochondria=40", *BLOCK)
    assert_one_line_error(code, err, expected=2)
    assert "--min-size" in err and "add --instances" in err
