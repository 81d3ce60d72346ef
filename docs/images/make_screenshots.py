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

The stores of "Channels, time points and new structures in the panel" (written
with ome-zarr-py in a temporary folder, from the sample's generator) come after,
each in a fresh viewer, dark theme only: ``09-channels.png`` (a CZYX store opened
with napari-ome-zarr, the Channel row of the 1-channel sample model),
``10-time-series.png`` (a TZYX store, its prediction over napari's time
slider), ``11-2d.png`` (a YX plane predicted by a 2D UNet that the script
trains for a few seconds on the source domain's slices) and ``12-structure.png``
("Add a structure…": vesicles, painted on one slice, after a short run; and
``12-structure-form.png``, the panel with the name and role filled in).
``SHOTS=channels,time,2d,structure`` (any of them) takes only those.
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


ISSUE56 = ("channels", "time", "2d", "structure")
SMALL = (24, 128, 128)  # the new shots' volumes: each run and prediction takes seconds on a CPU


def _ready(app, widget) -> None:
    """The model read and the engine warmed up (as in :func:`main`)."""
    _wait(app, lambda: widget.state.info is not None and widget.state.warming == 0
          and widget.state.running == 0)


def _idle(app, widget) -> None:
    _wait(app, lambda: widget.state.busy is None and not widget.state.queued
          and widget.state.running == 0)


def _write_store(path: Path, data: np.ndarray, axes: str, channels: list[str] | None = None):
    """An OME-Zarr store written by ome-zarr-py (one level), with ``omero`` channel names."""
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    group = zarr.group(store=parse_url(str(path), mode="w").store)
    chunks = tuple(1 if a in "tc" else min(n, 64) for a, n in zip(axes, data.shape, strict=True))
    write_image(data, group, axes=axes, scale_factors=[], storage_options={"chunks": chunks})
    if channels:
        window = {"min": 0.0, "max": 255.0, "start": 0.0, "end": 255.0}
        colors = ["FFFFFF", "00FF00", "FF00FF"]
        ome = dict(group.attrs["ome"])
        ome["omero"] = {"channels": [
            {"label": c, "color": colors[i % 3], "window": window, "active": True}
            for i, c in enumerate(channels)]}
        group.attrs["ome"] = ome
    return path


def _viewer(size=(1280, 800)):
    import napari

    viewer = napari.Viewer()
    viewer.window._qt_window.resize(*size)
    return viewer


def _dock(viewer, app, checkpoint: str | None = None):
    _, widget = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")
    if checkpoint:
        widget.checkpoint_edit.setText(checkpoint)
        widget.checkpoint_edit.editingFinished.emit()
    _ready(app, widget)
    return widget


def _grab(viewer, app, name: str) -> None:
    _close_toasts(viewer)
    for _ in range(20):
        app.processEvents()
    _save(viewer.screenshot(canvas_only=False, flash=False), name)


def _grab_panel(viewer, app, widget, part, name: str, above: int = 160) -> None:
    """The window's picture cropped to the panel's width, ``above`` pixels over ``part``
    down to its bottom (the window is captured at one pixel per point under Xvfb)."""
    from qtpy.QtCore import QPoint

    _close_toasts(viewer)
    for _ in range(20):
        app.processEvents()
    window = viewer.window._qt_window
    image = viewer.screenshot(canvas_only=False, flash=False)
    left = widget.mapTo(window, QPoint(0, 0)).x()
    top = part.mapTo(window, QPoint(0, 0)).y()
    _save(image[max(0, top - above):top + part.height() + 8,
                max(0, left - 4):left + widget.width() + 4], name)


def _channels_shot(app, tmp: Path) -> None:
    """A CZYX store (EM and a mitochondria marker) opened by napari-ome-zarr: one layer
    per channel; the 1-channel sample model asks which channel, then predicts on it."""
    from scipy import ndimage

    from napari_finetune.samples.synthetic_em import generate_volume

    image, truth = generate_volume(SMALL)
    rng = np.random.default_rng(0)
    marker = ndimage.gaussian_filter((truth == 2).astype(np.float32) * 200, 1.5)
    marker = np.clip(marker + 20 + 8 * rng.standard_normal(SMALL), 0, 255).astype(np.uint8)
    store = _write_store(tmp / "czyx.ome.zarr", np.stack([image, marker]), "czyx",
                         ["EM", "mito marker"])
    viewer = _viewer()
    viewer.open(str(store), plugin="napari-ome-zarr")
    widget = _dock(viewer, app)
    viewer.reset_view()
    viewer.dims.set_current_step(0, SMALL[0] // 2)
    _grab(viewer, app, "09-channels-choose.png")
    widget.channel_pick.combo.setCurrentIndex(1)  # "0: EM"
    widget.predict_button.click()
    _idle(app, widget)
    print("layers", [layer.name for layer in viewer.layers])
    for layer in viewer.layers:
        if "marker" in layer.name:
            layer.visible = False
    _grab(viewer, app, "09-channels.png")
    print("channels errors", widget.state.errors)
    viewer.close()


def _time_shot(app, tmp: Path) -> None:
    """A TZYX store (three volumes of the sample's generator) by napari-ome-zarr:
    Predict fills every time point; the view at t=1."""
    from napari_finetune.samples.synthetic_em import generate_volume

    series = np.stack([generate_volume(SMALL, seed=seed)[0] for seed in (7, 8, 9)])
    store = _write_store(tmp / "tzyx.ome.zarr", series, "tzyx")
    viewer = _viewer()
    viewer.open(str(store), plugin="napari-ome-zarr")
    widget = _dock(viewer, app)
    viewer.reset_view()
    widget.predict_button.click()
    _idle(app, widget)
    viewer.dims.set_current_step(0, 1)
    viewer.dims.set_current_step(1, SMALL[0] // 2)
    _grab(viewer, app, "10-time-series.png")
    print("time errors", widget.state.errors)
    viewer.close()


def _model_2d(path: Path, steps: int = 300) -> Path:
    """A 2D UNet trained for a few seconds on the source domain's slices (the sample's
    model is 3D): membrane and mitochondria, as the sample model."""
    import torch

    from napari_finetune.model.checkpoint import save_checkpoint
    from napari_finetune.model.unet import UNet
    from napari_finetune.samples.synthetic_em import CHANNEL_NAMES, generate_volume

    image, truth = generate_volume((16, 192, 192), seed=10, domain="source")
    low, high = np.percentile(image, (1, 99))
    x_all = ((image - low) / (high - low)).astype(np.float32)
    y_all = np.stack([truth == 1, truth == 2], axis=1).astype(np.float32)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = UNet(dims=2, in_channels=1, out_channels=2, depth=3, features=8, norm="group")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        picks = [(rng.integers(16), rng.integers(0, 129), rng.integers(0, 129)) for _ in range(8)]
        x = torch.from_numpy(np.stack([x_all[z, y:y + 64, w:w + 64][None] for z, y, w in picks]))
        t = torch.from_numpy(np.stack([y_all[z, :, y:y + 64, w:w + 64] for z, y, w in picks]))
        logits = model(x)
        prob = torch.sigmoid(logits)
        axes = (0, 2, 3)
        dice = 1 - (2 * (prob * t).sum(axes) + 1) / (prob.sum(axes) + t.sum(axes) + 1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, t) + dice.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("2D model loss", float(loss))
    return save_checkpoint(path, model, {
        "channel_names": list(CHANNEL_NAMES),
        "normalization": {"method": "percentile", "low": 1.0, "high": 99.0}})


def _2d_shot(app, tmp: Path) -> None:
    """A YX store (one slice of the sample) predicted by a 2D model."""
    from napari_finetune.samples.synthetic_em import generate_volume

    plane = generate_volume((16, 256, 256))[0][8]
    store = _write_store(tmp / "yx.ome.zarr", plane, "yx")
    checkpoint = _model_2d(tmp / "unet2d.pt")
    viewer = _viewer()
    viewer.open(str(store), plugin="napari-finetune")
    widget = _dock(viewer, app, str(checkpoint))
    viewer.reset_view()
    widget.predict_button.click()
    _idle(app, widget)
    _grab(viewer, app, "11-2d.png")
    print("2d errors", widget.state.errors)
    viewer.close()


def _structure_shot(app, tmp: Path, steps: int = 30) -> None:
    """"Add a structure…" on the sample (ZYX): vesicles, an object; disks painted on the
    vesicles of one slice with the new label (and background, membrane, mitochondria
    around them), a short run, the vesicles prediction shown."""
    import shutil

    from napari_finetune.samples.synthetic_em import (
        DEFAULT_SEEDS,
        _geometry,
        generate_volume,
        sample_checkpoint_path,
    )

    image, truth = generate_volume(SMALL)
    vesicles = _geometry(SMALL, DEFAULT_SEEDS["target"], False)[2]
    classes = truth.copy()
    classes[vesicles] = 3  # vesicles: class 3 (label 4)
    store = _write_store(tmp / "zyx.ome.zarr", image, "zyx")
    # A copy of the sample model: the widened one is written beside it, not into the package.
    checkpoint = tmp / "synthetic_em_unet.pt"
    shutil.copyfile(sample_checkpoint_path(), checkpoint)
    viewer = _viewer((1380, 960))
    viewer.open(str(store), plugin="napari-finetune")
    widget = _dock(viewer, app, str(checkpoint))
    viewer.reset_view()
    z = SMALL[0] // 2
    viewer.dims.set_current_step(0, z)
    widget.new_corrections_button.click()
    layer = widget.corrections_layer()
    row = widget.structure_row
    row.toggle.click()
    row.name.setText("vesicles")
    row.role.setCurrentIndex(0)  # object
    _grab_panel(viewer, app, widget, row, "12-structure-form.png", above=80)
    row.add_button.click()
    _wait(app, lambda: widget.state.info is not None
          and "vesicles" in widget.state.info.channel_names)
    _idle(app, widget)
    _paint_disks(layer, classes, vesicles, z, radius=2)
    s = widget.settings
    s.steps.value, s.batch_size.value = steps, 2
    widget.finetune_button.click()
    _idle(app, widget)
    for other in viewer.layers:
        other.visible = other.name in ("vesicles prediction", layer.name) \
            or other is widget.image_layer()
    _grab(viewer, app, "12-structure.png")
    print("structure errors", widget.state.errors)
    viewer.close()


def issue56_shots(names) -> None:
    import tempfile

    from qtpy.QtWidgets import QApplication

    app = QApplication.instance()
    shots = {"channels": _channels_shot, "time": _time_shot, "2d": _2d_shot,
             "structure": _structure_shot}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            shots[name](app, Path(tmp))


def main() -> int:
    import warnings

    warnings.filterwarnings("ignore", message="napari support for the PyQt5")  # a toast
    shape = os.environ.get("NAPARI_FINETUNE_SAMPLE_SHAPE", "32,256,256")
    os.environ["NAPARI_FINETUNE_SAMPLE_SHAPE"] = shape
    import napari
    from qtpy.QtWidgets import QApplication

    from napari_finetune.testing import build_hooks, oom_above_batch

    only = [n for n in os.environ.get("SHOTS", "").split(",") if n in ISSUE56]
    if only:
        napari.Viewer().close()  # the QApplication, as napari makes it
        issue56_shots(only)
        return 0
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
    issue56_shots(ISSUE56)
    return 0


if __name__ == "__main__":
    sys.exit(main())
