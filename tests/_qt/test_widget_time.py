"""The widget on a time series (TZYX) opened by napari-ome-zarr: the corrections have the
time axis (napari's time slider), a run trains on the painted time points and Predict
fills every time point."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from qtpy.QtCore import Qt
from tests._qt.conftest import choose_checkpoint, dock_panel, make_volume, wait_idle

TIMES = 3


@pytest.fixture
def tzyx_store(tmp_path: Path) -> Path:
    """Three time points of the tiny volume (each its own noise), by ome-zarr-py."""
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    path = tmp_path / "tzyx.ome.zarr"
    group = zarr.group(store=parse_url(str(path), mode="w").store)
    series = np.stack([make_volume(seed=t) for t in range(TIMES)])
    write_image(series, group, axes="tzyx", scale_factors=[],
                storage_options={"chunks": (1, 16, 32, 32)})
    return path


def test_a_time_series_is_painted_trained_and_predicted_per_time_point(
    make_napari_viewer, qtbot, tzyx_store, tiny_checkpoint
):
    from napari_finetune.arrays import AxesImage
    from napari_finetune.io.omezarr import load_corrections

    viewer = make_napari_viewer()
    (image,) = viewer.open(str(tzyx_store), plugin="napari-ome-zarr")
    assert tuple(image.level_shapes[0]) == (TIMES, 16, 64, 64)
    widget = dock_panel(viewer, qtbot)
    choose_checkpoint(qtbot, widget, str(tiny_checkpoint))
    qtbot.waitUntil(lambda: widget.state.info is not None and widget.state.warming == 0,
                    timeout=60_000)
    try:
        assert widget.channel_pick.isHidden()  # one channel: nothing to choose
        qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
        layer = viewer.layers["corrections"]
        assert layer.data.shape == (TIMES, 16, 64, 64)
        layer.brush_size = 5
        for t in (0, 2):  # two time points painted, the middle one not
            for z in (6, 8, 10):
                layer.paint((t, z, 24, 24), 3)
                layer.paint((t, z, 8, 40), 1)
        s = widget.settings
        s.steps.value, s.batch_size.value, s.device.value = 2, 1, "cpu"
        s.preview_interval.value = 0.0
        qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
        wait_idle(qtbot, widget)
        assert not widget.state.errors, widget.state.errors
        kinds = [status.kind for status in widget.state.statuses]
        assert kinds and kinds[-1] == "finished", kinds
        np.testing.assert_array_equal(load_corrections(tzyx_store), layer.data)
        session = widget.controller.session
        assert isinstance(session.image, AxesImage) and session.image.axes == "tzyx"
        # The prediction after the run: every time point, in the TZYX layers.
        assert session.prediction is not None
        masks = session.prediction.masks
        assert all(tuple(mask.shape) == (TIMES, 16, 64, 64) for mask in masks)
        shown = viewer.layers["mitochondria prediction"].data
        assert shown.shape == (TIMES, 16, 64, 64)
    finally:
        wait_idle(qtbot, widget)


def test_objects_of_a_time_series_are_found_per_time_point(
    make_napari_viewer, qtbot, tzyx_store, tmp_path
):
    from tests._qt.objects_setup import LAYER_NAMES, ROLES, save_tiny_unet

    checkpoint = save_tiny_unet(tmp_path / "tiny_roles.pt", ROLES)
    viewer = make_napari_viewer()
    viewer.open(str(tzyx_store), plugin="napari-ome-zarr")
    widget = dock_panel(viewer, qtbot)
    choose_checkpoint(qtbot, widget, str(checkpoint))
    qtbot.waitUntil(lambda: widget.state.info is not None and widget.state.warming == 0,
                    timeout=60_000)
    try:
        qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
        wait_idle(qtbot, widget)
        assert widget.objects_button.isEnabled()
        qtbot.mouseClick(widget.objects_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: widget.state.errors or all(
            name in viewer.layers for name in LAYER_NAMES.values()), timeout=60_000)
        wait_idle(qtbot, widget)
        # Before, Objects failed: "expected (Y, X) or (Z, Y, X) probability, got shape
        # (3, 16, 64, 64)".
        assert not widget.state.errors, widget.state.errors
        for name in LAYER_NAMES.values():  # on napari's time slider, ids per time point
            assert viewer.layers[name].data.shape == (TIMES, 16, 64, 64)
        found = widget.controller.session.found_objects["mitochondria"]
        assert found.count == sum(int(found.labels[t].max()) for t in range(TIMES))
    finally:
        wait_idle(qtbot, widget)
