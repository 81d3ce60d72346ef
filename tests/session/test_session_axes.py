"""A Session given an ``AxesImage`` (channels, time points) predicts and fine-tunes as the
command line does, on real stores written by ome-zarr-py."""

from __future__ import annotations

import numpy as np
from tests.session.conftest import RecordingViewer, tiny_config

from napari_finetune.io.omezarr import load_corrections, open_volume, save_corrections
from napari_finetune.session.runner import InlineRunner
from napari_finetune.session.session import Busy, Session
from test_cli_axes import SPATIAL, image_of, model_file, painted, write_store


def session_on(store, checkpoint) -> Session:
    volume = open_volume(store, keep_axes=True)
    return Session(InlineRunner(), viewer=RecordingViewer(), image=volume.input,
                   checkpoint=str(checkpoint), corrections=load_corrections(store),
                   store=str(store), channel_names=["a", "b"], config=tiny_config())


def test_a_two_channel_image_predicts_and_fine_tunes(tmp_path):
    store = write_store(tmp_path / "czyx.zarr",
                        np.stack([image_of(SPATIAL, 0), image_of(SPATIAL, 1)]), "czyx")
    save_corrections(store, painted())
    session = session_on(store, model_file(tmp_path / "m.pt", in_channels=2))
    assert session.predict() is True
    assert [m.shape for m in session.prediction.masks] == [SPATIAL, SPATIAL]
    assert session.finetune() is True
    assert session.trainer is not None and session.trainer.steps_done == 2
    assert session.trainer.metadata["input_axes"] == "czyx"


def test_a_time_series_is_predicted_at_every_time_point(tmp_path):
    frames = np.stack([image_of(SPATIAL, seed) for seed in range(2)])
    store = write_store(tmp_path / "tzyx.zarr", frames, "tzyx")
    corrections = np.zeros((2, *SPATIAL), np.uint8)
    corrections[1] = painted()
    save_corrections(store, corrections)
    checkpoint = model_file(tmp_path / "m.pt")
    session = session_on(store, checkpoint)
    assert session.predict() is True
    masks = session.prediction.masks
    assert masks[0].shape == (2, *SPATIAL)
    for t in range(2):  # each time point as that frame alone
        alone = Session(InlineRunner(), image=frames[t], checkpoint=str(checkpoint),
                        channel_names=["a", "b"], config=tiny_config())
        assert alone.predict() is True
        np.testing.assert_array_equal(masks[0][t], alone.prediction.masks[0])
    assert session.finetune() is True
    assert session.busy is not Busy.TRAIN and session.trainer.steps_done == 2


def _balls(shape: tuple[int, ...], centres: list[tuple[int, int, int]]) -> np.ndarray:
    """A probability of 0.95 in balls of radius 5 around ``centres``, 0.05 elsewhere."""
    z, y, x = np.indices(shape)
    inside = np.zeros(shape, bool)
    for cz, cy, cx in centres:
        inside |= (z - cz) ** 2 + (y - cy) ** 2 + (x - cx) ** 2 <= 25
    return np.where(inside, 0.95, 0.05).astype(np.float32)


def test_objects_of_a_time_series_are_found_per_time_point(tmp_path):
    from napari_finetune.objects import ChannelRole

    frames = np.stack([image_of(SPATIAL, seed) for seed in range(2)])
    store = write_store(tmp_path / "tzyx.zarr", frames, "tzyx")
    corrections = np.zeros((2, *SPATIAL), np.uint8)
    corrections[1] = painted()
    save_corrections(store, corrections)
    session = session_on(store, model_file(tmp_path / "m.pt"))
    session.roles = {"b": ChannelRole(role="object")}
    assert session.predict() is True
    # Known objects in the prediction: two at time point 0, three at time point 1.
    prob = session.prediction.probabilities[1]
    assert prob.shape == (2, *SPATIAL)
    prob[0] = _balls(SPATIAL, [(8, 10, 10), (8, 28, 28)])
    prob[1] = _balls(SPATIAL, [(8, 10, 10), (8, 10, 28), (8, 28, 19)])
    ended = []
    session.events.ended.connect(ended.append)
    assert session.objects() is True
    assert ended[-1].reason == "", ended[-1]
    found = session.found_objects["b"]
    assert found.labels.shape == (2, *SPATIAL)
    assert [int(found.labels[t].max()) for t in range(2)] == [2, 3]  # ids per time point
    assert found.count == 5
    assert session.viewer.layers["objects-b"][0].shape == (2, *SPATIAL)


