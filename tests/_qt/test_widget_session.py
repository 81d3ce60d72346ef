"""The widget bound to its Session: the Session's busy, refusals and failures, seen in the dock."""

from __future__ import annotations

from pathlib import Path

from qtpy.QtCore import Qt
from tests._qt.conftest import dock_panel, wait_idle

from napari_finetune.session.events import PreviewFailed, RunStatus
from napari_finetune.session.session import Busy, Outcome


def test_predict_is_the_sessions_and_its_refusals_and_failures_show_in_one_line(docked, qtbot):
    viewer, widget, image = docked
    session, log = widget.controller.session, widget.status_panel.log
    ended = []
    session.events.ended.connect(ended.append)

    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    # The Session runs it; its busy is the widget's, and the buttons follow it.
    assert session.busy is Busy.PREDICT and widget.state.busy is Busy.PREDICT
    assert not widget.predict_button.isEnabled() and not widget.objects_button.isEnabled()
    assert session.finetune() is False  # asked meanwhile: the reason is in the dock's log
    assert log.toPlainText().splitlines()[-1] == (
        "Cannot fine-tune: busy with predict; wait for it to end.")
    wait_idle(qtbot, widget)
    assert ended[-1].outcome is Outcome.DONE and widget.predict_button.isEnabled()
    assert all(f"{c} prediction" in viewer.layers for c in session.channel_names)

    # The checkpoint became unreadable after it was read: Predict fails in its worker.
    Path(widget.state.info.path).write_bytes(b"not a checkpoint any more")
    before = len(widget.state.errors)
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert ended[-1].outcome is Outcome.FAILED
    line = widget.state.errors[-1]
    assert len(widget.state.errors) == before + 1 and line == ended[-1].reason
    assert line.startswith("predict failed: ") and "\n" not in line
    assert log.toPlainText().splitlines()[-1] == line
    assert widget.predict_button.isEnabled() and widget.state.running == 0


def test_the_runs_statuses_and_failed_previews_reach_the_panel(make_napari_viewer, qtbot):
    """The Session passes a run's events on (its tests: what an out-of-memory run and a
    failing preview yield); the dock shows each status and logs a failed preview in one line."""
    from tests._qt.test_status_text import _status

    viewer = make_napari_viewer()
    widget = dock_panel(viewer, qtbot)
    events = widget.controller.session.events
    recovery = _status(kind="recovery", batch_size=1, accumulation=2, message="batch 2 → 1")
    events.job_event.emit(RunStatus(recovery))
    assert widget.state.statuses == [recovery]
    assert widget.status_panel.batch_label.text() == "batch 1 × accumulation 2 (effective 2)"
    events.job_event.emit(PreviewFailed("MemoryError: no room for the preview"))
    assert widget.status_panel.log.toPlainText().splitlines() == [
        "batch 2 → 1", "Preview failed, the run goes on: MemoryError: no room for the preview"]
    wait_idle(qtbot, widget)


def test_stop_during_a_prediction_keeps_what_was_predicted(docked, qtbot):
    """Stop of a prediction (the one after a run took a minute on a real crop): the region
    in view is shown first, the Stop button ends the rest, and what was predicted stays
    in the prediction layers."""
    from napari_finetune.session.events import RegionPredicted

    viewer, widget, image = docked
    session = widget.controller.session
    seen = []

    def stop_once_the_view_is_there(event):
        if isinstance(event, RegionPredicted):
            seen.append(event)
            assert widget.stop_button.isEnabled()
            qtbot.mouseClick(widget.stop_button, Qt.LeftButton)

    session.events.job_event.connect(stop_once_the_view_is_there)
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    session.events.job_event.disconnect(stop_once_the_view_is_there)
    assert seen, "no region was predicted first"
    prediction = session.prediction
    assert prediction is not None and session.last_end is not None
    # The click races the rest of the prediction (the view may hold all its blocks): a
    # Stop in time keeps what was done and says so; one after the last block stopped
    # nothing, and the end says the prediction finished (it said "stopped ... nothing
    # of it was kept" of a whole prediction before).
    if prediction.complete:
        assert session.last_end.outcome is Outcome.DONE, session.last_end
    else:
        assert session.last_end.outcome is Outcome.STOPPED
        assert session.last_end.reason == (
            "prediction stopped; the blocks predicted so far are kept")
    layers = [viewer.layers[f"{c} prediction"] for c in ("membrane", "mitochondria")]
    region = seen[0].region
    for layer, mask in zip(layers, prediction.masks, strict=True):
        assert (layer.data[region] == mask[region]).all()
    assert not widget.stop_button.isEnabled() and widget.predict_button.isEnabled()


def test_the_slice_on_screen_is_predicted_first(docked, qtbot):
    """The region predicted first was the previews' one, the slice with 16 slices of
    context on each side (20 s after Stop on the walk's sample): now the slice itself."""
    from napari_finetune.session.events import RegionPredicted

    viewer, widget, image = docked
    session = widget.controller.session
    z = image.data.shape[0] // 2 if not image.multiscale else image.data[0].shape[0] // 2
    viewer.dims.set_current_step(0, z)
    seen = []

    def keep(event):
        if isinstance(event, RegionPredicted):
            seen.append(event.region)

    session.events.job_event.connect(keep)
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    session.events.job_event.disconnect(keep)
    assert seen and seen[0][0] == slice(z, z + 1), seen
