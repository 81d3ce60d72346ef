"""The widget on a store with channels (CZYX) opened by napari-ome-zarr: a single-channel
model asks which channel before any painting, then paints, trains and predicts on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from qtpy.QtCore import Qt
from tests._qt.conftest import choose_checkpoint, dock_panel, make_volume, wait_idle

from ngff_stores import omero_metadata

CHANNELS = ["DAPI", "GFP"]


@pytest.fixture
def czyx_store(tmp_path: Path) -> Path:
    """Two channels with omero labels, written by ome-zarr-py: GFP is the tiny volume,
    DAPI its negative (so a run on the wrong channel trains on other data)."""
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    volume = make_volume()
    path = tmp_path / "czyx.ome.zarr"
    group = zarr.group(store=parse_url(str(path), mode="w").store)
    write_image(np.stack([255 - volume, volume]), group, axes="czyx", scale_factors=[],
                storage_options={"chunks": (1, 16, 32, 32)})
    ome = dict(group.attrs["ome"])
    ome["omero"] = omero_metadata(CHANNELS)
    group.attrs["ome"] = ome
    return path


def test_a_single_channel_model_asks_for_the_channel_then_trains_on_it(
    make_napari_viewer, qtbot, czyx_store, tiny_checkpoint
):
    from napari_finetune.arrays import AxesImage
    from napari_finetune.io.omezarr import load_corrections

    viewer = make_napari_viewer()
    layers = viewer.open(str(czyx_store), plugin="napari-ome-zarr")
    # napari-ome-zarr gives the channel axis: napari splits it, one ZYX layer per channel.
    assert len(layers) == 2
    assert all(tuple(layer.level_shapes[0]) == (16, 64, 64) for layer in layers)
    widget = dock_panel(viewer, qtbot)
    choose_checkpoint(qtbot, widget, str(tiny_checkpoint))
    qtbot.waitUntil(lambda: widget.state.info is not None and widget.state.warming == 0,
                    timeout=60_000)
    try:
        pick = widget.channel_pick
        assert not pick.isHidden() and pick.needed, (widget.store_hint(), widget.store_image())
        combo = pick.combo
        assert [combo.itemText(i) for i in range(combo.count())] == [
            "choose a channel…", "0: DAPI", "1: GFP"]
        # Nothing to paint before the channel is chosen, and the button says why.
        assert not widget.new_corrections_button.isEnabled()
        assert widget.new_corrections_button.toolTip() == "choose the channel first"
        assert not widget.predict_button.isEnabled()
        combo.setCurrentIndex(2)  # "1: GFP"
        assert pick.choice() == 1 and widget.new_corrections_button.isEnabled()

        qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
        layer = viewer.layers["corrections"]
        assert layer.data.shape == (16, 64, 64)  # the spatial shape, no channel axis
        layer.brush_size = 5
        for z in (6, 8, 10):
            layer.paint((z, 24, 24), 3)
            layer.paint((z, 8, 40), 1)
        s = widget.settings
        s.steps.value, s.batch_size.value, s.device.value = 2, 1, "cpu"
        s.preview_interval.value = 0.0
        qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
        wait_idle(qtbot, widget)
        assert not widget.state.errors, widget.state.errors
        kinds = [status.kind for status in widget.state.statuses]
        assert kinds and kinds[-1] == "finished", kinds
        np.testing.assert_array_equal(load_corrections(czyx_store), layer.data)
        # The run (and the prediction after it) saw channel 1 of the store, not the layer's.
        image = widget.controller.session.image
        assert isinstance(image, AxesImage) and image.axes == "zyx"
        assert image.channel_names == ("GFP",)
        np.testing.assert_array_equal(np.asarray(image.array), make_volume())
        assert viewer.layers["mitochondria prediction"].data.shape == (16, 64, 64)
    finally:
        wait_idle(qtbot, widget)
