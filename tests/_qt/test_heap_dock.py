"""The docked widget hides napari's heap from full collections, and a removed layer is freed."""

from __future__ import annotations

import gc
import weakref

import numpy as np
from tests._qt.conftest import wait_idle


def _dock(viewer, qtbot):
    _, widget = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")
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
    gc.collect()
    assert ref() is None  # frozen still, its 4 MiB array would be kept for good
