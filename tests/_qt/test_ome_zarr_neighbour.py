"""The widget on a store opened by napari-ome-zarr: it finds the store and autosaves there."""

from __future__ import annotations

import numpy as np
from qtpy.QtCore import Qt
from tests._qt.conftest import choose_checkpoint, wait_idle


def test_store_opened_by_napari_ome_zarr_gets_autosaved_corrections(
    make_napari_viewer, qtbot, tiny_store, tiny_checkpoint
):
    """It used to find no store (no metadata["ome_zarr_path"]): no autosave, no saving."""
    from napari_finetune.io.omezarr import load_corrections
    from ngff_validation import assert_valid_ngff

    viewer = make_napari_viewer()
    image = viewer.open(str(tiny_store), plugin="napari-ome-zarr")[0]
    assert "ome_zarr_path" not in image.metadata
    _, widget = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")
    choose_checkpoint(qtbot, widget, str(tiny_checkpoint))
    qtbot.waitUntil(lambda: widget.state.info is not None, timeout=20_000)
    try:
        assert widget.image_combo.value is image
        assert widget.store_hint() == tiny_store
        # The store's units, as napari-ome-zarr gives them for a store that has them: the
        # layers the widget adds carry the same (napari warns of layers whose units differ).
        image.units = ("micrometer",) * image.ndim
        qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
        layer = viewer.layers["corrections"]
        assert layer.units == image.units
        saver = widget.state.autosaver
        assert saver is not None
        saver.timer.setInterval(50)
        layer.paint((8, 30, 30), 2)
        qtbot.waitUntil(lambda: saver.saves >= 1 and saver.in_flight == 0, timeout=20_000)
        np.testing.assert_array_equal(load_corrections(tiny_store), layer.data)
        assert_valid_ngff(tiny_store)
    finally:
        wait_idle(qtbot, widget)
