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
        "the volume has 2 channels (0: DAPI, 1: GFP) and the model takes 1, and its "
        "checkpoint records no channel it trained on: pass --channel 0 or --channel 1 "
        "(channel= in Python) for the channel the model reads"
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


def _two_channel_store(path: Path, names: list[str] | None) -> tuple[Path, np.ndarray]:
    """A CZYX store whose channels differ (the test input tells which one was cut)."""
    channels = np.stack([volume(SHAPE), volume(SHAPE) // 3 + 40])
    return write_store(path, channels, "czyx", names), channels


def test_a_one_channel_model_exports_the_channel_its_run_recorded(tmp_path):
    """By name where the store names its channels, else by the index train --channel
    records; channel= overrides both."""
    named, channels = _two_channel_store(tmp_path / "named.zarr", ["DAPI", "GFP"])
    model = checkpoint(tmp_path / "m.pt", metadata={"input_channels": ["GFP"],
                                                    "input_channel": 0})
    package = export_bioimageio(model, tmp_path / "m.zip", named, tile_shape=TILE)
    passes_test_model(package)
    np.testing.assert_array_equal(rdf_and_input(package)[1][0, 0],
                                  channels[1, 2:10, 4:36, 4:36])  # GFP, not index 0
    unnamed, _ = _two_channel_store(tmp_path / "unnamed.zarr", None)
    model = checkpoint(tmp_path / "i.pt", metadata={"input_channel": 1})
    package = export_bioimageio(model, tmp_path / "i.zip", unnamed, tile_shape=TILE,
                                check=False)
    np.testing.assert_array_equal(rdf_and_input(package)[1][0, 0],
                                  channels[1, 2:10, 4:36, 4:36])
    package = export_bioimageio(model, tmp_path / "o.zip", unnamed, tile_shape=TILE,
                                check=False, channel=0)
    np.testing.assert_array_equal(rdf_and_input(package)[1][0, 0],
                                  channels[0, 2:10, 4:36, 4:36])


@pytest.mark.parametrize(
    ("in_channels", "channel", "expected"),
    [
        (1, 2, "--channel 2: the volume has 2 channels (0: DAPI, 1: GFP); pass --channel 0 "
               "or --channel 1."),
        (2, 0, "--channel picks one channel for a single-channel model, but the model takes "
               "2; leave out --channel"),
    ],
)
def test_a_channel_that_does_not_fit_is_one_line(tmp_path, in_channels, channel, expected):
    store, _ = _two_channel_store(tmp_path / "czyx.zarr", ["DAPI", "GFP"])
    out = tmp_path / "m.zip"
    with pytest.raises(BioimageioExportError) as info:
        export_bioimageio(checkpoint(tmp_path / "m.pt", in_channels), out, store,
                          check=False, channel=channel)
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert not out.exists()


def test_cli_train_channel_then_export_cuts_that_channel(tmp_path, capsys):
    """train --channel 1 on a store without channel names, then export --bioimageio: the
    package (checked by bioimageio.core) has channel 1 as its test input; --channel
    overrides it with a note, and one that is not there is one line."""
    from napari_finetune.io.omezarr import save_corrections
    from napari_finetune.model.checkpoint import load_checkpoint
    from test_cli import TRAIN_FAST, assert_one_line_error, run_cli
    from test_cli_axes import painted

    store, channels = _two_channel_store(tmp_path / "czyx.zarr", None)
    save_corrections(store, painted(SHAPE))
    tuned = tmp_path / "tuned.pt"
    code, _, err = run_cli(capsys, "train", store, "-c", checkpoint(tmp_path / "m.pt"), "-o",
                           tuned, "--channel", "1", "--steps", "1", *TRAIN_FAST)
    assert code == 0, err
    assert load_checkpoint(tuned).metadata["input_channel"] == 1
    package = tmp_path / "tuned.zip"
    code, out, err = run_cli(capsys, "export", tuned, "--bioimageio", package, "--volume",
                             store, "--test-shape", *TILE)
    assert code == 0, err
    assert "test_model: passed" in out
    np.testing.assert_array_equal(rdf_and_input(package)[1][0, 0],
                                  channels[1, 2:10, 4:36, 4:36])
    other = tmp_path / "other.zip"
    code, _, err = run_cli(capsys, "export", tuned, "--bioimageio", other, "--volume", store,
                           "--test-shape", *TILE, "--channel", "0", "--no-check")
    assert code == 0, err
    assert "note: the model was trained on channel 1; the test tensors come from channel 0" in err
    np.testing.assert_array_equal(rdf_and_input(other)[1][0, 0],
                                  channels[0, 2:10, 4:36, 4:36])
    code, _, err = run_cli(capsys, "export", tuned, "--bioimageio", tmp_path / "x.zip",
                           "--volume", store, "--channel", "3", "--no-check")
    assert_one_line_error(code, err)
    assert "--channel 3: the volume has 2 channels; pass --channel 0 or --channel 1." in err
    code, _, err = run_cli(capsys, "export", tuned, "--torchscript", "--channel", "1")
    assert_one_line_error(code, err, expected=2)
    assert "--channel picks the channel of a bioimage.io package's test tensors" in err
