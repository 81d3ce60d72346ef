"""The Objects role editor, clicked in a docked widget: what Objects does with the roles
set there, the one-line errors, a checkpoint without roles, and Export keeping them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from qtpy.QtCore import Qt
from qtpy.QtWidgets import QFileDialog, QWidget
from tests._qt.conftest import CHANNELS, choose_checkpoint, wait_idle
from tests._qt.objects_setup import LAYER_NAMES, ROLES, save_tiny_unet

from napari_finetune._qt.layers import OBJECTS_KEY
from napari_finetune.objects import ChannelRole, instances_of, roles_from_metadata


@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> Path:
    """The conftest's tiny UNet, with a role for each channel (the docked widget loads it)."""
    return save_tiny_unet(tmp_path / "tiny_roles.pt", ROLES)


def choose_role(qtbot, widget, channel: str, role: str) -> None:
    """Step to the role in the channel's role list with the arrow keys, as a keyboard user
    does. Not by letters: the list's keyboard search adds a key to the earlier ones when it
    comes within Qt's keyboard-input interval (400 ms) of the last, so an "n" soon after
    this list's "o" searched "on", found nothing and left "object" chosen (a fast machine
    failed so; typing the whole word failed on a slow one, where the keys came apart)."""
    combo = widget.roles_editor.inputs[channel].role.native
    target = combo.findText(role)
    assert target >= 0, f"{role!r} is not among the roles"
    combo.setFocus()
    key = Qt.Key_Down if target > combo.currentIndex() else Qt.Key_Up
    for _ in range(abs(target - combo.currentIndex())):
        qtbot.keyClick(combo, key)
    assert combo.currentText() == role


def type_value(qtbot, widget, channel: str, field: str, text: str) -> None:
    """Select the channel's ``field`` input and type ``text``, then Return."""
    box = getattr(widget.roles_editor.inputs[channel], field).native
    box.setFocus()
    box.selectAll()
    qtbot.keyClicks(box, text)
    qtbot.keyClick(box, Qt.Key_Return)


def objects_layers(viewer) -> dict[str, np.ndarray]:
    return {layer.metadata[OBJECTS_KEY]: layer.data for layer in viewer.layers
            if OBJECTS_KEY in layer.metadata}


def predict(qtbot, widget) -> None:
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert widget.objects_button.isEnabled()


