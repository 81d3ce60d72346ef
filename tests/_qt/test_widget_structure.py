"""The "Add a structure…" control: the model gets a channel for nuclei, and the corrections
layer a class for it, painted with the next label (what was painted stays)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from qtpy.QtCore import Qt
from tests._qt.conftest import CHANNELS, wait_idle


def test_adding_nuclei_gives_the_corrections_layer_a_class_for_them(docked, qtbot):
    from napari_finetune.loading import load_checkpoint

    viewer, widget, _ = docked
    qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    layer = viewer.layers["corrections"]
    layer.paint((8, 24, 24), 3)
    painted = layer.data.copy()
    before = widget.state.info.path
    row = widget.structure_row
    assert row.form.isHidden()
    qtbot.mouseClick(row.toggle, Qt.LeftButton)
    assert not row.form.isHidden()
    qtbot.keyClicks(row.name, "nuclei")
    row.role.setCurrentIndex(0)  # object
    qtbot.mouseClick(row.add_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: widget.state.info is not None
                    and widget.state.info.channel_names == [*CHANNELS, "nuclei"],
                    timeout=60_000)
    wait_idle(qtbot, widget)
    assert not widget.state.errors, widget.state.errors
    info = widget.state.info
    assert info.path != before and Path(info.path).name == "tiny_unet+nuclei.pt"
    assert list(load_checkpoint(info.path).channel_names) == [*CHANNELS, "nuclei"]
    assert widget.checkpoint_path() == info.path
    # The layer's classes: the new one last, selected, painted with label 4.
    assert list(layer.features["class"]) == ["unpainted", "background", *CHANNELS, "nuclei"]
    assert layer.metadata["channel_names"] == [*CHANNELS, "nuclei"]
    assert layer.selected_label == 4
    np.testing.assert_array_equal(layer.data, painted)
    assert 4 in layer.colormap.color_dict
    assert widget.state.autosaver is not None
    assert widget.state.autosaver.channel_names == [*CHANNELS, "nuclei"]
