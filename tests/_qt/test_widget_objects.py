"""The Objects step, clicked in a docked widget: layers, counts, no roles, saving.

Saving's all-or-nothing write is the Session's, tested headless in tests/session.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from napari.layers import Labels
from qtpy.QtCore import Qt
from tests._qt.conftest import CHANNELS, choose_checkpoint, make_volume, wait_idle
from tests._qt.objects_setup import LAYER_NAMES, ROLES, save_tiny_unet

from napari_finetune._qt.layers import OBJECTS_KEY
from napari_finetune.objects import instances_of


@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> Path:
    """The conftest's tiny UNet, with a role for each channel (the docked widget loads it)."""
    return save_tiny_unet(tmp_path / "tiny_roles.pt", ROLES)


@pytest.fixture
def tiny_store(tmp_path: Path) -> Path:
    """The conftest's tiny store with a second, 2x smaller level (Save writes every level)."""
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    path = tmp_path / "tiny-two-levels.ome.zarr"
    root = zarr.group(store=parse_url(str(path), mode="w").store)
    write_image(make_volume(), root, axes="zyx", scale_factors=[{"z": 1, "y": 2, "x": 2}],
                storage_options={"chunks": (16, 32, 32)})
    return path


def _predict_then_objects(qtbot, widget) -> float:
    """Predict, then click Objects; returns how long the Objects click handler took."""
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert widget.objects_button.isEnabled()
    start = time.perf_counter()
    qtbot.mouseClick(widget.objects_button, Qt.LeftButton)
    return time.perf_counter() - start


def _wait_for_objects(qtbot, viewer, widget) -> None:
    qtbot.waitUntil(lambda: all(name in viewer.layers for name in LAYER_NAMES.values()),
                    timeout=60_000)
    wait_idle(qtbot, widget)
    assert not widget.state.errors, widget.state.errors


def _predict_objects_and_save(qtbot, viewer, widget) -> None:
    """Predict, Objects, then Save predictions; the save went through without an error."""
    _predict_then_objects(qtbot, widget)
    _wait_for_objects(qtbot, viewer, widget)
    qtbot.mouseClick(widget.save_predictions_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert not widget.state.errors, widget.state.errors


@pytest.mark.serial  # bounds the Objects click's time on the main thread
def test_objects_button_shows_one_labels_layer_and_count_per_role_channel(docked, qtbot):
    viewer, widget, image = docked
    assert "cells (membrane, boundary)" in widget.objects_label.text()
    assert not widget.objects_button.isEnabled()  # nothing predicted yet
    took = _predict_then_objects(qtbot, widget)
    # The click only starts the worker: no layer yet when it returns, and it returned fast.
    assert not any(name in viewer.layers for name in LAYER_NAMES.values())
    assert took < 0.5, f"the Objects click took {took:.2f} s on the main thread"
    _wait_for_objects(qtbot, viewer, widget)

    probabilities = widget.state.probabilities
    assert sorted(probabilities) == sorted(ROLES)
    for channel, prob in probabilities.items():
        assert prob.dtype == np.float32 and prob.shape == image.data.shape
        # One prediction gave both: the mask layer is this probability above 0.5.
        mask = viewer.layers[f"{channel} prediction"].data
        np.testing.assert_array_equal(mask, (prob > 0.5).astype(np.uint8))
    stacked = np.stack([probabilities[c] for c in CHANNELS])
    expected = instances_of(stacked, ROLES, CHANNELS)
    log = widget.status_panel.log.toPlainText()
    for channel, name in LAYER_NAMES.items():
        layer = viewer.layers[name]
        assert isinstance(layer, Labels) and layer.data.dtype == np.uint32
        assert layer.metadata[OBJECTS_KEY] == channel
        np.testing.assert_array_equal(layer.data, expected[channel])
        count = int(layer.data.max())
        assert count >= 2, f"{name}: too few objects for the test to mean anything"
        # Ids unique: exactly 1..N, each one object (consecutive, as instances_of numbers them).
        np.testing.assert_array_equal(np.unique(layer.data), np.arange(count + 1))
        assert f"{name}: {count}" in log
        assert f"{name}: {count}" in widget.objects_label.text()


def test_a_checkpoint_without_roles_points_at_the_editor_and_adds_no_layer(
    docked, qtbot, tmp_path
):
    viewer, widget, image = docked
    path = save_tiny_unet(tmp_path / "no_roles.pt", {})
    choose_checkpoint(qtbot, widget, path)
    qtbot.waitUntil(lambda: widget.state.info is not None
                    and widget.state.info.path == str(path), timeout=20_000)
    editor = widget.roles_editor
    assert not editor.isHidden() and sorted(editor.inputs) == sorted(CHANNELS)
    assert all(inputs.role.value == "none" for inputs in editor.inputs.values())
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert widget.state.probabilities == {}  # no role: no probability kept
    message = widget.objects_label.text()
    assert "no channel an instance role" in message and "under Objects" in message
    assert "--role membrane=" in message and "\n" not in message
    qtbot.mouseClick(widget.objects_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert message in widget.status_panel.log.toPlainText()
    assert not [layer for layer in viewer.layers if OBJECTS_KEY in layer.metadata]
    assert not widget.state.errors


def _labels_levels(store: str, name: str) -> list[np.ndarray]:
    import zarr

    group = zarr.open_group(f"{store}/labels/{name}", mode="r")
    paths = [d["path"] for d in group.attrs["ome"]["multiscales"][0]["datasets"]]
    return [np.asarray(group[p]) for p in paths]


def test_saved_objects_are_uint32_pyramids_that_napari_ome_zarr_opens(
        docked, qtbot, make_napari_viewer):
    """Save predictions writes each objects layer as uint32 labels with the image's levels,
    and another reader sees them: napari-ome-zarr shows each as a Labels layer holding the
    same ids. (A save that fails part way: the Session's tests.)"""
    from napari_finetune.io.omezarr import list_labels, open_volume

    viewer, widget, image = docked
    _predict_objects_and_save(qtbot, viewer, widget)
    store = image.metadata["ome_zarr_path"]
    image_levels = len(open_volume(store).levels)
    for channel, name in LAYER_NAMES.items():
        assert f"objects-{channel}" in list_labels(store)
        levels = _labels_levels(store, f"objects-{channel}")
        assert len(levels) == image_levels == 2  # the image's pyramid
        assert levels[1].shape == (16, 32, 32) and levels[1].dtype == np.uint32
        assert levels[0].dtype == np.uint32
        np.testing.assert_array_equal(levels[0], viewer.layers[name].data)
    assert "objects-membrane" in widget.output_label.text()

    other = make_napari_viewer()
    opened = other.open(store, plugin="napari-ome-zarr")
    # napari-ome-zarr names a label image by its path ("labels/labels/objects-membrane").
    labels = {layer.name.rsplit("/", 1)[-1]: layer for layer in opened
              if isinstance(layer, Labels)}
    assert {f"objects-{channel}" for channel in LAYER_NAMES} <= set(labels), list(labels)
    for channel, name in LAYER_NAMES.items():
        layer = labels[f"objects-{channel}"]
        level0 = layer.data[0] if layer.multiscale else layer.data
        assert level0.dtype == np.uint32
        written = viewer.layers[name].data
        assert int(written.max()) >= 2
        np.testing.assert_array_equal(np.asarray(level0), written)
