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
