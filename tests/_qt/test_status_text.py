"""The status panel's texts, from Status events as the engine yields them."""

from __future__ import annotations

from napari_finetune._qt.status_panel import (
    batch_text,
    dtype_text,
    eta_text,
    format_seconds,
    switch_text,
)
from napari_finetune.trainer.status import Status


def _status(**kw) -> Status:
    base = dict(kind="step", dtype="float32", grad_scaler=False, batch_size=4, accumulation=2,
                distillation="on", hold_other_channels="on", step=10, total_steps=40, epoch=0,
                loss=0.5, message="", distillation_weight=0.5, elapsed_s=20.0)
    base.update(kw)
    return Status(**base)


def test_dtype_text():
    assert dtype_text(_status(dtype="bfloat16")) == "bf16"
    assert dtype_text(_status(dtype="float16", grad_scaler=True)) == "fp16 with loss scaling"
    assert dtype_text(_status()) == "fp32 (mixed precision off)"


def test_batch_text():
    assert batch_text(_status()) == "batch 4 × accumulation 2 (effective 8)"


def test_switch_text():
    assert switch_text("on", 0.5, None) == "on (weight 0.5)"
    assert switch_text("off", 0.0, None) == "off"
    assert switch_text("dropped", 0.0, 12) == "dropped after out-of-memory at step 12"
    assert switch_text("on", None, None) == "on"


def test_eta_text():
    assert eta_text(_status()) == "step 10 / 40, ETA 1:00"
    assert eta_text(_status(step=0, elapsed_s=3.0)) == "step 0 / 40"
    assert format_seconds(3725) == "1:02:05"


def test_panel_shows_validation_scores_plots_and_logs_them_once(qtbot):
    from napari_finetune._qt.status_panel import StatusPanel

    panel = StatusPanel()
    qtbot.addWidget(panel)
    panel.start_run(20)
    panel.show_status(_status(step=1, message="step 1/20: loss 0.5"))
    assert panel.validation_label.text() == "–" and panel.log.toPlainText() == ""
    scores = {"membrane": 0.861, "mitochondria": 0.7}
    line = "step 10/20: loss 0.3; validation at step 10 (IoU on held-out strokes): ..."
    panel.show_status(_status(step=10, validation=scores, message=line))
    panel.show_status(_status(step=11, validation=scores, message="step 11/20: loss 0.2"))
    assert panel.validation_label.text() == (
        "IoU membrane 0.86, mitochondria 0.70 on held-out strokes (0–1)")
    assert panel.log.toPlainText() == line  # the check's step is logged, the next is not
    assert panel.loss_plot.scores == [(10, (0.861 + 0.7) / 2)]
    panel.loss_plot.resize(300, 80)
    panel.loss_plot.grab()  # paints both curves without error
    panel.start_run(20)
    assert panel.validation_label.text() == "–" and panel.loss_plot.scores == []


def test_recovery_marks_read_what_changed_from_the_fields():
    from napari_finetune._qt.loss_plot import recovery_marks

    before = _status(dtype="bfloat16", batch_size=4)
    assert recovery_marks(None, before) == []
    assert recovery_marks(None, before, start_batch=8) == ["batch halved"]  # in the probe
    assert recovery_marks(before, _status(dtype="bfloat16", batch_size=2)) == ["batch halved"]
    assert recovery_marks(before, _status(batch_size=4)) == ["fp32"]
    dropped = _status(dtype="bfloat16", distillation="dropped", dropped_at_step=3)
    assert recovery_marks(before, dropped) == ["distillation dropped"]
    assert recovery_marks(dropped, dropped) == []  # only the change is marked


def test_panel_shows_an_out_of_memory_run_as_its_statuses_tell_it(qtbot):
    """The statuses of a run that ran out of memory in its probe (as the Session test of that
    run records them): the labels say what is in use, each recovery is a log line and a mark
    on the loss curve, and the routine steps are not logged."""
    from napari_finetune._qt.status_panel import StatusPanel

    oom = dict(batch_size=1, accumulation=2, step=0, total_steps=2, loss=None,
               samples_per_step=2)
    dropped = dict(oom, distillation="dropped", hold_other_channels="dropped",
                   distillation_weight=0.0, dropped_at_step=1)
    run = [
        _status(kind="recovery", **oom, message="out of memory in the precision probe: "
                "batch 2 → 1, accumulation 1 → 2 (effective 2)"),
        _status(kind="recovery", **dropped, message="out of memory in the precision probe at "
                "batch 1: dropped distillation and the hold on the other channels"),
        _status(kind="probe", **dropped, message="precision probe passed at batch 1 × 2"),
        _status(kind="step", **{**dropped, "step": 1, "loss": 0.74}, message="step 1/2"),
        _status(kind="step", **{**dropped, "step": 2, "loss": 0.73}, message="step 2/2"),
        _status(kind="finished", **{**dropped, "step": 2, "loss": 0.73},
                message="finished 2 steps"),
    ]
    panel = StatusPanel()
    qtbot.addWidget(panel)
    panel.start_run(2, batch_size=2)
    for status in run:
        panel.show_status(status)
    assert panel.batch_label.text() == "batch 1 × accumulation 2 (effective 2)"
    assert panel.distillation_label.text() == "dropped after out-of-memory at step 1"
    assert panel.hold_label.text() == "dropped after out-of-memory at step 1"
    assert panel.loss_plot.losses == [0.74, 0.73]
    assert panel.loss_plot.marks == [(1, "batch halved"), (1, "distillation dropped")]
    assert panel.log.toPlainText().splitlines() == [
        s.message for s in run if s.kind != "step"]