def click_objects(qtbot, widget) -> None:
    qtbot.mouseClick(widget.objects_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert not widget.state.errors, widget.state.errors


def test_the_editor_shows_the_checkpoint_roles(docked):
    _, widget, _ = docked
    inputs = widget.roles_editor.inputs
    assert not widget.roles_editor.isHidden() and list(inputs) == CHANNELS
    for channel, role in ROLES.items():
        assert inputs[channel].role.value == role.role
        assert inputs[channel].threshold.value == pytest.approx(role.threshold)
        assert inputs[channel].min_size.value == role.min_size
    assert widget.state.roles == ROLES
    # Filled again (as for the next model), before any event is processed: one grid, the
    # earlier rows not left lying over the title until Qt deletes them.
    editor = widget.roles_editor
    editor.show_roles(widget.state.roles)
    assert [child for child in editor.children() if isinstance(child, QWidget)
            and child not in (editor.title, editor.sources)] == [editor.grid]


def test_role_none_gives_no_layer_for_that_channel(docked, qtbot):
    viewer, widget, _ = docked
    predict(qtbot, widget)
    choose_role(qtbot, widget, "membrane", "none")
    assert widget.state.roles["membrane"].role is None
    assert not widget.roles_editor.inputs["membrane"].threshold.enabled  # means nothing now
    assert "cells" not in widget.objects_label.text()
    click_objects(qtbot, widget)
    layers = objects_layers(viewer)
    assert list(layers) == ["mitochondria"], list(layers)
    assert LAYER_NAMES["membrane"] not in viewer.layers
    expected = instances_of(widget.state.probabilities["mitochondria"][None],
                            {"mitochondria": ROLES["mitochondria"]}, ["mitochondria"])
    np.testing.assert_array_equal(layers["mitochondria"], expected["mitochondria"])


def test_objects_of_a_role_changed_since_go_with_the_next_objects_click(docked, qtbot):
    """The layers always show the roles of the last Objects click, and so does Save: no
    objects of a channel set to none since, no "cells" left over once the membrane
    counts as objects."""
    from napari_finetune.io.omezarr import list_labels

    viewer, widget, image = docked
    predict(qtbot, widget)
    click_objects(qtbot, widget)
    assert sorted(objects_layers(viewer)) == sorted(CHANNELS)
    choose_role(qtbot, widget, "mitochondria", "none")
    choose_role(qtbot, widget, "membrane", "object")
    click_objects(qtbot, widget)
    objects = [layer.name for layer in viewer.layers if OBJECTS_KEY in layer.metadata]
    assert objects == ["membrane objects"], objects
    qtbot.mouseClick(widget.save_predictions_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert not widget.state.errors, widget.state.errors
    saved = list_labels(image.metadata["ome_zarr_path"])
    assert "objects-membrane" in saved and "objects-mitochondria" not in saved, saved
    choose_role(qtbot, widget, "membrane", "none")  # no role left at all
    click_objects(qtbot, widget)
    assert not objects_layers(viewer)


def test_a_new_threshold_is_used_by_the_next_objects_click(docked, qtbot):
    viewer, widget, _ = docked
    predict(qtbot, widget)
    click_objects(qtbot, widget)
    name = LAYER_NAMES["mitochondria"]
    before = int(viewer.layers[name].data.max())
    type_value(qtbot, widget, "mitochondria", "threshold", "0.45")
    edited = replace(ROLES["mitochondria"], threshold=0.45)
    assert widget.state.roles["mitochondria"] == edited
    click_objects(qtbot, widget)
    after = viewer.layers[name].data
    expected = instances_of(widget.state.probabilities["mitochondria"][None],
                            {"mitochondria": edited}, ["mitochondria"])["mitochondria"]
    np.testing.assert_array_equal(after, expected)
    assert int(after.max()) != before, "the threshold changed nothing in the count"
    assert f"{name}: {int(after.max())}" in widget.objects_label.text()


def test_a_value_no_role_can_have_is_one_line_and_objects_waits(docked, qtbot):
    viewer, widget, _ = docked
    predict(qtbot, widget)
    type_value(qtbot, widget, "membrane", "threshold", "1")
    message = widget.objects_label.text()
    assert "'membrane'" in message and "threshold must be in (0, 1)" in message
    assert "\n" not in message and "Traceback" not in message
    assert widget.state.roles == ROLES  # the last valid roles are kept, not used
    click_objects(qtbot, widget)
    assert message in widget.objects_label.text()  # the Session's refusal says it
    assert not objects_layers(viewer)
    type_value(qtbot, widget, "membrane", "threshold", "0.41")  # fixed: Objects works again
    assert widget.state.roles_error == ""
    click_objects(qtbot, widget)
    assert sorted(objects_layers(viewer)) == sorted(CHANNELS)


def test_roles_set_on_a_checkpoint_without_roles_give_objects(docked, qtbot, tmp_path):
    viewer, widget, _ = docked
    path = save_tiny_unet(tmp_path / "no_roles.pt", {})
    choose_checkpoint(qtbot, widget, path)
    qtbot.waitUntil(lambda: widget.state.info is not None
                    and widget.state.info.path == str(path), timeout=20_000)
    predict(qtbot, widget)  # nothing kept: no channel had a role
    choose_role(qtbot, widget, "membrane", "boundary")
    type_value(qtbot, widget, "membrane", "threshold", "0.41")
    type_value(qtbot, widget, "membrane", "min_size", "20")
    click_objects(qtbot, widget)
    assert "press Predict again" in widget.objects_label.text()
    assert not objects_layers(viewer)
    predict(qtbot, widget)
    assert list(widget.state.probabilities) == ["membrane"]
    click_objects(qtbot, widget)
    role = ChannelRole("boundary", threshold=0.41, min_size=20)  # seed distance: default
    expected = instances_of(widget.state.probabilities["membrane"][None],
                            {"membrane": role}, ["membrane"])["membrane"]
    layers = objects_layers(viewer)
    assert list(layers) == ["membrane"]
    np.testing.assert_array_equal(layers["membrane"], expected)
    assert expected.max() >= 2


@pytest.mark.slow
def test_the_exported_checkpoint_carries_the_edited_roles(docked, qtbot, monkeypatch, tmp_path):
    viewer, widget, _ = docked
    qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    corrections = viewer.layers["corrections"]
    corrections.brush_size = 5
    corrections.paint((8, 24, 24), 3)
    corrections.paint((8, 8, 40), 1)
    widget.settings.steps.value = 1
    widget.settings.batch_size.value = 1
    widget.settings.preview_interval.value = 0.0
    widget.settings.device.value = "cpu"
    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert widget.export_button.isEnabled(), widget.state.errors

    choose_role(qtbot, widget, "membrane", "none")
    type_value(qtbot, widget, "mitochondria", "threshold", "0.5")
    type_value(qtbot, widget, "mitochondria", "min_size", "7")
    target = tmp_path / "exported.pt"
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda *args: (str(target), "")))
    qtbot.mouseClick(widget.export_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert widget.state.exported == str(target), widget.state.errors

    from napari_finetune.model.checkpoint import load_checkpoint

    stored = roles_from_metadata(load_checkpoint(target).metadata, CHANNELS)
    assert stored == {"membrane": ChannelRole(),
                      "mitochondria": replace(ROLES["mitochondria"], threshold=0.5,
                                              min_size=7)}
    # The run's own metadata is left as the checkpoint gave it.
    assert roles_from_metadata(widget.state.trainer.metadata, CHANNELS) == ROLES
    # Chosen again, the exported file fills the editor with its roles.
    choose_checkpoint(qtbot, widget, target)
    qtbot.waitUntil(lambda: widget.state.info is not None
                    and widget.state.info.path == str(target), timeout=20_000)
    assert widget.roles_editor.inputs["membrane"].role.value == "none"
    assert widget.roles_editor.inputs["mitochondria"].min_size.value == 7


def test_the_editor_shows_each_sizes_source(qtbot):
    """Standalone: the checkpoint's recorded sources, then those Objects found (the values
    in the inputs, without an edit signal), then a typed value is the user's."""
    from napari_finetune._qt.roles_editor import RolesEditor
    from napari_finetune.objects import RolesFromPainting

    editor = RolesEditor()
    qtbot.addWidget(editor)
    edits: list[None] = []
    editor.changed.connect(lambda: edits.append(None))
    editor.show_roles(ROLES, {"membrane": {"min_size": "set by you"}})
    assert editor.set_by_you() == {"membrane": {"min_size"}}
    assert "membrane: min size 20 (set by you), seed distance 2 (default)" in (
        editor.sources.text())
    painted = "from your painting (4 objects, median extent 12 voxels)"
    used = replace(ROLES["mitochondria"], min_size=113, seed_distance=6.0)
    editor.show_found(RolesFromPainting(
        dict(ROLES), {**ROLES, "mitochondria": used},
        {"membrane": {"min_size": "set by you", "seed_distance": "default"},
         "mitochondria": {"min_size": painted, "seed_distance": painted}}))
    inputs = editor.inputs["mitochondria"]
    assert (inputs.min_size.value, inputs.seed_distance.value) == (113, 6.0)
    assert f"mitochondria: min size 113, seed distance 6: {painted}" in editor.sources.text()
    assert inputs.min_size.tooltip.endswith(f"This value: {painted}")
    assert inputs.seed_distance.tooltip.endswith(f"This value: {painted}")
    assert not edits  # shown, not edited: the state keeps the user's roles
    assert editor.roles(ROLES)["mitochondria"] == used  # read back: the values shown
    type_value(qtbot, type("W", (), {"roles_editor": editor})(), "mitochondria",
               "seed_distance", "9")
    assert edits and editor.set_by_you() == {"membrane": {"min_size"},
                                             "mitochondria": {"seed_distance"}}
    assert inputs.seed_distance.tooltip.endswith("This value: set by you")
    assert "seed distance 9 (set by you)" in editor.sources.text()


def test_objects_take_the_painted_sizes_and_the_editor_says_so(docked, qtbot):
    viewer, widget, _ = docked
    predict(qtbot, widget)
    qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    corrections = viewer.layers["corrections"]
    data = np.zeros(corrections.data.shape, np.uint8)
    for z in (4, 8):
        data[z, 4:15, 4:15] = data[z, 22:33, 22:33] = 3  # two mitochondria, 11 wide
    corrections.data = data
    click_objects(qtbot, widget)
    text = widget.roles_editor.sources.text()
    painted = "from your painting (4 objects, median extent 11 voxels)"
    assert f"mitochondria: min size 87, seed distance 5.5: {painted}" in text, text
    assert "membrane: min size 20, seed distance 2: default" in text, text
    used = replace(ROLES["mitochondria"], min_size=87, seed_distance=5.5)
    expected = instances_of(widget.state.probabilities["mitochondria"][None],
                            {"mitochondria": used}, ["mitochondria"])["mitochondria"]
    np.testing.assert_array_equal(objects_layers(viewer)["mitochondria"], expected)
    assert widget.state.roles == ROLES  # the checkpoint's, as the user left them
