"""The Session's actions, headless: real jobs on the tiny store, run by the inline runner."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.session.conftest import CHANNELS, tiny_config

from napari_finetune.session.session import ActionEnd, Busy, Outcome
from napari_finetune.session.viewer import LayerKind


def test_predict_fills_the_session_and_shows_a_layer_per_channel(session, record):
    assert session.predict() is True
    assert record["busy"] == [Busy.PREDICT, None]
    assert record["ended"] == [ActionEnd(Busy.PREDICT, Outcome.DONE, "")]
    assert session.busy is None
    masks = session.prediction.masks
    assert len(masks) == len(CHANNELS) and masks[0].shape == session.image.shape
    assert session.viewer.shown[-2:] == [f"prediction-{c}" for c in CHANNELS]  # view first
    assert session.viewer.layers["prediction-membrane"][1] is LayerKind.LABELS


def test_finetune_records_the_run_then_exports_and_predicts_with_it(session, record, tmp_path):
    from napari_finetune.io.omezarr import load_corrections
    from napari_finetune.loading import load_checkpoint

    session.preview_interval_s = 1e-6  # a preview after every step
    assert session.finetune() is True
    end = record["ended"][-1]
    assert (end.action, end.outcome) == (Busy.TRAIN, Outcome.DONE), end
    assert session.trainer.steps_done == 2
    assert [s.kind for s in session.history][-1] == "finished"
    assert record["status"] == session.history and session.status is session.history[-1]
    assert "preview-membrane" in session.viewer.layers  # the shown region's previews
    # The corrections went into the store before the run.
    np.testing.assert_array_equal(load_corrections(session.store), session.corrections)

    out = str(tmp_path / "tuned.pt")
    assert session.export(out) is True
    assert record["ended"][-1] == ActionEnd(Busy.EXPORT, Outcome.DONE, f"exported {out}")
    assert load_checkpoint(out).metadata["run"]["steps_done"] == 2

    assert session.predict() is True  # with the run's weights, not the checkpoint's
    assert record["ended"][-1].outcome is Outcome.DONE
    assert len(session.prediction.masks) == len(CHANNELS)


def test_an_unreadable_checkpoint_fails_with_one_line_and_frees_the_session(
        session, record, tmp_path):
    from napari_finetune.errors import first_line
    from napari_finetune.loading import load_checkpoint

    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint at all")
    session.checkpoint = str(broken)
    assert session.finetune() is True  # it started; the job fails in the runner
    end = record["ended"][-1]
    assert (end.action, end.outcome) == (Busy.TRAIN, Outcome.FAILED)
    assert "\n" not in end.reason, end.reason
    with pytest.raises(Exception) as raised:  # the loader's own words, first line only
        load_checkpoint(broken)
    assert end.reason == f"fine-tune failed: {first_line(raised.value)}", end.reason
    assert session.busy is None and session.trainer is None
    assert session.last_end is end
    assert session.predict() is True  # the next action is not refused
    assert record["ended"][-1].outcome is Outcome.FAILED  # the same file, the same failure


def test_stop_during_a_run_ends_after_the_step_and_keeps_its_weights(session, record):
    from napari_finetune.loading import load_checkpoint

    session.config = tiny_config(steps=6)

    def stop_after_the_second_step(status):
        if status.kind == "step" and status.step == 2:
            session.stop()

    session.events.status.connect(stop_after_the_second_step)
    assert session.finetune() is True
    end = record["ended"][-1]
    assert end == ActionEnd(Busy.TRAIN, Outcome.STOPPED,
                            "stopped after step 2 of 6; the weights of that step are kept")
    assert session.trainer.steps_done == 2
    assert session.history[-1].kind == "stopped"
    start = load_checkpoint(session.checkpoint).model.state_dict()
    tuned = session.trainer.model.state_dict()
    assert any(not torch.equal(start[k], tuned[k]) for k in start), "no step was kept"


def test_an_action_asked_while_another_runs_is_refused_with_a_reason(session, record):
    answers = []

    def predict_during_the_run(status):
        if status.kind == "step" and not answers:
            answers.append(session.predict())
            answers.append(session.finetune())

    session.events.status.connect(predict_during_the_run)
    assert session.finetune() is True
    assert answers == [False, False]
    assert record["refused"] == [
        "Cannot predict: busy with fine-tune; wait for it to end or press Stop.",
        "Cannot fine-tune: busy with fine-tune; wait for it to end or press Stop.",
    ]
    assert [e.action for e in record["ended"]] == [Busy.TRAIN]  # nothing else ran
    assert record["ended"][-1].outcome is Outcome.DONE
    assert session.trainer.steps_done == 2


def test_actions_without_their_inputs_are_refused_before_any_job(session, record):
    session.corrections = np.zeros_like(session.corrections)
    assert session.finetune() is False
    assert session.export("x.pt") is False
    assert session.objects() is False
    assert record["refused"] == [
        "Nothing painted: paint a few corrections first.",
        "Cannot export: no fine-tuning step was applied yet; fine-tune first.",
        "No prediction yet: press Predict first.",
    ]
    assert record["busy"] == [] and record["ended"] == []


def test_objects_and_saving_the_prediction(session, record):
    import zarr

    from napari_finetune.objects import ChannelRole

    session.roles = {"mitochondria": ChannelRole("object", threshold=0.5)}
    assert session.predict() is True
    assert set(session.prediction.probabilities) == {1}  # the channel with a role only
    assert session.objects() is True
    assert record["ended"][-1] == ActionEnd(Busy.OBJECTS, Outcome.DONE, "")
    assert set(session.found_objects) == {"mitochondria"}
    assert "objects-mitochondria" in session.viewer.layers
    assert session.save_predictions() is True
    assert record["ended"][-1].outcome is Outcome.DONE, record["ended"][-1]
    labels = zarr.open_group(f"{session.store}/labels", mode="r")
    names = set(labels.group_keys())
    assert {"prediction-membrane", "prediction-mitochondria"} <= names, names


def test_suggest_shows_the_uncertainty_once_and_moves_on(session, record):
    assert session.suggest((8, 20, 20)) is True
    first = session.suggestion
    assert first is not None and session.viewer.shown == ["uncertainty"]
    assert session.suggest((8, 20, 20)) is True
    assert session.suggestion is not None and session.suggestion.box != first.box
    assert session.viewer.shown == ["uncertainty"]  # the same weights: not computed again
    assert [e.outcome for e in record["ended"]] == [Outcome.DONE, Outcome.DONE]


def test_predict_shows_the_region_in_view_first_then_the_rest_with_progress(session, record):
    """Stop after a run re-predicted the whole volume before anything showed (70 s on a
    real crop): the region on screen comes first, shown at once, then the rest."""
    from napari_finetune.session.events import Progress, RegionPredicted

    events = []
    session.events.job_event.connect(events.append)
    assert session.predict() is True
    assert record["ended"] == [ActionEnd(Busy.PREDICT, Outcome.DONE, "")]
    kinds = [type(e).__name__ for e in events]
    assert "RegionPredicted" in kinds, kinds
    first = kinds.index("RegionPredicted")
    seen = events[first]
    assert isinstance(seen, RegionPredicted)
    assert seen.region == (slice(0, 16), slice(0, 32), slice(0, 32))
    assert any(isinstance(e, Progress) for e in events[:first])  # the region's own blocks
    rest = [e for e in events[first + 1:] if isinstance(e, Progress)]
    assert rest and rest[-1].done == rest[-1].total and rest[-1].what == "predict"
    # The region written as a tile, then the whole volume shown once (the same arrays).
    names = [f"prediction-{c}" for c in CHANNELS]
    assert session.viewer.regions == [(name, seen.region) for name in names]
    assert session.viewer.shown == names
    assert session.prediction is not None and session.prediction.complete


def test_stop_ends_a_prediction_and_keeps_what_was_predicted(session, record):
    from napari_finetune.session.events import RegionPredicted

    def stop_once_the_view_is_there(event):
        if isinstance(event, RegionPredicted):
            session.stop()

    session.events.job_event.connect(stop_once_the_view_is_there)
    assert session.predict() is True
    assert record["ended"] == [ActionEnd(
        Busy.PREDICT, Outcome.STOPPED, "prediction stopped; the blocks predicted so far are kept")]
    prediction = session.prediction
    assert prediction is not None and not prediction.complete and session.busy is None
    region = (slice(0, 16), slice(0, 32), slice(0, 32))
    for mask in prediction.masks:  # the rest was never predicted: left 0
        outside = mask.copy()
        outside[region] = 0
        assert not outside.any()
    # Shown: the region as a tile, then the stopped prediction as it is.
    names = [f"prediction-{c}" for c in CHANNELS]
    assert session.viewer.regions == [(name, region) for name in names]
    assert session.viewer.shown == names
    session.events.job_event.disconnect(stop_once_the_view_is_there)
    assert session.predict() is True  # the next prediction starts afresh, not stopped
    assert record["ended"][-1] == ActionEnd(Busy.PREDICT, Outcome.DONE, "")
    assert session.prediction.complete


def test_predict_is_the_checkpoints_own_and_keeps_the_probability_of_role_channels(
        session, record):
    """The widget's Predict, headless: the masks ``predict_volume`` gives with the checkpoint,
    progress on the way, the probability kept of the channels with a role only, and the
    checkpoint's weights again once the last run's trainer is dropped."""
    from napari_finetune.config import PredictConfig
    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.objects import ChannelRole
    from napari_finetune.predict import predict_volume
    from napari_finetune.session.events import Progress

    events = []
    session.events.job_event.connect(events.append)
    session.roles = {"mitochondria": ChannelRole("object", threshold=0.5),
                     "membrane": ChannelRole(None)}
    assert session.predict() is True
    assert record["ended"] == [ActionEnd(Busy.PREDICT, Outcome.DONE, "")]
    assert any(isinstance(e, Progress) and e.done == e.total for e in events)
    ckpt = load_checkpoint(session.checkpoint)
    probs = predict_volume(ckpt.model, session.image,
                           intensity_range(session.image, ckpt.normalization),
                           PredictConfig(device="cpu"))
    for mask, channel in zip(session.prediction.masks, probs, strict=True):
        np.testing.assert_array_equal(mask, (channel > 0.5).astype(np.uint8))
    assert list(session.prediction.probabilities) == [CHANNELS.index("mitochondria")]
    np.testing.assert_allclose(session.prediction.probabilities[1], probs[1], atol=1e-6)

    first = [m.copy() for m in session.prediction.masks]
    assert session.finetune() is True and session.trainer.steps_done == 2
    session.trainer = None  # a new checkpoint was chosen: the run's weights no longer apply
    assert session.predict() is True
    for mask, before in zip(session.prediction.masks, first, strict=True):
        np.testing.assert_array_equal(mask, before)


def test_suggest_starts_over_with_another_checkpoint(session, record, tmp_path):
    """As the widget's Paint here next: other weights, a new uncertainty map, and the region
    suggested first for the old weights may be suggested again."""
    import shutil

    assert session.suggest((8, 20, 20)) is True
    first = session.suggestion.box
    assert session.suggest((8, 20, 20)) is True and session.suggestion.box != first
    session.checkpoint = shutil.copy(session.checkpoint, tmp_path / "same_weights.pt")
    assert session.suggest((8, 20, 20)) is True
    assert session.viewer.shown == ["uncertainty", "uncertainty"]  # computed anew
    assert session.suggestion.box == first  # the same weights: the same best region
    assert session.suggested == [first]
    assert [e.outcome for e in record["ended"]] == [Outcome.DONE] * 3


def test_without_a_viewer_the_previews_are_of_the_region_the_front_end_keeps(session, record):
    """The widget shows previews itself: its Session has no viewer port, only the region."""
    from napari_finetune.session.events import Preview

    session.viewer, session.preview_interval_s = None, 1e-6
    session.region = (slice(0, 8), slice(0, 16), slice(8, 24))
    previews: list[Preview] = []
    session.events.job_event.connect(
        lambda event: previews.append(event) if isinstance(event, Preview) else None)
    assert session.finetune() is True
    assert record["ended"][-1].outcome is Outcome.DONE
    assert previews and all(p.region == session.region for p in previews)
    assert previews[0].probs.shape == (len(CHANNELS), 8, 16, 16)


def test_a_copy_taken_by_the_caller_is_saved_under_its_number(session, record):
    """An autosaver's copy keeps its snapshot number: a newer save is never undone."""
    from napari_finetune.session.saving import next_snapshot, not_yet_written

    taken = next_snapshot()
    assert session.finetune(snapshot=taken) is True
    assert record["ended"][-1].outcome is Outcome.DONE
    assert not not_yet_written(session.store, taken)  # written under that number
    assert not_yet_written(session.store, taken + 1)


