"""Channels (CZYX) and time points (TZYX) train on a dask worker as they train in process.

The stores are written by ome-zarr-py. On a real LocalCluster the command line's
``train --scheduler`` (the worker reads the store: a filesystem both see) and the
Python API without a store path (the tiles around the painting travel, every channel
of the painted time points only) export the in-process run's weights; a preview of a
time point nobody painted comes back as a local predict with that step's weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from napari_finetune.arrays import AxesImage
from napari_finetune.config import FinetuneConfig
from napari_finetune.devices import model_in_channels
from napari_finetune.io.omezarr import load_corrections, open_volume, save_corrections
from napari_finetune.loading import load_checkpoint
from napari_finetune.remote.finetuner import RemoteFinetuner
from napari_finetune.remote.tiles import ImageTiles, Painting, StoredImage, TileVolume
from napari_finetune.trainer.loop import Finetuner
from test_cli import TRAIN_FAST, run_cli
from test_cli_axes import image_of, model_file, painted, write_store

SPATIAL = (16, 40, 40)
PATCH = (8, 16, 16)


def czyx_store(path: Path) -> Path:
    """Two channels of different intensities (their normalisation ranges differ)."""
    second = image_of(SPATIAL, 1) // 2 + 100
    store = write_store(path, np.stack([image_of(SPATIAL, 0), second]), "czyx", ["DAPI", "GFP"])
    save_corrections(store, painted())
    return store


def tzyx_store(path: Path) -> Path:
    """Three time points, the first and the last painted (the middle one never travels)."""
    store = write_store(path, np.stack([image_of(SPATIAL, seed) for seed in range(3)]), "tzyx")
    corrections = np.zeros((3, *SPATIAL), np.uint8)
    corrections[0] = painted()
    corrections[2, 8, 10:20, 10:20] = 2
    corrections[2, 12, 2:6, 30:36] = 1
    save_corrections(store, corrections)
    return store


def tczyx_store(path: Path) -> Path:
    frames = np.stack([np.stack([image_of(SPATIAL, 2 * t), image_of(SPATIAL, 2 * t + 1)])
                       for t in range(3)])
    store = write_store(path, frames, "tczyx", ["DAPI", "GFP"])
    corrections = np.zeros((3, *SPATIAL), np.uint8)
    corrections[0] = painted()
    corrections[2, 8, 10:20, 10:20] = 2
    save_corrections(store, corrections)
    return store


def assert_same_weights(ours: Path, theirs: Path) -> None:
    mine, other = load_checkpoint(ours).model.state_dict(), load_checkpoint(theirs).model
    for name, value in other.state_dict().items():
        torch.testing.assert_close(mine[name], value, rtol=0, atol=1e-6)


# --- what travels: no cluster ---------------------------------------------------------------


@pytest.mark.parametrize("axes", ["czyx", "tzyx", "tczyx", "tcyx"])
def test_the_tiles_read_every_box_a_patch_reads_as_the_whole_image_gives_it(axes):
    rng = np.random.default_rng(0)
    sizes = {"t": 3, "c": 2, "z": 12, "y": 40, "x": 36}
    image = AxesImage(rng.random(tuple(sizes[a] for a in axes)).astype(np.float32), axes)
    painting = np.zeros(image.labels_shape, np.uint8)
    spatial = (slice(None),) * len(image.spatial_axes)
    if image.has_time:
        painting[(0, *(slice(2, 5),) * len(spatial))] = 1
        painting[(2, *(slice(8, 11),) * len(spatial))] = 2
    else:
        painting[(slice(2, 5),) * len(spatial)] = 1
    patch = (4, 8, 8)[-len(spatial):]
    tiles = ImageTiles.read(image, Painting.of(painting), patch)
    assert tiles.nbytes == ImageTiles.planned_nbytes(image, Painting.of(painting), patch)
    on_worker = tiles.volume()
    assert on_worker.axes == axes and on_worker.shape == image.shape
    # Only the painted time points travel (a patch spans one), every channel of them.
    if image.has_time:
        assert {index[0] for index in tiles.tiles} == {0, 2}
        assert tiles.nbytes < image.array.nbytes * 2 / 3
    # Every box a patch anchored on a painted voxel can read, as AxesImage.read reads it.
    for anchor in np.argwhere(painting):
        box = tuple(slice(max(0, a - p + 1), min(a + p, s)) for a, p, s in zip(
            anchor[-len(patch):], patch, image.spatial_shape, strict=True))
        box = ((slice(int(anchor[0]), int(anchor[0]) + 1),) if image.has_time else ()) + box
        np.testing.assert_array_equal(on_worker.read(box), image.read(box))
    box = ((1,) if image.has_time else ()) + (slice(0, 4),) * len(spatial)
    if image.has_time:  # a time point nobody painted is not there: a clear error
        with pytest.raises(IndexError, match="was not sent to this worker"):
            on_worker.read(box)


def test_a_plain_volumes_tiles_read_as_before():
    image = np.arange(8 * 32 * 32, dtype=np.uint16).reshape(8, 32, 32)
    painting = np.zeros(image.shape, np.uint8)
    painting[1, 2, 3] = 1
    volume = TileVolume(ImageTiles.read(image, Painting.of(painting), (4, 8, 8)))
    box = (slice(0, 5), slice(0, 10), slice(0, 11))
    np.testing.assert_array_equal(volume[box], image[box])
    with pytest.raises(IndexError, match="was not sent to this worker"):
        volume[(slice(0, 2), slice(24, 32), slice(24, 32))]


def test_a_channel_taken_of_a_store_is_taken_where_the_store_is_opened(tmp_path):
    store = czyx_store(tmp_path / "czyx.zarr")
    image = open_volume(store, keep_axes=True).input.for_model(1, channel=1)
    stored = StoredImage.of(str(store), image)
    assert stored.takes == ((0, 1),) and stored.axes == "" and stored.shape == SPATIAL
    assert stored.mismatch() is None
    box = (slice(2, 6), slice(0, 16), slice(8, 24))
    np.testing.assert_array_equal(stored.open().array[box], np.asarray(image.array[box]))
    every = open_volume(store, keep_axes=True).input
    assert StoredImage.of(str(store), every).mismatch() is None
    # A client image that is not what the path holds is said, and the tiles go instead.
    other = StoredImage.of(str(store), AxesImage(np.zeros((2, 16, 40, 32), np.uint8), "czyx"))
    assert "the client's image (2, 16, 40, 32) uint8 CZYX" in other.mismatch()


# --- on a real LocalCluster -----------------------------------------------------------------


@pytest.mark.resource
@pytest.mark.parametrize("kind", ["czyx", "czyx --channel 1", "tzyx"])
def test_train_on_a_scheduler_trains_channels_and_time_points_as_in_process(
    capsys, tmp_path, client, kind
):
    if kind == "tzyx":
        store, model, extra = tzyx_store(tmp_path / "s.zarr"), model_file(tmp_path / "m.pt"), []
    else:
        store = czyx_store(tmp_path / "s.zarr")
        channel = kind.endswith("--channel 1")
        model = model_file(tmp_path / "m.pt", 1 if channel else 2)
        extra = ["--channel", "1"] if channel else []
    args = ["train", store, "-c", model, "--steps", "3", *extra, *TRAIN_FAST]
    code, _, err = run_cli(capsys, *args, "-o", tmp_path / "local.pt")
    assert code == 0, err
    address = client.scheduler.address
    code, stdout, err = run_cli(capsys, *args, "-o", tmp_path / "remote.pt",
                                "--scheduler", address)
    assert code == 0, err
    assert "finished after 3/3 steps" in stdout
    assert f"the worker reads it from {store}" in stdout
    assert_same_weights(tmp_path / "remote.pt", tmp_path / "local.pt")
    metadata = load_checkpoint(tmp_path / "remote.pt").metadata
    local = load_checkpoint(tmp_path / "local.pt").metadata
    assert metadata.get("input_axes") == local.get("input_axes")
    assert metadata.get("input_channels") == local.get("input_channels")
    assert metadata["run"]["painted_voxels"] == local["run"]["painted_voxels"]
    assert metadata["run"]["worker"] in client.scheduler_info()["workers"]


def config(**overrides) -> FinetuneConfig:
    settings = dict(steps=3, batch_size=2, accumulation=1, patch_shape=PATCH,
                    learning_rate=1e-3, mode="full", mixed_precision=False, device="cpu",
                    seed=0, validation_fraction=0.0)
    settings.update(overrides)
    return FinetuneConfig(**settings)


def opened(store: Path, model: Path) -> tuple[AxesImage, np.ndarray]:
    image = open_volume(store, keep_axes=True).input
    return (image.for_model(model_in_channels(load_checkpoint(model).model)),
            np.asarray(load_corrections(store)))


@pytest.mark.resource
@pytest.mark.parametrize("axes", ["czyx", "tzyx"])
def test_the_tiles_of_channels_and_time_points_train_as_in_process(client, tmp_path, axes):
    store = (czyx_store if axes == "czyx" else tzyx_store)(tmp_path / "s.zarr")
    model = model_file(tmp_path / "m.pt", 2 if axes == "czyx" else 1)
    image, _ = opened(store, model)
    # Strokes in a corner: part of the image never travels, so the worker cannot measure
    # the normalisation on the whole image and must take the client's ranges.
    corrections = np.zeros(image.labels_shape, np.uint8)
    corrections[..., 2, 2:6, 2:6] = 1
    corrections[..., 3, 6:9, 6:9] = 2
    local = Finetuner.from_checkpoint(load_checkpoint(model), image, corrections, config())
    local_losses = [s.loss for s in local.run() if s.kind == "step"]
    local.export(tmp_path / "local.pt")
    remote = RemoteFinetuner.remote(load_checkpoint(model), image, corrections, config(),
                                    client)
    losses = [s.loss for s in remote.run() if s.kind == "step"]
    assert not remote.store_used
    # The tiles around the painting, every channel; of a time series the painted time
    # points only (two of three here).
    assert remote.bytes_sent == sum(remote.planned_bytes().values())
    assert remote.planned_bytes()["image"] < remote.volume_bytes * 2 / 3
    np.testing.assert_allclose(losses, local_losses, rtol=0, atol=1e-6)
    remote.export(tmp_path / "remote.pt")
    assert_same_weights(tmp_path / "remote.pt", tmp_path / "local.pt")


@pytest.mark.resource
@pytest.mark.parametrize("by_store", [False, True], ids=["tiles", "store"])
def test_a_preview_of_a_time_point_nobody_painted_comes_back_as_a_local_predict(
    client, tmp_path, by_store
):
    store = tczyx_store(tmp_path / "s.zarr")
    model = model_file(tmp_path / "m.pt", 2)
    image, corrections = opened(store, model)
    remote = RemoteFinetuner.remote(
        load_checkpoint(model), image, corrections,
        config(steps=40, learning_rate=1e-2), client, weights_every=1,
        store_path=store if by_store else None)
    region = (slice(1, 2), slice(0, 8), slice(24, 40), slice(24, 40))  # time point 1
    previews = 0
    for status in remote.run():
        if status.kind == "step" and status.step == 1:
            remote.request_preview(region)
        preview = remote.take_preview()
        if preview is not None:
            assert preview[0] == region and preview[1].shape == (2, 8, 16, 16)
            assert remote.preview_step == remote.steps_done
            np.testing.assert_allclose(preview[1], remote.predict(region), rtol=0, atol=1e-5)
            previews += 1
            remote.stop()
    assert previews == 1 and remote.store_used is by_store
    with pytest.raises(ValueError, match="4 unit-step slices of the image's painting"):
        remote.request_preview(region[1:])


@pytest.mark.resource
def test_a_session_run_on_a_scheduler_trains_a_store_with_channels(client, tmp_path):
    """The panel's run (a Session, headless) on a CZYX store: the worker reads the store
    and trains both channels; a preview of the region in view comes back."""
    from napari_finetune.session.events import Preview
    from napari_finetune.session.runner import InlineRunner
    from napari_finetune.session.session import Busy, Outcome, Session

    store = czyx_store(tmp_path / "s.zarr")
    model = model_file(tmp_path / "m.pt", 2)
    image, corrections = opened(store, model)
    session = Session(
        InlineRunner(), image=image, checkpoint=str(model), corrections=corrections,
        store=str(store), channel_names=["a", "b"], config=config(steps=4),
        scheduler=str(client.scheduler.address), preview_interval_s=1e-6,
        region=(slice(0, 8), slice(0, 16), slice(8, 24)),
    )
    events: list[object] = []
    ended: list[object] = []
    session.events.job_event.connect(events.append)
    session.events.ended.connect(ended.append)
    assert session.finetune() is True
    assert [(e.action, e.outcome) for e in ended] == [(Busy.TRAIN, Outcome.DONE)], ended
    trainer = session.trainer
    assert trainer.run_record["steps_done"] == 4 and trainer.store_used is True
    assert trainer.metadata["input_channels"] == ["DAPI", "GFP"]
    previews = [e for e in events if isinstance(e, Preview)]
    assert previews and previews[-1].probs.shape == (2, 8, 16, 16)
