"""``torch.set_num_threads`` is process-wide: jobs that begin or end mid-run must not move it.

The jobs are the Session's real generators (a corrections save, a fine-tuning
run, a prediction on the tiny store), stepped by hand in the order worker
threads could run them, so the interleaving is the same on every machine.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from tests.session.conftest import CHANNELS, tiny_config

from napari_finetune.session import jobs, work
from napari_finetune.session.events import RunStatus, TrainerReady
from napari_finetune.session.saving import save_corrections_locked

pytestmark = [
    pytest.mark.serial,  # torch's process-wide thread count against every core
    pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to leave one free"),
]


def _save_job(store, labels):
    return work.guarded(_call_then_wait)(save_corrections_locked, str(store), labels, CHANNELS)


def _call_then_wait(fn, *args):
    """A save that has written and not ended yet (it ends on the next ``next()``)."""
    result = fn(*args)
    yield result


@pytest.fixture
def image(store) -> np.ndarray:
    from napari_finetune.io.omezarr import open_volume

    return np.asarray(open_volume(store).data)


@pytest.fixture
def corrections(image) -> np.ndarray:
    painted = np.zeros(image.shape, np.uint8)
    painted[6:10, 20:28, 20:28] = 3
    painted[6:10, 4:12, 28:36] = 1
    return painted


def test_saves_during_a_run_leave_training_its_threads(store, checkpoint, image, corrections):
    cores = os.cpu_count()
    torch.set_num_threads(cores)
    train = work.guarded(jobs.train_job)(str(checkpoint), image, corrections, None, CHANNELS,
                                         tiny_config(), 0.0, lambda: None)

    early_save = _save_job(store, corrections)
    next(early_save)  # an autosave wrote; its job has not ended yet
    assert isinstance(next(train), TrainerReady)  # the run built its trainer
    assert torch.get_num_threads() == cores - 1
    for _ in early_save:  # the autosave job ends while the run goes on
        pass
    assert isinstance(next(train), RunStatus)
    assert torch.get_num_threads() == cores - 1, "the run was handed every core back"

    late_save = _save_job(store, corrections)
    next(late_save)  # an autosave begins during the run...
    kinds = [event.status.kind for event in train if isinstance(event, RunStatus)]
    assert kinds[-1] == "finished", kinds
    assert torch.get_num_threads() == cores  # the run gave its cores back
    for _ in late_save:  # ...and ends after it
        pass
    assert torch.get_num_threads() == cores, "a save left the process a core short for good"


def test_overlapping_computing_jobs_share_one_setting(checkpoint, image, corrections):
    """A prediction that begins during a run and ends after it: while either computes,
    torch keeps a core free; when both have ended, the process has every core back."""
    cores = os.cpu_count()
    torch.set_num_threads(cores)
    train = work.guarded(jobs.train_job)(str(checkpoint), image, corrections, None, CHANNELS,
                                         tiny_config(), 0.0, lambda: None)
    assert isinstance(next(train), TrainerReady)
    predict = work.guarded(jobs.predict_job)(str(checkpoint), image, 2, "cpu")
    next(predict)  # the prediction computes...
    for _ in train:  # ...while the run ends
        pass
    assert torch.get_num_threads() == cores - 1, "the run's end handed the prediction every core"
    for _ in predict:
        pass
    assert torch.get_num_threads() == cores, "a job left the process a core short for good"
