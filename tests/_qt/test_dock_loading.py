"""The dock shows at once; its panel is built in a later event-loop turn.

The panel's modules are imported in the dock's thread (153-188 ms that froze
napari's docking, issue 55's UI walk); the panel comes when they are there.
"""

from __future__ import annotations

import numpy as np
from qtpy.QtCore import Qt
from qtpy.QtWidgets import QLabel
from tests._qt.conftest import wait_idle


def _dock(viewer):
    _, dock = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")
    return dock


def test_the_dock_returns_before_its_panel_which_comes_in_a_later_turn(
        make_napari_viewer, qtbot):
    viewer = make_napari_viewer()
    viewer.add_image(np.zeros((4, 32, 32), np.uint8), name="image")
    dock = _dock(viewer)
    assert dock.panel is None  # napari's docking returned before any of the panel
    assert [label.text() for label in dock.findChildren(QLabel)] == ["Loading the "
                                                                     "Fine-tune panel…"]
    with qtbot.waitSignal(dock.panel_ready, timeout=60_000):
        pass
    panel = dock.panel
    assert panel is not None and panel.parent() is dock
    # The panel alone in the dock, so it gets its whole height: napari adds a stretch below
    # a dock that does not expand, and beside it the panel had its minimum (73 of 729 px;
    # test_panel_fit sees the geometry itself).
    layout = dock.layout()
    qtbot.waitUntil(lambda: layout.count() == 1)  # the line goes in a later turn
    assert layout.itemAt(0).widget() is panel
    assert panel.image_layer() is viewer.layers["image"]
    qtbot.waitUntil(lambda: not any(  # the line is deleted in a later turn
        label.text().startswith("Loading") for label in dock.findChildren(QLabel)))
    qtbot.waitUntil(lambda: panel.state.warming == 0 and not panel.state.reading,
                    timeout=120_000)
    wait_idle(qtbot, panel)


def test_a_dock_removed_before_its_panel_builds_none(make_napari_viewer, qtbot):
    viewer = make_napari_viewer()
    dock = _dock(viewer)
    viewer.window.remove_dock_widget("all")  # unparented: its work ends
    qtbot.wait(1500)  # the import (done already in this process) and later turns
    assert dock.panel is None


def test_a_panel_that_cannot_be_imported_says_so_in_the_dock(
        make_napari_viewer, qtbot, monkeypatch):
    from napari_finetune._qt import widget

    monkeypatch.setattr(widget, "PANEL_MODULE", "napari_finetune._qt.no_such_panel")
    viewer = make_napari_viewer()
    dock = _dock(viewer)
    line = dock.findChildren(QLabel)[0]
    qtbot.waitUntil(lambda: "could not load" in line.text(), timeout=60_000)
    assert "no_such_panel" in line.text() and dock.panel is None


def test_a_panel_that_cannot_be_imported_leaves_no_button_that_does_nothing(
        make_napari_viewer, qtbot, monkeypatch):
    """Clicked while the panel loads, Predict is kept for the panel; when the panel cannot
    load, that click (and any later one) would be lost: the button says so and is off."""
    from napari_finetune._qt import widget

    monkeypatch.setattr(widget, "PANEL_MODULE", "napari_finetune._qt.no_such_panel")
    viewer = make_napari_viewer()
    dock = _dock(viewer)
    qtbot.mouseClick(dock.predict_button, Qt.MouseButton.LeftButton)
    line = dock.findChildren(QLabel)[0]
    qtbot.waitUntil(lambda: "could not load" in line.text(), timeout=60_000)
    assert not dock.predict_button.isEnabled()
    assert dock.predict_button.text() == "Predict"  # not "(queued)": nothing will run it
    assert "could not load" in dock.predict_button.toolTip()
    assert "queued" not in line.text()
