"""The docked widget hides napari's heap from full collections, and a removed layer is freed."""

from __future__ import annotations

import gc
import weakref

import numpy as np
from tests._qt.conftest import dock_panel, wait_idle


def _dock(viewer, qtbot):
    widget = dock_panel(viewer, qtbot)
    # The engine warmed up: both freeze points (the jobs' start, the warm-up's end) passed.
    qtbot.waitUntil(lambda: widget.state.warming == 0 and not widget.state.reading,
                    timeout=120_000)
    wait_idle(qtbot, widget)
    return widget


def test_docking_freezes_the_heap(unfrozen, make_napari_viewer, qtbot):
    viewer = make_napari_viewer()
    viewer.add_image(np.zeros((4, 32, 32), np.uint8), name="image")
    assert gc.get_freeze_count() == 0
    widget = _dock(viewer, qtbot)
    assert gc.get_freeze_count() > 0
    widget.close_work(0.0)
    assert gc.get_freeze_count() == 0  # a closed dock's objects are collectable again


def test_a_layer_added_before_the_freeze_is_freed_once_removed(unfrozen, make_napari_viewer,
                                                                qtbot):
    viewer = make_napari_viewer()
    layer = viewer.add_labels(np.zeros((64, 256, 256), np.uint8), name="old labels")
    ref = weakref.ref(layer)
    _dock(viewer, qtbot)
    assert gc.get_freeze_count() > 0  # the layer is frozen with the heap
    viewer.layers.remove(layer)
    del layer
    # Freed a turn later (the dock unfreezes and collects then, not in napari's removal).
    qtbot.waitUntil(lambda: ref() is None, timeout=5_000)  # frozen, kept for good


def test_closing_the_viewer_walks_no_unfrozen_heap(unfrozen, make_napari_viewer, qtbot):
    """``viewer.close()`` removes every layer, and napari's removal runs a full collection:
    with the heap unfrozen by the removal, that walked all of it (971 ms measured)."""
    viewer = make_napari_viewer()
    viewer.add_labels(np.zeros((16, 64, 64), np.uint8), name="labels")
    _dock(viewer, qtbot)
    frozen_at_full_collections: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info.get("generation") == 2:
            frozen_at_full_collections.append(gc.get_freeze_count())

    gc.callbacks.append(seen)
    try:
        viewer.close()
    finally:
        gc.callbacks.remove(seen)
    assert frozen_at_full_collections  # napari's own, as its layers go
    assert all(n > 0 for n in frozen_at_full_collections)
    assert gc.get_freeze_count() == 0  # the closed dock's objects collectable again


def test_the_engine_is_frozen_before_a_kept_predict_starts(
        unfrozen, make_napari_viewer, qtbot, tiny_store, tiny_checkpoint, monkeypatch):
    """Predict clicked as the dock shows, the warm-up ending last: its modules (torch's,
    300 000 objects in a user's process) are hidden before the prediction starts, not left
    for every later full collection to walk (284 ms in a stroke's handler, measured)."""
    import threading

    from qtpy.QtCore import Qt

    import napari_finetune._qt.panel as panel_module
    from napari_finetune.session import heap, jobs

    monkeypatch.setattr(panel_module, "default_checkpoint", lambda: str(tiny_checkpoint))
    read = threading.Event()  # the warm-up ends after the checkpoint's reading
    warm_up = jobs.warm_up_job

    def late_warm_up(lora: bool):
        read.wait(60)
        yield from warm_up(lora)

    monkeypatch.setattr(jobs, "warm_up_job", late_warm_up)
    freezes: list[tuple[bool, bool]] = []  # (the model known, froze)
    freeze = heap.HeapHold.freeze

    def recorded(hold: heap.HeapHold) -> bool:
        froze = freeze(hold)
        freezes.append((widget.state.info is not None, froze))
        return froze

    monkeypatch.setattr(heap.HeapHold, "freeze", recorded)
    viewer = make_napari_viewer()
    viewer.open(str(tiny_store), plugin="napari-finetune")
    widget = dock_panel(viewer, qtbot)
    widget.controller.session.events.checkpoint_read.connect(lambda *_: read.set())
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)  # kept until the model is there
    qtbot.waitUntil(lambda: widget.controller.session.prediction is not None, timeout=120_000)
    wait_idle(qtbot, widget)
    assert (True, True) in freezes  # the warm-up's end froze, the model known by then
