"""Docking the widget imports no torch on napari's main thread.

``add_plugin_dock_widget`` imports ``napari_finetune._qt.widget`` there; torch
(2.6 s quiet, 3-8 s on a loaded machine) is imported by the warm-up job in a
worker thread instead. A module-level ``import torch`` anywhere in the widget's
imports froze the dock for that long.
"""

from __future__ import annotations

from import_blocker import run_without


def test_the_widget_module_imports_no_torch():
    run_without(["torch"], "import napari_finetune._qt.widget\n")
