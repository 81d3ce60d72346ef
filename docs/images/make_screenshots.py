"""Regenerate the user guide's screenshots (run under a display or Xvfb).

    xvfb-run -a -s "-screen 0 1400x1000x24" .venv/bin/python docs/images/make_screenshots.py

Drives the real widget on the synthetic-em sample with its pretrained model:
Predict, paint corrections from a few ground-truth disks on one slice (what a
careful user paints), Fine-tune, a mid-run capture, and Paint here next after
the run (the uncertainty layer, the validation curve in the plot), and Objects
on the final prediction (cells and mitochondria, each object its own colour;
``SHOTS=objects`` takes only that one, on the pretrained model's prediction,
in the dark theme, without fine-tuning). The mid-run
status shows a simulated out-of-memory (a forward pre-hook, as in the tests) so
the guide can show what a recovery looks like; it is labelled as such in the
guide. The window captures are taken in napari's dark theme and again in its
light one (``*-light.png``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _wait(app, condition, timeout_s: float = 1800) -> None:
    end = time.perf_counter() + timeout_s
    while not condition():
        app.processEvents()
        time.sleep(0.005)
        if time.perf_counter() > end:
            raise TimeoutError("timed out")


def _save(image: np.ndarray, name: str) -> None:
    from imageio.v3 import imwrite


    imwrite(HERE / name, image)
    print("wrote", HERE / name, image.shape)


def _save_themes(viewer, app, name: str, canvas_only: bool = False) -> None:
    """``name`` in the dark theme and ``<name>-light.png`` in the light one."""
    _save(viewer.screenshot(canvas_only=canvas_only, flash=False), name)
    if canvas_only:
        return
    viewer.theme = "light"
    for _ in range(20):
        app.processEvents()
    _save(viewer.screenshot(canvas_only=False, flash=False), name.replace(".png", "-light.png"))
    viewer.theme = "dark"
    for _ in range(20):
        app.processEvents()


def _show_status(widget, app, status: bool = True) -> None:
    """Scroll the panel to its status (the rows, the loss plot, the log) or back to the top.

    The panel is taller than the window since the roles and "Run on" rows came: the
    pictures of a run show its status, the others the top of the panel.
    """
    from qtpy.QtWidgets import QScrollArea

    scroll = widget.findChild(QScrollArea)
    if status:
        scroll.ensureWidgetVisible(widget.status_panel.log)
    else:
        scroll.verticalScrollBar().setValue(0)
    for _ in range(20):
        app.processEvents()


def _close_toasts(viewer) -> None:
    from napari._qt.dialogs.qt_notification import NapariQtNotification

    for toast in viewer.window._qt_window.findChildren(NapariQtNotification):
        toast.close()


def _paint_disks(layer, truth: np.ndarray, wrong: np.ndarray, z: int, radius: int = 4) -> None:
    """What a careful user paints on slice ``z``: small disks of the right class.

    Most disks sit where the model is wrong (``wrong``: membrane called
    mitochondria), the rest on true mitochondria and on plain background;
    inside a disk the ground truth gives the class (0/1/2 -> correction 1/2/3).
    """
    rng = np.random.default_rng(1)
    _, h, w = truth.shape
    yy, xx = np.mgrid[0:h, 0:w]
    picks = [(wrong[z], 14), (truth[z] == 2, 6), (truth[z] == 0, 8)]
    data = layer.data
    for mask, count in picks:
        ys, xs = np.nonzero(mask[radius:-radius, radius:-radius])
        for i in rng.choice(len(ys), size=min(count, len(ys)), replace=False):
            disk = (yy - ys[i] - radius) ** 2 + (xx - xs[i] - radius) ** 2 <= radius**2
            data[z][disk] = truth[z][disk] + 1
    layer.refresh()


def _objects_shot(viewer, app, widget, themes: bool = True) -> None:
    """Objects on the current prediction: the objects layers over the image, counts in the log."""
    widget.objects_button.click()
    _wait(app, lambda: widget.state.busy is None and widget.state.running == 0)
    from napari_finetune._qt.layers import OBJECTS_KEY

    for layer in viewer.layers:  # the objects alone over the image
        layer.visible = OBJECTS_KEY in layer.metadata or layer is widget.image_layer()
    _close_toasts(viewer)
    if themes:
        _save_themes(viewer, app, "07-objects.png")
    else:
        _save(viewer.screenshot(canvas_only=False, flash=False), "07-objects.png")


def main() -> int:
    import warnings

    warnings.filterwarnings("ignore", message="napari support for the PyQt5")  # a toast
    shape = os.environ.get("NAPARI_FINETUNE_SAMPLE_SHAPE", "32,256,256")
    os.environ["NAPARI_FINETUNE_SAMPLE_SHAPE"] = shape
    import napari
    from qtpy.QtWidgets import QApplication

    from napari_finetune.testing import build_hooks, oom_above_batch

    viewer = napari.Viewer()
    viewer.window._qt_window.resize(1380, 960)
    app = QApplication.instance()
    viewer.open_sample("napari-finetune", "synthetic-em")
    _close_toasts(viewer)
    _, widget = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")
    if os.environ.get("CHECKPOINT"):  # e.g. before the sample model is installed
        widget.checkpoint_edit.setText(os.environ["CHECKPOINT"])
        widget.checkpoint_edit.editingFinished.emit()  # as Return in the field does
    # The model read and the engine warmed up: a Predict clicked earlier is kept, not run,
    # and the picture would show "Predict (queued)" with no prediction yet.
    _wait(app, lambda: widget.state.info is not None and widget.state.warming == 0
          and widget.state.running == 0)
    viewer.reset_view()  # the docked panel narrowed the canvas: fit the image again
    z = int(shape.split(",")[0]) // 2
    viewer.dims.set_current_step(0, z)

    widget.predict_button.click()
    names = [f"{c} prediction" for c in ("membrane", "mitochondria")]
    _wait(app, lambda: widget.state.busy is None and not widget.state.queued
          and all(n in viewer.layers for n in names))
    if os.environ.get("SHOTS") == "objects":
        _objects_shot(viewer, app, widget, themes=False)
        print("errors", widget.state.errors)
        viewer.close()
        return 0
    _save_themes(viewer, app, "01-predict.png")

    widget.new_corrections_button.click()
    layer = widget.corrections_layer()  # the new one ("corrections", or a numbered name)
    truth = np.asarray(viewer.layers["ground truth"].data)
    wrong = (truth == 1) & (viewer.layers["mitochondria prediction"].data > 0)
    _paint_disks(layer, truth, wrong, z)
    for name in ("membrane prediction", "mitochondria prediction"):
        viewer.layers[name].visible = False
    _save(viewer.screenshot(canvas_only=True, flash=False), "02-corrections.png")
    for name in ("membrane prediction", "mitochondria prediction"):
        viewer.layers[name].visible = True

    s = widget.settings
    s.steps.value = int(os.environ.get("STEPS", "40"))
    s.batch_size.value = 4
    s.preview_interval.value = 2.0
    build_hooks.model.append(lambda model: oom_above_batch(model, 2))  # simulated, see the guide
    widget.finetune_button.click()
    _wait(app, lambda: widget.state.previews >= 2 or widget.state.busy is None)
    _close_toasts(viewer)
    _save(viewer.screenshot(canvas_only=True, flash=False), "03-preview-canvas.png")
    _show_status(widget, app)
    _save_themes(viewer, app, "04-finetune-running.png")
    _wait(app, lambda: widget.state.busy is None and widget.state.running == 0)
    build_hooks.clear()
    layer.visible = False
    _save_themes(viewer, app, "05-after-finetune.png")
    layer.visible = True
    widget.paint_next_button.click()
    _wait(app, lambda: len(widget.state.suggested) >= 1 or bool(widget.state.errors))
    _wait(app, lambda: widget.state.busy is None and widget.state.running == 0)
    for name in ("membrane prediction", "mitochondria prediction"):
        viewer.layers[name].visible = False
    _close_toasts(viewer)
    _show_status(widget, app)
    _save_themes(viewer, app, "06-paint-here-next.png")
    _show_status(widget, app, status=False)
    _objects_shot(viewer, app, widget)
    print("timings", widget.state.timings, "errors", widget.state.errors)
    viewer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
