"""``torch.set_num_threads`` is process-wide: saves that begin or end mid-run must not move it.

The jobs are the widget's real generators (a corrections save, a fine-tuning
run on the tiny store), stepped by hand in the order the worker threads could
run them, so the interleaving is the same on every machine.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from tests._qt.conftest import CHANNELS, make_volume

from napari_finetune._qt import worker
from napari_finetune.config import FinetuneConfig
from napari_finetune.session import jobs, work
from napari_finetune.session.events import RunStatus, TrainerReady
from napari_finetune.session.saving import save_corrections_locked


def _save_job(store, labels):
    return work.guarded(_call_then_wait)(save_corrections_locked, str(store), labels, CHANNELS)


def _call_then_wait(fn, *args):
    """A save that has written and not ended yet (it ends on the next ``next()``)."""
    result = fn(*args)
    yield result


@pytest.mark.serial  # torch's process-wide thread count against every core
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to leave one free")
def test_saves_during_a_run_leave_training_its_threads(tiny_store, tiny_checkpoint):
    cores = os.cpu_count()
    torch.set_num_threads(cores)
    corrections = np.zeros((16, 64, 64), np.uint8)
    corrections[6:10, 20:28, 20:28] = 3
    corrections[6:10, 4:12, 36:44] = 1
    config = FinetuneConfig(steps=2, batch_size=1, mode="full", device="cpu",
                            patch_shape=(16, 32, 32))
    train = work.guarded(jobs.train_job)(str(tiny_checkpoint), make_volume(), corrections,
                                         None, CHANNELS, config, 0.0, lambda: None)

    early_save = _save_job(tiny_store, corrections)
    next(early_save)  # an autosave wrote; its job has not ended yet
    assert isinstance(next(train), TrainerReady)  # the run built its trainer
    assert torch.get_num_threads() == cores - 1
    for _ in early_save:  # the autosave job ends while the run goes on
        pass
    assert isinstance(next(train), RunStatus)
    assert torch.get_num_threads() == cores - 1, "the run was handed every core back"

    late_save = _save_job(tiny_store, corrections)
    next(late_save)  # an autosave begins during the run...
    kinds = [event.status.kind for event in train if isinstance(event, RunStatus)]
    assert kinds[-1] == "finished", kinds
    assert torch.get_num_threads() == cores  # the run gave its cores back
    for _ in late_save:  # ...and ends after it
        pass
    assert torch.get_num_threads() == cores, "a save left the process a core short for good"


def test_jobs_report_results_through_returned_and_failures_through_errored(qtbot):
    """napari's worker protocol: a torch-style RuntimeError is a failure, not a lost worker."""
    from napari_finetune.session.events import JobError, Progress

    def failing():
        yield Progress(1, 2, "test")
        raise RuntimeError("boom")

    def answering():
        yield Progress(1, 1, "test")
        return 42

    got: dict[str, list] = {"events": [], "errors": [], "results": []}
    workers = [worker.start_job(job, on_event=got["events"].append, on_error=got["errors"].append,
                              on_result=got["results"].append) for job in (failing, answering)]
    qtbot.waitUntil(lambda: len(got["errors"]) + len(got["results"]) == 2, timeout=20_000)
    assert [type(e) for e in got["errors"]] == [JobError] and "boom" in str(got["errors"][0])
    assert got["results"] == [42] and len(got["events"]) == 2
    assert all(worker.wait(5.0) for worker in workers)


@pytest.mark.serial  # torch's process-wide thread count against every core
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to leave one free")
def test_overlapping_computing_jobs_share_one_setting(tiny_checkpoint):
    """A prediction that begins during a run and ends after it: while either computes,
    torch keeps a core free; when both have ended, the process has every core back."""
    cores = os.cpu_count()
    torch.set_num_threads(cores)
    corrections = np.zeros((16, 64, 64), np.uint8)
    corrections[6:10, 20:28, 20:28] = 3
    config = FinetuneConfig(steps=2, batch_size=1, mode="full", device="cpu",
                            patch_shape=(16, 32, 32))
    train = work.guarded(jobs.train_job)(str(tiny_checkpoint), make_volume(), corrections,
                                         None, CHANNELS, config, 0.0, lambda: None)
    assert isinstance(next(train), TrainerReady)
    predict = work.guarded(jobs.predict_job)(str(tiny_checkpoint), make_volume(), 2, "cpu")
    next(predict)  # the prediction computes...
    for _ in train:  # ...while the run ends
        pass
    assert torch.get_num_threads() == cores - 1, "the run's end handed the prediction every core"
    for _ in predict:
        pass
    assert torch.get_num_threads() == cores, "a job left the process a core short for good"
