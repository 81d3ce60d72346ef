"""A click that comes before the widget is ready is kept, not dropped.

The user docks the widget and presses Predict at once, while the checkpoint is
still read in a worker (and the engine warms up in another): the prediction
must come from that one click, with a button that said it waits.
"""

from __future__ import annotations

import numpy as np
import pytest
from qtpy.QtCore import Qt
from tests._qt.conftest import CHANNELS, SHAPE, dock_panel, wait_idle


@pytest.fixture
def opened(make_napari_viewer, tiny_store, tiny_checkpoint, monkeypatch):
    """(viewer, image layer) of the tiny store; the dock will offer ``tiny_checkpoint``."""
    import napari_finetune._qt.panel as panel_module

    monkeypatch.setattr(panel_module, "default_checkpoint", lambda: str(tiny_checkpoint))
    viewer = make_napari_viewer()
    layers = viewer.open(str(tiny_store), plugin="napari-finetune")
    return viewer, layers[0]


def _filled_predictions(viewer, widget) -> bool:
    names = [f"{c} prediction" for c in CHANNELS]
    prediction = widget.controller.session.prediction
    return (prediction is not None and widget.state.busy is None
            and all(n in viewer.layers for n in names)
            and all(np.array_equal(viewer.layers[n].data, mask)
                    for n, mask in zip(names, prediction.masks, strict=True)))


def test_predict_clicked_as_the_dock_appears_predicts(opened, qtbot):
    viewer, image = opened
    widget = dock_panel(viewer, qtbot)
    assert widget.state.info is None  # the checkpoint is still being read
    button = widget.predict_button
    assert button.isEnabled()  # Qt drops a click on a disabled button
    assert "waiting for the model" in (button.text() + button.toolTip())
    qtbot.mouseClick(button, Qt.LeftButton)
    assert "waiting for the model" in widget.status_panel.progress.format()
    qtbot.waitUntil(lambda: _filled_predictions(viewer, widget), timeout=60_000)
    assert viewer.layers[f"{CHANNELS[0]} prediction"].data.shape == SHAPE
    assert button.text() == "Predict"
    wait_idle(qtbot, widget)


def test_predict_clicked_in_the_docks_first_turn_is_kept_by_the_panel(opened, qtbot):
    """The dock's Predict is there before its panel (a user, or a script looking for the
    button whose text begins with "Predict", clicks it the moment the dock shows): that
    one click predicts, and the panel's Predict is that same button."""
    from qtpy.QtWidgets import QPushButton

    viewer, image = opened
    _, dock = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")
    assert dock.panel is None  # nothing of the panel yet
    found = [b for b in dock.findChildren(QPushButton) if b.text().startswith("Predict")]
    assert found == [dock.predict_button] and found[0].isEnabled()
    qtbot.mouseClick(found[0], Qt.LeftButton)
    assert found[0].text() == "Predict (queued)"
    with qtbot.waitSignal(dock.panel_ready, timeout=60_000):
        pass
    widget = dock.panel
    assert widget.predict_button is found[0] and found[0].parent() is not dock
    qtbot.waitUntil(lambda: _filled_predictions(viewer, widget), timeout=60_000)
    assert found[0].text() == "Predict"
    wait_idle(qtbot, widget)


def test_predict_clicked_once_it_is_enabled_predicts(opened, qtbot):
    """The first moment the model is known (the engine may still warm up) one click is enough."""
    viewer, image = opened
    widget = dock_panel(viewer, qtbot)
    qtbot.waitUntil(lambda: widget.state.info is not None, timeout=60_000)
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    # At once, before the first block is done: not "idle" (the engine's warm-up may
    # still be importing, which the prediction waits for).
    assert widget.status_panel.progress.format() in (
        "predicting…", "Predict is waiting for the model…")
    qtbot.waitUntil(lambda: _filled_predictions(viewer, widget), timeout=60_000)
    wait_idle(qtbot, widget)


def test_progress_names_the_block(opened, qtbot):
    viewer, image = opened
    widget = dock_panel(viewer, qtbot)
    seen: list[str] = []
    bar = widget.status_panel.progress
    qtbot.waitUntil(lambda: widget.state.info is not None, timeout=60_000)
    original = widget.status_panel.show_progress

    def record(done: int, total: int, what: str) -> None:
        original(done, total, what)
        seen.append(bar.format())

    widget.status_panel.show_progress = record
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: _filled_predictions(viewer, widget), timeout=60_000)
    assert seen and all(text.startswith("predicting block ") for text in seen)
    total = seen[-1].rsplit("/ ", 1)[1]
    assert seen[-1] == f"predicting block {total} / {total}"
    wait_idle(qtbot, widget)


def test_predict_without_a_model_says_why_and_queues_nothing(make_napari_viewer, tiny_store,
                                                            qtbot, monkeypatch):
    import napari_finetune._qt.panel as panel_module

    monkeypatch.setattr(panel_module, "default_checkpoint", lambda: "")
    viewer = make_napari_viewer()
    viewer.open(str(tiny_store), plugin="napari-finetune")
    widget = dock_panel(viewer, qtbot)
    # The engine warms up in the turn after docking (with the modules already imported by
    # earlier tests it can end within one poll, so wait for its end, not for it running).
    warmed: list[object] = []
    widget.controller.session.events.warmed.connect(lambda *args: warmed.append(args))
    qtbot.waitUntil(lambda: bool(warmed), timeout=20_000)
    assert not widget.predict_button.isEnabled()
    assert "choose a model checkpoint" in widget.predict_button.toolTip()
    widget.controller.predict()  # as a keyboard shortcut would, past the disabled button
    assert not widget.state.queued
    wait_idle(qtbot, widget)
