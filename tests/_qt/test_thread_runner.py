"""A Session run by napari's thread worker: the job off the main thread, every callback on it."""

from __future__ import annotations

import threading

import numpy as np
from tests._qt.conftest import CHANNELS, make_volume

from napari_finetune._qt.runner import ThreadRunner
from napari_finetune.config import FinetuneConfig
from napari_finetune.session.session import Busy, Outcome, Session


def test_a_session_on_threads_refuses_while_it_predicts_then_stops_a_run(qtbot, tiny_checkpoint):
    runner = ThreadRunner()
    corrections = np.zeros((16, 64, 64), np.uint8)
    corrections[6:10, 20:28, 20:28] = 3
    corrections[6:10, 4:12, 36:44] = 1
    session = Session(runner, image=make_volume(), checkpoint=str(tiny_checkpoint),
                      corrections=corrections, channel_names=list(CHANNELS),
                      config=FinetuneConfig(steps=50, batch_size=1, mode="full", device="cpu",
                                            patch_shape=(16, 32, 32)))
    ended, refused, threads = [], [], set()
    session.events.ended.connect(ended.append)
    session.events.refused.connect(refused.append)
    session.events.job_event.connect(lambda _: threads.add(threading.get_ident()))

    assert session.predict() is True  # returns at once: the job runs in a worker
    assert session.busy is Busy.PREDICT and runner.workers
    assert session.finetune() is False  # asked while the prediction runs
    assert refused == ["Cannot fine-tune: busy with predict; wait for it to end."]
    qtbot.waitUntil(lambda: len(ended) == 1, timeout=60_000)
    assert ended[0].outcome is Outcome.DONE and session.prediction is not None
    assert threads == {threading.get_ident()}  # events came on the main thread

    def stop_at_step_one(status):
        if status.kind == "step":
            session.stop()

    session.events.status.connect(stop_at_step_one)
    assert session.finetune() is True
    qtbot.waitUntil(lambda: len(ended) == 2, timeout=120_000)
    assert ended[1].outcome is Outcome.STOPPED, ended[1]
    assert 1 <= session.trainer.steps_done < 50 and session.history[-1].kind == "stopped"
    assert session.busy is None
    qtbot.waitUntil(lambda: not runner.workers, timeout=20_000)