def test_objects_of_a_two_channel_image_are_the_models_channels(tmp_path):
    from napari_finetune.objects import ChannelRole

    store = write_store(tmp_path / "czyx.zarr",
                        np.stack([image_of(SPATIAL, 0), image_of(SPATIAL, 1)]), "czyx")
    save_corrections(store, painted())
    session = session_on(store, model_file(tmp_path / "m.pt", in_channels=2))
    session.roles = {"b": ChannelRole(role="object")}
    assert session.predict() is True
    session.prediction.probabilities[1][:] = _balls(SPATIAL, [(8, 10, 10), (8, 28, 28)])
    ended = []
    session.events.ended.connect(ended.append)
    assert session.objects() is True
    assert ended[-1].reason == "", ended[-1]
    found = session.found_objects["b"]
    assert found.labels.shape == SPATIAL and found.count == 2


def test_a_time_series_run_takes_the_stores_spatial_voxel_size(tmp_path, caplog):
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    frames = np.stack([image_of(SPATIAL, seed) for seed in range(3)])
    store = tmp_path / "tzyx.zarr"
    write_image(frames, zarr.group(store=parse_url(str(store), mode="w").store),
                axes="tzyx", scale_factors=[],
                scale={"t": 1.0, "z": 2.0, "y": 0.5, "x": 0.5})
    corrections = np.zeros((3, *SPATIAL), np.uint8)
    corrections[1] = painted()
    save_corrections(store, corrections)
    session = session_on(store, model_file(tmp_path / "m.pt"))
    assert session.finetune() is True
    assert session.trainer.config.voxel_size == (2.0, 0.5, 0.5)
    assert "voxel size" not in caplog.text  # no line saying it is unknown


def test_a_run_on_one_channel_of_an_unnamed_store_records_its_index(tmp_path):
    from napari_finetune.bioimageio.export import trained_channel
    from napari_finetune.model.checkpoint import load_checkpoint

    store = write_store(tmp_path / "czyx.zarr",
                        np.stack([image_of(SPATIAL, 0), image_of(SPATIAL, 1)]), "czyx")
    save_corrections(store, painted())
    session = session_on(store, model_file(tmp_path / "m.pt"))
    stored = open_volume(store, keep_axes=True).input
    assert stored.channel_names == ()  # no omero names: only the index says which
    session.image = stored.for_model(1, 1)  # the panel's Channel row: channel 1
    assert session.finetune() is True
    assert session.trainer.steps_done == 2
    out = tmp_path / "tuned.pt"
    assert session.export(str(out)) is True
    metadata = load_checkpoint(out).metadata
    assert metadata["input_channel"] == 1
    assert trained_channel(metadata, stored) == 1  # export --bioimageio needs no --channel


def test_save_predictions_of_a_time_series_writes_labels_for_every_time_point(tmp_path):
    """Save in the panel on a TZYX store: the masks and objects go into the store's
    labels with its time axis (it failed on opening the store as one ZYX volume)."""
    frames = np.stack([image_of(SPATIAL, seed) for seed in range(2)])
    store = write_store(tmp_path / "tzyx.zarr", frames, "tzyx")
    corrections = np.zeros((2, *SPATIAL), np.uint8)
    corrections[0] = painted()
    save_corrections(store, corrections)
    session = session_on(store, model_file(tmp_path / "m.pt"))
    assert session.predict() is True
    assert session.save_predictions() is True
    import zarr

    group = zarr.open_group(str(store / "labels" / "prediction-a"), mode="r")
    attrs = group.attrs.asdict()
    multiscale = attrs.get("ome", attrs)["multiscales"][0]
    assert [a["name"] for a in multiscale["axes"]] == ["t", "z", "y", "x"]
    written = np.asarray(group[multiscale["datasets"][0]["path"]])
    assert written.shape == (2, *SPATIAL)
    np.testing.assert_array_equal(written, session.prediction.masks[0])
