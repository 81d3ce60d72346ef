"""The widget trains on a dask worker: a real scheduler and worker process, napari under Xvfb."""

from __future__ import annotations

import numpy as np
import pytest
from qtpy.QtCore import Qt
from tests._qt.conftest import wait_idle

from napari_finetune._qt.run_on import SCHEDULER
from napari_finetune.session.session import Busy, Outcome

# One at a time (a LocalCluster of its own), and only under Qt 5: the run is the engine's,
# which the Qt 6 suite exercises through the local runs.
pytestmark = pytest.mark.serial


@pytest.fixture
def cluster_address():
    """The address of a real scheduler with one worker process (one thread)."""
    from distributed import LocalCluster

    with LocalCluster(processes=True, n_workers=1, threads_per_worker=1,
                      dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


def _paint(layer) -> None:
    layer.brush_size = 5
    for z in (6, 8, 10):
        layer.paint((z, 24, 24), 3)  # mitochondria
        layer.paint((z, 8, 40), 1)  # background


def test_the_widget_trains_on_a_dask_worker_with_status_labels_and_a_preview(
        docked, qtbot, cluster_address):
    viewer, widget, image = docked
    qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    _paint(viewer.layers["corrections"])
    s = widget.settings
    s.steps.value, s.batch_size.value, s.preview_interval.value = 6, 1, 0.05
    s.device.value = "cpu"
    s.run_on.where.value = SCHEDULER
    s.run_on.address.value = cluster_address
    qtbot.waitUntil(lambda: "mitochondria prediction" in viewer.layers)  # with the layer
    before = viewer.layers["mitochondria prediction"].data.copy()
    ended = []
    widget.controller.session.events.ended.connect(ended.append)

    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    assert widget.state.busy is Busy.TRAIN and widget.stop_button.isEnabled()
    wait_idle(qtbot, widget)

    assert [(e.action, e.outcome) for e in ended][:1] == [(Busy.TRAIN, Outcome.DONE)], ended
    statuses = widget.state.statuses
    assert statuses[-1].kind == "finished" and statuses[-1].step == 6, [
        st.kind for st in statuses]
    panel = widget.status_panel
    log = panel.log.toPlainText()
    assert f"to the dask scheduler at {cluster_address}" in log  # what went over the wire
    # Which worker and device the run got, in the panel's log and on the Session's trainer.
    trainer = widget.state.trainer
    assert trainer.placement.startswith("the dask worker tcp://")
    assert trainer.placement.endswith(", device cpu)")
    assert f"training on {trainer.placement}" in log
    assert panel.dtype_label.text() == "fp32 (mixed precision off)"
    assert panel.batch_label.text() == "batch 1 × accumulation 1 (effective 1)"
    assert len(panel.loss_plot.losses) == 6
    assert widget.state.previews >= 1
    # The weights came back: the worker's run record, and the prediction made with them.
    trainer = widget.state.trainer
    assert trainer.steps_done == 6 and trainer.run_record is not None
    assert trainer.run_record["steps_done"] == 6
    after = viewer.layers["mitochondria prediction"].data
    assert np.count_nonzero(after != before) > 0
    assert not widget.state.errors


def test_a_plain_tcp_scheduler_of_another_machine_is_confirmed_and_a_no_starts_nothing(
        docked, qtbot, monkeypatch):
    from napari_finetune._qt import run_on

    viewer, widget, _ = docked
    asked = []

    def question(parent, title, text, *args):
        asked.append(text)
        return run_on.QMessageBox.No

    monkeypatch.setattr(run_on.QMessageBox, "question", question)
    qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    _paint(viewer.layers["corrections"])
    s = widget.settings
    s.device.value, s.run_on.where.value = "cpu", SCHEDULER
    s.run_on.address.value = "tcp://10.1.2.3:8786"
    qtbot.waitUntil(lambda: "mitochondria prediction" in viewer.layers)
    session = widget.controller.session
    ended = []
    session.events.ended.connect(ended.append)

    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: bool(asked) and widget.state.busy is None)
    assert len(asked) == 1 and "tcp://10.1.2.3:8786 is not encrypted" in asked[0]
    # No run started: no job ended, no trainer, no status.
    assert ended == [] and session.trainer is None and session.history == []
    assert widget.state.statuses == []
    assert widget.controller.session.unencrypted_ok == set()
    assert "declined" in widget.status_panel.log.toPlainText()


def test_closing_napari_mid_run_ends_the_job_and_keeps_the_last_weights_beside_the_store(
        docked, qtbot, cluster_address):
    import time

    from napari_finetune.loading import load_checkpoint
    from napari_finetune.remote.finetuner import kept_path

    viewer, widget, image = docked
    store = image.metadata["ome_zarr_path"]
    qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    _paint(viewer.layers["corrections"])
    s = widget.settings
    s.steps.value, s.batch_size.value, s.preview_interval.value = 500, 1, 0.0
    s.device.value, s.run_on.where.value = "cpu", SCHEDULER
    s.run_on.address.value = cluster_address
    qtbot.waitUntil(lambda: "mitochondria prediction" in viewer.layers)
    state = widget.state
    assert not kept_path(store).exists()

    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: any(st.kind == "step" for st in state.statuses), timeout=120_000)
    workers = list(state.runner.workers)
    assert workers  # the run's among them
    started = time.monotonic()
    viewer.close()
    # Returned from close: the run's job let go of its thread, within the close's 10 s.
    assert time.monotonic() - started < 10.0
    assert state.closed and all(w.ended.is_set() or not w.began.is_set() for w in workers)
    trainer = state.trainer or widget.controller.session.trainer
    assert trainer is not None and 1 <= trainer.steps_done < 500
    kept = load_checkpoint(kept_path(store))
    assert kept.metadata["run"]["steps_done"] == trainer.steps_done
    assert kept.metadata["run"]["worker"] == trainer.worker
    for name, value in trainer.model.state_dict().items():
        assert (kept.model.state_dict()[name] == value).all(), name