def test_a_preview_that_fails_is_one_line_and_the_run_goes_on(session, record, request):
    """A preview is a view of the run, not part of it: its failure (say, out of memory on
    the shown region) is reported and the training continues to its end."""
    from napari_finetune.session.events import Preview, PreviewFailed
    from napari_finetune.testing import build_hooks

    def failing_predict(region: object) -> None:
        raise MemoryError("no room for the preview\nsecond line")

    build_hooks.trainer.append(lambda trainer: setattr(trainer, "predict", failing_predict))
    request.addfinalizer(build_hooks.clear)
    events: list[object] = []
    session.events.job_event.connect(events.append)
    session.preview_interval_s = 1e-6
    assert session.finetune() is True
    assert record["ended"][-1].outcome is Outcome.DONE, record["ended"]
    assert session.trainer.steps_done == 2 and session.history[-1].kind == "finished"
    failed = [e for e in events if isinstance(e, PreviewFailed)]
    assert [f.line for f in failed] == ["MemoryError: no room for the preview"] * 2
    assert not [e for e in events if isinstance(e, Preview)]


def test_out_of_memory_halves_the_batch_drops_distillation_and_the_run_ends_done(
        session, record, request):
    """The widget's fine-tune on a GPU that runs out of memory, headless: the run steps down
    (batch halved with accumulation doubled, then distillation and the hold dropped), says
    so in its statuses, ends done, and its weights predict."""
    from dataclasses import replace

    from napari_finetune.testing import build_hooks, oom_above_batch, oom_in_teacher

    session.config = replace(tiny_config(), batch_size=2)
    build_hooks.model.append(lambda model: oom_above_batch(model, 1))
    build_hooks.trainer.append(oom_in_teacher)  # out of memory at any batch
    request.addfinalizer(build_hooks.clear)
    assert session.finetune() is True
    assert record["ended"] == [ActionEnd(Busy.TRAIN, Outcome.DONE, "finished 2 steps")]
    last = session.history[-1]
    assert last.kind == "finished" and last.step == 2
    assert (last.batch_size, last.accumulation, last.effective_batch) == (1, 2, 2)
    assert last.distillation == "dropped" and last.hold_other_channels == "dropped"
    assert last.distillation_weight == 0.0 and last.dropped_at_step is not None
    recoveries = [s for s in session.history if s.kind == "recovery"]
    assert len(recoveries) >= 2 and all(s.message for s in recoveries)
    assert session.predict() is True  # the stepped-down run's weights
    assert record["ended"][-1].outcome is Outcome.DONE


