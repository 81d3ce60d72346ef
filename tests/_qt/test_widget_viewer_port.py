"""The dock's Session reaches napari through a NapariViewerPort: a prediction's view tiles
are written into the widget's prediction layers by the port, not by a copy in the widget."""

from __future__ import annotations

import numpy as np
from qtpy.QtCore import Qt
from tests._qt.conftest import CHANNELS, wait_idle

from napari_finetune._qt.viewer_port import NapariViewerPort


def _predicted(viewer, widget) -> bool:
    return (widget.controller.session.prediction is not None and widget.state.busy is None
            and all(f"{c} prediction" in viewer.layers for c in CHANNELS))


def test_the_view_tiles_go_through_the_docks_viewer_port(docked, qtbot, monkeypatch):
    viewer, widget, image = docked
    session = widget.controller.session
    assert isinstance(session.viewer, NapariViewerPort)
    assert session.viewer.shown_region() == session.region  # the region the widget keeps
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: _predicted(viewer, widget), timeout=60_000)
    wait_idle(qtbot, widget)
    names = {layer.name for layer in viewer.layers}

    tiles: list[str] = []  # the second prediction's tiles land in the layers there now
    show_region = NapariViewerPort.show_region

    def recorded(port, name, data, region, kind) -> None:
        tiles.append(name)
        show_region(port, name, data, region, kind)

    monkeypatch.setattr(NapariViewerPort, "show_region", recorded)
    layer = viewer.layers[f"{CHANNELS[0]} prediction"]
    layer.data[...] = 0  # what a tile brings back
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: _predicted(viewer, widget), timeout=60_000)
    wait_idle(qtbot, widget)
    assert tiles and set(tiles) <= {f"prediction-{c}" for c in CHANNELS}
    mask = session.prediction.masks[0]
    assert np.array_equal(viewer.layers[f"{CHANNELS[0]} prediction"].data, mask)
    # Whole results stay the widget's (its colours, its store): the port adds no layer.
    assert {layer.name for layer in viewer.layers} == names
