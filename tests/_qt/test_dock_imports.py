"""Docking the widget imports almost nothing on napari's main thread.

``add_plugin_dock_widget`` imports ``napari_finetune._qt.widget`` there (npe2,
``napari.yaml``). torch (2.6 s quiet, 3-8 s on a loaded machine) is imported by
the warm-up job in a worker thread; the panel's own modules (its parts, magicgui,
the Session: 153-188 ms in issue 55's UI walk) by the dock's thread.
"""

from __future__ import annotations

import subprocess
import sys

from import_blocker import run_without

# Modules the panel needs that the dock's module must leave to the dock's thread.
HEAVY = ("magicgui", "napari_finetune._qt.panel", "napari_finetune._qt.actions",
         "napari_finetune._qt.settings", "napari_finetune._qt.parts",
         "napari_finetune.session.session", "napari_finetune.config", "napari.layers")


def test_the_widget_module_imports_no_torch():
    run_without(["torch"], "import napari_finetune._qt.widget\n")


def test_the_widget_module_leaves_the_panels_imports_to_a_thread():
    script = ("import sys\nimport napari_finetune._qt.widget\n"
              f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_the_panel_module_is_what_the_thread_imports():
    """The thread's import is the panel's module, and it holds the panel."""
    from napari_finetune._qt import widget

    assert widget.import_panel() is None
    from napari_finetune._qt.panel import MAX_WIDTH, FinetunePanel

    assert widget.PANEL_MODULE == FinetunePanel.__module__
    assert widget.LOADING_WIDTH == MAX_WIDTH  # the dock does not widen when the panel comes