def test_a_run_takes_the_stores_voxel_size_and_its_export_records_it(checkpoint, tmp_path):
    from napari_finetune.io.omezarr import load_corrections, open_volume
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.session.runner import InlineRunner
    from napari_finetune.session.session import Session
    from test_cli import make_scaled_store

    store = make_scaled_store(tmp_path / "sstem.zarr", (16, 40, 40),
                              {"z": 40.0, "y": 8.0, "x": 8.0})
    session = Session(InlineRunner(), image=np.asarray(open_volume(store).data),
                      checkpoint=str(checkpoint), corrections=np.asarray(load_corrections(store)),
                      store=str(store), channel_names=["membrane", "mitochondria"],
                      config=tiny_config(steps=1))
    assert session.finetune() is True
    assert session.last_end.outcome is Outcome.DONE, session.last_end
    assert session.trainer.config.voxel_size == (40.0, 8.0, 8.0)
    assert session.config.voxel_size is None  # the session's own settings unchanged
    out = str(tmp_path / "tuned.pt")
    assert session.export(out) is True
    assert load_checkpoint(out).metadata["run"]["config"]["voxel_size"] == [40.0, 8.0, 8.0]


def test_the_slice_in_view_is_predicted_first_in_one_model_call(session, record):
    """After Stop the viewed slice showed after 20 s (the walk, 64 x 256 x 256): the region
    predicted first was the previews' one (the slice with 16 slices of context on each
    side), four blocks, most of a whole pass. The slice on screen (:attr:`Session.view`)
    comes first now, read with the model's context in one model call, before the pass
    over the volume."""
    from napari_finetune.session.events import Progress, RegionPredicted

    assert session.finetune() is True  # Predict after a run, as the widget's after Stop
    view = (slice(7, 8), slice(0, 40), slice(0, 40))
    session.view = view
    events = []
    session.events.job_event.connect(events.append)
    assert session.predict() is True
    kinds = [type(e).__name__ for e in events]
    first = kinds.index("RegionPredicted")
    seen = events[first]
    assert isinstance(seen, RegionPredicted) and seen.region == view
    before = [e for e in events[:first] if isinstance(e, Progress)]
    assert [(e.done, e.total) for e in before] == [(1, 1)], before  # one model call
    rest = [e for e in events[first + 1:] if isinstance(e, Progress)]
    assert rest and rest[-1].done == rest[-1].total  # the whole volume after it
    assert session.prediction is not None and session.prediction.complete


def test_stop_during_a_preview_ends_the_run_without_waiting_for_it(session, record, request):
    """The walk's Stop waited 8.5 s for the run to end: a preview of the region on screen
    (33 x 256 x 256, seconds on a loaded core) was being predicted between two steps.
    Stop now cuts the preview at its model's next layer; no preview is shown."""
    from napari_finetune.session.events import Preview, PreviewFailed
    from napari_finetune.testing import build_hooks

    def stop_as_the_preview_starts(trainer):
        predict = trainer.predict

        def stopped_then_predict(region):
            session.stop()
            return predict(region)

        trainer.predict = stopped_then_predict

    build_hooks.trainer.append(stop_as_the_preview_starts)
    request.addfinalizer(build_hooks.clear)
    events: list[object] = []
    session.events.job_event.connect(events.append)
    session.preview_interval_s = 1e-6
    assert session.finetune() is True
    assert record["ended"][-1].outcome is Outcome.STOPPED, record["ended"]
    assert session.trainer.steps_done == 1
    assert not [e for e in events if isinstance(e, Preview | PreviewFailed)], events
