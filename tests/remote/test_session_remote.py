"""The Session's fine-tune on a dask worker, headless: a real LocalCluster, the inline runner."""

from __future__ import annotations

import numpy as np
import pytest

from napari_finetune.config import FinetuneConfig
from napari_finetune.session.events import Preview
from napari_finetune.session.runner import InlineRunner
from napari_finetune.session.session import Busy, Outcome, Session

pytestmark = pytest.mark.resource  # the tests' LocalCluster

CHANNELS = ["membrane", "mitochondria"]


@pytest.fixture
def remote_session(painted_store, checkpoint, client) -> Session:
    from napari_finetune.io.omezarr import load_corrections, open_volume

    return Session(
        InlineRunner(), image=np.asarray(open_volume(painted_store).data),
        checkpoint=str(checkpoint), corrections=np.asarray(load_corrections(painted_store)),
        store=str(painted_store), channel_names=list(CHANNELS),
        config=FinetuneConfig(steps=6, batch_size=1, mode="full", device="cpu",
                              patch_shape=(16, 32, 32)),
        scheduler=str(client.scheduler.address), preview_interval_s=1e-6,
        region=(slice(0, 8), slice(0, 16), slice(8, 24)),
    )


def test_a_session_run_on_a_scheduler_trains_there_and_its_weights_come_back(remote_session):
    session, events = remote_session, []
    session.events.job_event.connect(events.append)
    ended = []
    session.events.ended.connect(ended.append)
    assert session.finetune() is True
    assert [(e.action, e.outcome) for e in ended] == [(Busy.TRAIN, Outcome.DONE)], ended
    assert [s.kind for s in session.history][-1] == "finished"
    assert "to the dask scheduler at" in session.history[0].message
    trainer = session.trainer
    assert trainer.worker is not None and trainer.run_record["steps_done"] == 6
    previews = [e for e in events if isinstance(e, Preview)]
    assert previews and all(p.region == session.region for p in previews)
    assert previews[-1].probs.shape == (len(CHANNELS), 8, 16, 16)
    # Computed on the worker (with the weights of a step it had done), which opened the
    # session's store itself: no tiles went over the wire.
    assert trainer.preview_step is not None and 1 <= trainer.preview_step <= 6
    assert trainer.store_used is True
    from napari_finetune.remote.finetuner import kept_path

    assert not kept_path(session.store).exists()  # it finished: nothing kept beside the store


def test_a_run_cut_short_keeps_its_weights_which_the_next_session_offers_and_uses(
        remote_session):
    """Stop after the first step: the weights are kept beside the store, stamped with it;
    a new Session opening the store offers them (one line) and loads them as its model."""
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.remote.kept import KEPT_KEY, kept_path, store_name

    session = remote_session
    session.config = FinetuneConfig(steps=50, batch_size=1, mode="full", device="cpu",
                                    patch_shape=(16, 32, 32))
    session.preview_interval_s = 0.0
    placements: list[str] = []
    session.events.placement.connect(placements.append)
    session.events.status.connect(lambda st: session.stop() if st.kind == "step" else None)
    ended = []
    session.events.ended.connect(ended.append)
    assert session.finetune() is True
    assert ended[-1].outcome is Outcome.STOPPED
    trainer = session.trainer
    # Where it trained, as its own event: the panel's line (the worker, host, device).
    assert placements == [trainer.placement] == [session.placement]
    assert trainer.placement.startswith(f"the dask worker {trainer.worker} (host ")
    path = kept_path(session.store)
    stamp = load_checkpoint(path).metadata[KEPT_KEY]
    assert stamp["store"] == store_name(session.store) and stamp["run_id"] == trainer.run_id

    again = Session(InlineRunner())
    again.open_store(session.store)
    kept = again.kept
    assert kept is not None and kept.usable and kept.steps_done == trainer.steps_done >= 1
    assert kept.total_steps == 50 and kept.worker == trainer.worker
    assert f"step {trainer.steps_done} of 50" in kept.line
    used = again.use_kept_weights()
    assert used is not None and again.info is not None and again.info.path == used
    loaded = load_checkpoint(used).model.state_dict()
    for name, value in trainer.model.state_dict().items():
        assert (loaded[name] == value).all(), name
