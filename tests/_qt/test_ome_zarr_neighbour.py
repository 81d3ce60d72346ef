"""The widget on a store opened by napari-ome-zarr, or read-only: it finds where the
painting goes and autosaves there."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from qtpy.QtCore import Qt
from tests._qt.conftest import choose_checkpoint, dock_panel, wait_idle


def test_store_opened_by_napari_ome_zarr_gets_autosaved_corrections(
    make_napari_viewer, qtbot, tiny_store, tiny_checkpoint
):
    """It used to find no store (no metadata["ome_zarr_path"]): no autosave, no saving."""
    from napari_finetune.io.omezarr import load_corrections
    from ngff_validation import assert_valid_ngff

    viewer = make_napari_viewer()
    image = viewer.open(str(tiny_store), plugin="napari-ome-zarr")[0]
    assert "ome_zarr_path" not in image.metadata
    widget = dock_panel(viewer, qtbot)
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


@contextmanager
def _read_only(store: Path) -> Iterator[None]:
    """``store``'s folders without any write bit (honoured even as root), given back after."""
    folders = [store, *(p for p in store.rglob("*") if p.is_dir())]
    modes = {p: p.stat().st_mode for p in folders}
    for p in folders:
        os.chmod(p, modes[p] & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        yield
    finally:
        for p, mode in modes.items():
            os.chmod(p, mode)


def test_a_read_only_store_is_autosaved_beside_it_and_found_when_reopened(
    make_napari_viewer, qtbot, tiny_store, tiny_checkpoint
):
    """Painting on a read-only store used to fail at every save; it goes to the sibling
    ``tiny.corrections.ome.zarr``, which the panel names, and the store reopened shows it."""
    from napari_finetune.io.omezarr import load_corrections

    sibling = tiny_store.parent / "tiny.corrections.ome.zarr"
    with _read_only(tiny_store):
        viewer = make_napari_viewer()
        viewer.open(str(tiny_store), plugin="napari-finetune")
        widget = dock_panel(viewer, qtbot)
        choose_checkpoint(qtbot, widget, str(tiny_checkpoint))
        qtbot.waitUntil(lambda: widget.state.info is not None, timeout=20_000)
        try:
            qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
            assert sibling.name in widget.autosave_label.text()
            assert "read-only" in widget.autosave_label.text()
            layer = viewer.layers["corrections"]
            saver = widget.state.autosaver
            saver.timer.setInterval(50)
            layer.paint((8, 30, 30), 2)
            qtbot.waitUntil(lambda: saver.saves >= 1 and saver.in_flight == 0, timeout=20_000)
            assert "autosaved into" in widget.autosave_label.text()
            assert sibling.name in widget.autosave_label.text()
            np.testing.assert_array_equal(load_corrections(tiny_store), layer.data)
            painted = np.array(layer.data, copy=True)
        finally:
            wait_idle(qtbot, widget)
        viewer = make_napari_viewer()
        layers = viewer.open(str(tiny_store), plugin="napari-finetune")
        found = [layer for layer in layers if layer.name == "corrections"]
        assert found and (found[0].data == painted).all()


def test_a_failed_autosave_says_so_and_where_the_next_one_goes(docked, qtbot, tmp_path):
    """The label said "autosave into <store>" whatever happened to the saves."""
    viewer, widget, image = docked
    store = Path(image.metadata["ome_zarr_path"])
    sibling = store.parent / "tiny.corrections.ome.zarr"
    sibling.write_text("a file where the sibling image would go")  # no save can make it
    with _read_only(store):
        qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
        saver = widget.state.autosaver
        saver.timer.setInterval(50)
        viewer.layers["corrections"].paint((8, 30, 30), 2)
        qtbot.waitUntil(lambda: saver.in_flight == 0 and "failed" in widget.autosave_label.text(),
                        timeout=20_000)
        text = widget.autosave_label.text()
        assert "the next save tries" in text and sibling.name in text
        assert saver.saves == 0
        assert any("Autosave of the corrections failed" in e for e in widget.state.errors)
