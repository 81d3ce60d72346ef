"""bioimage.io export from stores with channels (CZYX) and time points (TZYX), written by
ome-zarr-py: packages that bioimageio.core's test_model passes, whose input tensor has the
model's channels (each normalised on its own) and one time point."""

from __future__ import annotations

import zipfile
from pathlib import Path

import bioimageio.core
import numpy as np
import pytest
from bioimageio.spec.utils import read_yaml
from bioimageio_helpers import CHANNELS, block_network, volume

from napari_finetune.bioimageio.export import BioimageioExportError, export_bioimageio
from napari_finetune.model.checkpoint import save_checkpoint
from napari_finetune.model.unet import UNet
from test_cli_axes import write_store

SHAPE = (12, 40, 40)
TILE = (8, 32, 32)


def checkpoint(path: Path, in_channels: int = 1, metadata: dict | None = None) -> Path:
    model = UNet(dims=3, in_channels=in_channels, depth=1, features=4, out_channels=2)
    return save_checkpoint(path, model, {"channel_names": CHANNELS, **(metadata or {})})


def rdf_and_input(package: Path) -> tuple[dict, np.ndarray]:
    """The package's rdf.yaml and its input test tensor."""
    import io

    with zipfile.ZipFile(package) as archive:
        rdf = read_yaml(archive.read("rdf.yaml").decode())
        tensor = np.load(io.BytesIO(archive.read("input.npy")))
    return rdf, tensor


def passes_test_model(package: Path) -> None:
    summary = bioimageio.core.test_model(package)
    assert summary.status == "passed", [d for d in summary.details if d.status == "failed"]


def test_a_two_channel_model_exports_both_channels_normalised_each_on_its_own(
    tmp_path, monkeypatch
):
    attempts = block_network(monkeypatch)
    # Channels of different offset and contrast: one range for both would not reproduce.
    dim = (volume(SHAPE).astype(np.float32) * 0.2 + 10).astype(np.uint8)
    store = write_store(tmp_path / "czyx.zarr", np.stack([volume(SHAPE), dim]), "czyx",
                        ["DAPI", "GFP"])
    model = checkpoint(tmp_path / "m.pt", 2, {"input_channels": ["DAPI", "GFP"]})
    package = export_bioimageio(model, tmp_path / "m.zip", store, tile_shape=TILE)
    passes_test_model(package)  # bioimage.io's per-channel scale_range gives our outputs
    assert attempts == []
    rdf, tensor = rdf_and_input(package)
    axes = rdf["inputs"][0]["axes"]
    assert [a["type"] for a in axes] == ["batch", "channel", "space", "space", "space"]
    assert axes[1]["channel_names"] == ["DAPI", "GFP"]
    assert tensor.shape == (1, 2, *TILE)
    np.testing.assert_array_equal(tensor[0, 1], dim[2:10, 4:36, 4:36])  # the centre tile


def test_a_time_series_exports_its_middle_time_point(tmp_path):
    frames = np.stack([volume(SHAPE), volume(SHAPE) // 2 + 60, volume(SHAPE) // 3])
    store = write_store(tmp_path / "tzyx.zarr", frames, "tzyx")
    package = export_bioimageio(checkpoint(tmp_path / "m.pt"), tmp_path / "m.zip", store,
                                tile_shape=TILE)
    passes_test_model(package)
    rdf, tensor = rdf_and_input(package)
    assert [a["type"] for a in rdf["inputs"][0]["axes"]] == ["batch", "channel", "space",
                                                             "space", "space"]
    assert tensor.shape == (1, 1, *TILE)
    np.testing.assert_array_equal(tensor[0, 0], frames[1, 2:10, 4:36, 4:36])


def test_a_one_channel_model_on_two_channels_is_one_line(tmp_path):
    store = write_store(tmp_path / "czyx.zarr", np.stack([volume(SHAPE)] * 2), "czyx",
                        ["DAPI", "GFP"])
    out = tmp_path / "m.zip"
    with pytest.raises(BioimageioExportError) as info:
        export_bioimageio(checkpoint(tmp_path / "m.pt"), out, store, check=False)
    assert str(info.value) == (
        "the volume has 2 channels (0: DAPI, 1: GFP) and the model takes 1: cut the test "
        "tensors from the channel the model reads (save it as its own OME-Zarr image, or "
        "pass the model's input image)"
    )
    assert not out.exists()


def test_the_model_input_image_of_a_session_exports(tmp_path):
    """What the widget's Session holds: the store's image as the model takes it."""
    from napari_finetune.io.omezarr import open_volume

    store = write_store(tmp_path / "czyx.zarr", np.stack([volume(SHAPE)] * 2), "czyx",
                        ["DAPI", "GFP"])
    image = open_volume(store, keep_axes=True).input.channel(1)
    package = export_bioimageio(checkpoint(tmp_path / "m.pt"), tmp_path / "m.zip", image,
                                tile_shape=TILE, check=False)
    rdf, tensor = rdf_and_input(package)
    assert rdf["inputs"][0]["axes"][1]["channel_names"] == ["raw"]
    assert tensor.shape == (1, 1, *TILE)


def test_a_session_on_a_time_series_or_channels_exports_a_tested_package(tmp_path):
    """The panel's Export as bioimage.io on what the Session holds (its AxesImage)."""
    from tests.session.conftest import RecordingViewer, tiny_config

    from napari_finetune.io.omezarr import open_volume
    from napari_finetune.session.runner import InlineRunner
    from napari_finetune.session.session import Busy, Outcome, Session

    frames = np.stack([volume(SHAPE), volume(SHAPE) // 2 + 60])
    for axes, in_channels in (("tzyx", 1), ("czyx", 2)):
        store = write_store(tmp_path / f"{axes}.zarr", frames, axes)
        session = Session(InlineRunner(), viewer=RecordingViewer(),
                          image=open_volume(store, keep_axes=True).input,
                          checkpoint=str(checkpoint(tmp_path / f"{axes}.pt", in_channels)),
                          store=str(store), channel_names=CHANNELS, config=tiny_config())
        ends = []
        session.events.ended.connect(lambda end, ends=ends: ends.append(end))
        out = tmp_path / f"{axes}.zip"
        assert session.export_bioimageio(str(out)) is True  # test_model runs in the job
        assert [(e.action, e.outcome, e.reason) for e in ends] == [
            (Busy.BIOIMAGEIO, Outcome.DONE, "")]
        assert rdf_and_input(out)[1].shape[:2] == (1, in_channels)
