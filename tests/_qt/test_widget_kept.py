"""Weights a remote run kept beside the store, offered in the dock when it opens: Use makes
them the model, Discard sets them aside; napari under Xvfb, the kept file written as a
run cut short writes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from qtpy.QtCore import Qt
from tests._qt.conftest import choose_checkpoint, dock_panel, wait_idle
from tests.session.kept_files import write_kept

from napari_finetune.remote.kept import kept_path


@pytest.fixture
def docked_with_kept(make_napari_viewer, qtbot, tiny_store, tiny_checkpoint):
    """(viewer, widget, kept file): weights kept beside the store before napari opened it."""
    path, _ = write_kept(tiny_store, tiny_checkpoint, steps_done=4, total_steps=40)
    viewer = make_napari_viewer()
    viewer.open(str(tiny_store), plugin="napari-finetune")
    widget = dock_panel(viewer, qtbot)
    choose_checkpoint(qtbot, widget, str(tiny_checkpoint))
    qtbot.waitUntil(lambda: widget.state.info is not None and widget.state.warming == 0,
                    timeout=60_000)
    yield viewer, widget, path
    wait_idle(qtbot, widget)


def test_the_dock_offers_kept_weights_and_use_loads_them_as_the_model(
        docked_with_kept, qtbot, tiny_checkpoint):
    _, widget, path = docked_with_kept
    offer = widget.kept_offer
    qtbot.waitUntil(lambda: not offer.isHidden(), timeout=30_000)
    assert "step 4 of 40" in offer.line.text() and path.name in offer.line.text()
    assert offer.use_button.isEnabled()
    assert offer.line.text() in widget.status_panel.log.toPlainText()
    assert widget.state.info.path == str(tiny_checkpoint)

    qtbot.mouseClick(offer.use_button, Qt.LeftButton)

    used = widget.checkpoint_edit.text()  # the model field holds the renamed file
    assert Path(used).name.startswith(f"{path.stem}.used-") and not path.exists()
    assert Path(used).parent == path.parent
    qtbot.waitUntil(lambda: widget.state.info is not None and widget.state.info.path == used,
                    timeout=60_000)
    assert widget.controller.session.checkpoint == used
    assert widget.checkpoint_label.text().startswith(Path(used).name)
    assert offer.isHidden()
    assert "are the model now" in widget.status_panel.log.toPlainText()
    assert not widget.state.errors


def test_discard_sets_the_kept_weights_aside_and_keeps_the_model(
        docked_with_kept, qtbot, tiny_checkpoint):
    _, widget, path = docked_with_kept
    offer = widget.kept_offer
    qtbot.waitUntil(lambda: not offer.isHidden(), timeout=30_000)

    qtbot.mouseClick(offer.discard_button, Qt.LeftButton)

    aside = list(path.parent.glob(f"{path.stem}.discarded-*.pt"))
    assert len(aside) == 1 and not kept_path(path.with_suffix("").with_suffix("")).exists()
    assert not path.exists() and offer.isHidden()
    assert widget.state.info.path == str(tiny_checkpoint)
    assert widget.checkpoint_edit.text() == str(tiny_checkpoint)
    assert "were set aside" in widget.status_panel.log.toPlainText()


def test_no_kept_weights_no_offer(docked, qtbot):
    _, widget, _ = docked
    qtbot.wait(200)  # the look beside the store comes one event-loop turn after docking
    assert widget.controller.session.store is not None
    assert widget.kept_offer.isHidden() and widget.controller.session.kept is None
