"""Fine-tune from the dock: real buttons, real training, Stop, Export, closing mid-run.

What a run does (out of memory, a failing preview, refusals) is the Session's, tested
headless in tests/session; here, what the dock adds: its layers, buttons and lifecycle.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from napari.utils.notifications import NotificationSeverity, notification_manager
from qtpy.QtCore import Qt, QTimer
from qtpy.QtWidgets import QFileDialog
from tests._qt.conftest import choose_checkpoint, dock_panel, wait_idle

from napari_finetune.session.session import Busy, Outcome

STALL_BOUND_MS = 250  # generous: the machine is shared; the benchmark's goal is 50 ms
CLICK_BOUND_MS = 150  # generous too (goal 50 ms)


class StallMeter:
    """A 10 ms QTimer on the main thread; the longest gap between ticks is the worst freeze."""

    def __init__(self) -> None:
        self.ticks: list[float] = []
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(lambda: self.ticks.append(time.perf_counter()))

    def __enter__(self) -> StallMeter:
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.stop()

    @property
    def max_gap_ms(self) -> float:
        return float(np.diff(self.ticks).max() * 1000) if len(self.ticks) > 1 else float("inf")


def _paint(layer) -> None:
    """Strokes as the brush makes them: mitochondria on a blob, background beside it."""
    layer.brush_size = 5
    for z in (6, 8, 10):
        layer.paint((z, 24, 24), 3)  # mitochondria
        layer.paint((z, 40, 44), 3)
        layer.paint((z, 8, 40), 1)  # background
        layer.paint((z, 56, 8), 1)


def _setup_run(viewer, widget, qtbot, steps: int, batch: int, preview_s: float = 0.0):
    qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    layer = viewer.layers["corrections"]
    _paint(layer)
    s = widget.settings
    s.steps.value = steps
    s.batch_size.value = batch
    s.preview_interval.value = preview_s
    s.device.value = "cpu"
    return layer


def _warnings() -> list[str]:
    return [str(n.message) for n in notification_manager.records
            if n.severity == NotificationSeverity.WARNING]


@pytest.mark.serial  # a bound on the main thread's stalls
def test_finetune_refreshes_prediction_and_status_without_freezing(docked, qtbot):
    viewer, widget, image = docked
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    before = viewer.layers["mitochondria prediction"].data.copy()
    layer = _setup_run(viewer, widget, qtbot, steps=6, batch=2, preview_s=0.05)
    widget.settings.mode.value = "full"  # full fine-tune: big enough moves in 6 steps
    widget.settings.learning_rate.value = 0.01

    with StallMeter() as meter:
        qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
        assert widget.state.busy is Busy.TRAIN and widget.stop_button.isEnabled()
        assert not widget.predict_button.isEnabled()
        wait_idle(qtbot, widget)
    kinds = [st.kind for st in widget.state.statuses]
    assert kinds[0] == "probe" and kinds[-1] == "finished", kinds
    assert widget.state.statuses[-1].step == 6
    assert widget.status_panel.dtype_label.text() == "fp32 (mixed precision off)"  # CPU
    assert widget.status_panel.batch_label.text() == "batch 2 × accumulation 1 (effective 2)"
    # The test's small model gets most of this painting wrong: the widget's run checks
    # that before step 1 and trains without distillation (trainer/teacher_agreement.py).
    assert widget.status_panel.distillation_label.text() == "off"
    assert widget.status_panel.hold_label.text() == "on"
    assert len(widget.status_panel.loss_plot.losses) == 6
    assert widget.state.previews >= 1 and "first_preview_s" in widget.state.timings
    # The whole prediction was recomputed with the new weights after the run.
    after = viewer.layers["mitochondria prediction"].data
    assert np.count_nonzero(after != before) > 0
    # The corrections went into the store before training.
    from napari_finetune.io.omezarr import load_corrections

    np.testing.assert_array_equal(load_corrections(image.metadata["ome_zarr_path"]), layer.data)
    print(f"main-thread max gap while fine-tuning: {meter.max_gap_ms:.0f} ms; click -> first "
          f"preview {widget.state.timings['first_preview_s']:.2f} s")  # shown with -s
    assert meter.max_gap_ms < STALL_BOUND_MS, f"main thread stalled {meter.max_gap_ms:.0f} ms"
    assert widget.predict_button.isEnabled() and widget.export_button.isEnabled()
    assert not widget.state.errors


def test_a_panel_deleted_under_a_run_ends_the_run_and_keeps_the_painting(
        docked, qtbot, monkeypatch):
    """Qt deleted the panel's C++ side without the close hooks having run: the next status
    cannot be shown, so the widget shuts down as when it closes (the run ends at its next
    step, the painting is saved), rather than training on for nobody."""
    viewer, widget, image = docked
    _setup_run(viewer, widget, qtbot, steps=500, batch=1)
    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: any(st.kind == "step" for st in widget.state.statuses),
                    timeout=60_000)

    def deleted(status: object) -> None:
        raise RuntimeError("wrapped C/C++ object of type QLabel has been deleted")

    monkeypatch.setattr(widget.status_panel, "show_status", deleted)
    qtbot.waitUntil(lambda: widget.controller.session.busy is None, timeout=120_000)
    statuses = widget.state.statuses
    assert widget.state.closed
    assert statuses[-1].kind == "stopped" and statuses[-1].step < 500, [
        st.kind for st in statuses[-3:]]


def test_deleted_layers_come_back_stop_keeps_the_weights_and_export_reloads(
        docked, qtbot, monkeypatch, tmp_path):
    """A prediction layer deleted before the run comes back for its previews; Stop ends the
    run with the weights of its last step, the whole prediction follows, Export saves them."""
    viewer, widget, image = docked
    layer = _setup_run(viewer, widget, qtbot, steps=500, batch=1, preview_s=0.05)
    names = [f"{c} prediction" for c in widget.state.info.channel_names]
    qtbot.waitUntil(lambda: all(n in viewer.layers for n in names), timeout=20_000)
    viewer.layers.remove(names[0])
    viewer.layers.selection.active = layer
    ended = []
    widget.controller.session.events.ended.connect(ended.append)
    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: widget.state.previews >= 1, timeout=60_000)
    assert all(n in viewer.layers for n in names)
    assert viewer.layers.selection.active is layer  # strokes still go to the corrections
    qtbot.mouseClick(widget.stop_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    last = widget.state.statuses[-1]
    # Stop reached the run between two steps: it said so, and that step's weights are kept.
    assert last.kind == "stopped" and 1 <= last.step < 500, [st.kind for st in
                                                               widget.state.statuses]
    # The run ended stopped; the whole prediction with its weights came after.
    assert [(e.action, e.outcome) for e in ended] == [
        (Busy.TRAIN, Outcome.STOPPED), (Busy.PREDICT, Outcome.DONE)]
    assert widget.state.trainer.steps_done == last.step
    assert widget.status_panel.progress.format().startswith(f"stopped after step {last.step}")
    assert widget.export_button.isEnabled()
    # The run gave back what only training needs; the weights stay for Export.
    assert widget.state.trainer.optimizer is None and widget.state.trainer.teacher is None

    target = tmp_path / "exported.pt"
    asked = {}

    def fake_dialog(parent, title, default, filters):
        asked["default"] = default
        return str(target), filters

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(fake_dialog))
    qtbot.mouseClick(widget.export_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert asked["default"].endswith("tiny-finetuned.pt")  # next to the data
    assert widget.state.exported == str(target)
    assert target.name in widget.output_label.text()
    assert widget.output_label.toolTip() == str(target)

    from napari_finetune.model.checkpoint import load_checkpoint

    ckpt = load_checkpoint(target)
    assert ckpt.channel_names == widget.state.info.channel_names
    assert ckpt.metadata["run"]["steps_done"] == last.step
    # The file holds the weights the run stopped with (adapters merged).
    from napari_finetune.data.normalization import normalize
    from napari_finetune.predict import predict_block

    region = (slice(0, 16), slice(0, 32), slice(0, 32))
    trainer = widget.state.trainer
    block = normalize(np.asarray(image.data)[region], *trainer.normalization_range)
    np.testing.assert_allclose(predict_block(ckpt.model, block), trainer.predict(region),
                               atol=1e-4)


def test_nothing_painted_is_refused_in_one_line_and_returns_to_idle(docked, qtbot):
    viewer, widget, image = docked
    qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    widget.settings.steps.value = 2
    before = len(_warnings())
    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    # The Session refuses before anything starts: no job, no run, the reason shown.
    assert len(_warnings()) > before and _warnings()[-1].startswith("Nothing painted")
    assert "Nothing painted" in widget.status_panel.log.toPlainText()
    assert widget.state.statuses == [] and widget.state.trainer is None
    assert widget.finetune_button.isEnabled() and not widget.stop_button.isEnabled()


def test_closing_the_dock_stops_the_run(docked, qtbot):
    viewer, widget, image = docked
    _setup_run(viewer, widget, qtbot, steps=500, batch=1)
    state = widget.state
    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    # A step first: a run removed before step 1 cannot tell a stop from a run never begun.
    qtbot.waitUntil(lambda: any(st.kind == "step" for st in state.statuses), timeout=60_000)
    trainer = state.trainer
    viewer.window.remove_dock_widget("all")
    assert state.closed and state.stop_requested
    qtbot.waitUntil(lambda: state.running == 0, timeout=120_000)
    # The run ended at an event after a whole step, and the closed widget's state still
    # recorded the steps it made after the removal: the last one is the trainer's.
    last = state.statuses[-1]
    assert last.kind == "stopped" and 1 <= last.step < 500, [st.kind for st in state.statuses]
    assert trainer.steps_done == last.step and not state.errors


def test_a_2d_image_with_a_2d_model(make_napari_viewer, qtbot, tmp_path):
    """YX data: predict, paint, fine-tune with preview, as for a volume."""
    import torch
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image
    from tests._qt.conftest import CHANNELS, make_volume

    from napari_finetune.model.checkpoint import save_checkpoint
    from napari_finetune.model.unet import UNet

    path = tmp_path / "plane.ome.zarr"
    write_image(make_volume()[8], zarr.group(store=parse_url(str(path), mode="w").store),
                axes="yx", scale_factors=[])
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "unet2d.pt", UNet(dims=2, out_channels=2, depth=2,
                                                        features=4), {"channel_names": CHANNELS})
    viewer = make_napari_viewer()
    viewer.open(str(path), plugin="napari-finetune")
    widget = dock_panel(viewer, qtbot)
    choose_checkpoint(qtbot, widget, str(ckpt))
    qtbot.waitUntil(lambda: widget.state.info is not None, timeout=20_000)
    qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    layer = viewer.layers["corrections"]
    layer.brush_size = 5
    layer.paint((24, 24), 3)
    layer.paint((8, 40), 1)
    widget.settings.steps.value = 2
    widget.settings.preview_interval.value = 0.1
    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert widget.state.statuses[-1].kind == "finished", widget.state.errors
    assert widget.state.previews >= 1 and not widget.state.errors, (
        widget.controller.session.region, [s.kind for s in widget.state.statuses])
    assert viewer.layers["membrane prediction"].data.shape == (64, 64)


@pytest.mark.serial  # bounds on the click handler and the stalls
def test_the_prediction_layers_come_with_the_corrections_not_with_the_click(docked, qtbot):
    """Nothing predicted yet: the layers are added when a corrections layer is chosen, one
    per event-loop turn, below it (strokes on top); the click adds none (napari's
    add_labels: 0.2-0.4 s each)."""
    viewer, widget, image = docked
    layer = _setup_run(viewer, widget, qtbot, steps=2, batch=1, preview_s=0.05)
    names = [f"{c} prediction" for c in widget.state.info.channel_names]
    qtbot.waitUntil(lambda: all(n in viewer.layers for n in names), timeout=20_000)
    qtbot.waitUntil(lambda: viewer.layers.selection.active is layer, timeout=5_000)
    order = [lay.name for lay in viewer.layers]
    assert order.index(image.name) < max(map(order.index, names)) < order.index(layer.name)
    added: list[str] = []
    viewer.layers.events.inserted.connect(lambda event: added.append(event.value.name))
    with StallMeter() as meter:
        start = time.perf_counter()
        qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
        click_ms = (time.perf_counter() - start) * 1000
        wait_idle(qtbot, widget)
    assert added == []  # the run and the prediction after it used the layers that were there
    assert viewer.layers.selection.active is layer  # strokes still go to the corrections
    assert widget.state.statuses[-1].kind == "finished", widget.state.errors
    assert not widget.state.errors and widget.state.previews >= 1
    print(f"Fine-tune click handler: {click_ms:.0f} ms, longest stall {meter.max_gap_ms:.0f} ms")
    assert click_ms < CLICK_BOUND_MS, f"the click handler took {click_ms:.0f} ms"
    assert meter.max_gap_ms < STALL_BOUND_MS, f"main thread stalled {meter.max_gap_ms:.0f} ms"


def test_stop_before_the_run_began(docked, qtbot):
    """Stop pressed while the prediction layers are still being added: no run starts."""
    viewer, widget, image = docked
    _setup_run(viewer, widget, qtbot, steps=50, batch=1)
    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    assert widget.stop_button.isEnabled()
    qtbot.mouseClick(widget.stop_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert widget.state.statuses == [] and widget.state.trainer is None
    assert widget.finetune_button.isEnabled() and not widget.state.errors
    assert "stopped" in widget.status_panel.progress.format()


def test_closing_the_viewer_saves_the_painting_and_waits_for_the_run(docked, qtbot):
    """In-process view of what the subprocess cases check: the close itself ends the work."""
    from napari_finetune.io.omezarr import load_corrections

    viewer, widget, image = docked
    layer = _setup_run(viewer, widget, qtbot, steps=500, batch=1)
    state = widget.state
    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: any(st.kind == "step" for st in state.statuses), timeout=60_000)
    layer.paint((12, 56, 56), 2)  # a stroke the autosave timer has not saved yet
    painted = np.array(layer.data, copy=True)
    workers = list(state.runner.workers)
    assert workers  # the run's worker among them
    viewer.close()
    # Returned from close: the run's worker let go of its thread, the stroke is on disk.
    assert state.closed and all(w.ended.is_set() or not w.began.is_set() for w in workers)
    np.testing.assert_array_equal(load_corrections(image.metadata["ome_zarr_path"]), painted)
    assert state.trainer is not None and state.trainer.steps_done < 500
