"""The panel's own line for where a remote run trains, or what it waits for: a real
LocalCluster (one CPU worker), napari under Xvfb."""

from __future__ import annotations

import pytest
from qtpy.QtCore import Qt
from tests._qt.conftest import wait_idle

from napari_finetune._qt.run_on import SCHEDULER
from napari_finetune._qt.status_panel import placement_text
from napari_finetune.session.session import Busy, Outcome

pytestmark = pytest.mark.serial  # a LocalCluster of its own, as test_widget_remote


@pytest.fixture
def cluster_address():
    """The address of a real scheduler with one worker process (one thread, no GPU)."""
    from distributed import LocalCluster

    with LocalCluster(processes=True, n_workers=1, threads_per_worker=1,
                      dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


def test_placement_text_says_where_or_what_the_run_waits_for():
    assert placement_text("the dask worker tcp://h:1 (host h, device cpu)") == (
        "Trains on the dask worker tcp://h:1 (host h, device cpu)")
    assert placement_text("waiting for a worker with a GPU (GPU=1), 1 run ahead") == (
        "Queued: waiting for a worker with a GPU (GPU=1), 1 run ahead")


def _paint(layer) -> None:
    layer.brush_size = 5
    for z in (6, 8, 10):
        layer.paint((z, 24, 24), 3)
        layer.paint((z, 8, 40), 1)


def test_the_panel_says_what_a_queued_run_waits_for_then_where_a_run_trains(
        docked, qtbot, cluster_address, monkeypatch):
    import napari_finetune.remote.finetuner as finetuner

    viewer, widget, _ = docked
    qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    _paint(viewer.layers["corrections"])
    s = widget.settings
    s.steps.value, s.batch_size.value, s.preview_interval.value = 2, 1, 0.0
    s.device.value, s.run_on.where.value = "cpu", SCHEDULER
    s.run_on.address.value = cluster_address
    qtbot.waitUntil(lambda: "mitochondria prediction" in viewer.layers)
    label = widget.status_panel.placement_label
    assert label.isHidden()  # no remote run yet
    ended = []
    widget.controller.session.events.ended.connect(ended.append)
    # The CPU run asks for a GPU anyway: no worker of this cluster has one, so it queues.
    monkeypatch.setattr(finetuner, "resources_for", lambda device: {"GPU": 1})

    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: not label.isHidden(), timeout=120_000)
    assert label.text() == "Queued: waiting for a worker with a GPU (GPU=1), 0 runs ahead"
    assert widget.state.busy is Busy.TRAIN
    qtbot.mouseClick(widget.stop_button, Qt.LeftButton)  # ends the wait at once
    wait_idle(qtbot, widget)
    assert [(e.action, e.outcome) for e in ended][:1] == [(Busy.TRAIN, Outcome.STOPPED)]

    monkeypatch.undo()  # the CPU run asks for no GPU: the worker takes it
    ended.clear()
    qtbot.mouseClick(widget.finetune_button, Qt.LeftButton)
    assert label.isHidden()  # a new run: the last run's place is not this one's
    qtbot.waitUntil(lambda: label.text().startswith("Trains on the dask worker tcp://"),
                    timeout=120_000)
    assert label.text().endswith(", device cpu)") and not label.isHidden()
    wait_idle(qtbot, widget)
    trainer = widget.state.trainer
    assert ended[0].outcome is Outcome.DONE
    assert label.text() == f"Trains on {trainer.placement}"
    assert widget.controller.session.placement == trainer.placement
