"""The Finetuner with and without prefetch: same samples, same weights, no thread left."""

import threading

import pytest
import torch
from engine_setup import make_trainer

from napari_finetune import testing as faults


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "napari-finetune-prefetch"]


def _weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_same_seed_same_weights_with_and_without_prefetch():
    runs = []
    for depth in (0, 2):
        trainer = make_trainer(steps=4, batch_size=4, prefetch_steps=depth)
        list(trainer.run())
        runs.append(_weights(trainer))
        assert trainer.feed.steps == 4
    for name, value in runs[0].items():
        assert torch.equal(value, runs[1][name]), name
    assert not _prefetch_threads()


def test_oom_redo_gives_the_same_weights_with_and_without_prefetch():
    runs = []
    for depth in (0, 2):
        trainer = make_trainer(steps=3, batch_size=4, prefetch_steps=depth)
        trainer.build()
        faults.oom_above_batch(trainer.model, max_batch=2, times=2)
        statuses = list(trainer.run())
        assert any(s.kind == "recovery" for s in statuses)
        assert trainer.steps_done == 3
        runs.append(_weights(trainer))
    for name, value in runs[0].items():
        assert torch.equal(value, runs[1][name]), name
    assert not _prefetch_threads()


def test_no_thread_after_a_finished_run():
    trainer = make_trainer(steps=2, prefetch_steps=2)
    statuses = list(trainer.run())
    assert statuses[-1].kind == "finished"
    assert not _prefetch_threads()


def test_stop_ends_at_the_next_step_and_leaves_no_thread():
    trainer = make_trainer(steps=50, prefetch_steps=2)
    kinds = []
    for status in trainer.run():
        kinds.append(status.kind)
        if status.kind == "step":
            trainer.stop()
            # The thread is still there while the run goes on ...
    assert kinds[-1] == "stopped" and trainer.steps_done == 1
    assert not _prefetch_threads()


def test_no_thread_after_a_failed_run():
    trainer = make_trainer(steps=5, batch_size=1, prefetch_steps=2, distillation=0.0,
                           hold_other_channels=False)
    trainer.build()
    seen = []
    original = trainer.optimizer.step

    def step_then_die(*args, **kwargs):
        seen.append(len(_prefetch_threads()))
        return original(*args, **kwargs)

    trainer.optimizer.step = step_then_die
    fault = None
    with pytest.raises(Exception, match="nothing left"):
        for status in trainer.run():
            if status.kind == "step" and fault is None:
                fault = faults.always_oom(trainer.model)
    assert seen and seen[0] == 1  # the producer ran during the run
    assert not _prefetch_threads()


def test_no_thread_when_the_consumer_abandons_the_run():
    trainer = make_trainer(steps=50, prefetch_steps=2)
    run = trainer.run()
    for status in run:
        if status.kind == "step":
            break
    run.close()
    assert not _prefetch_threads()
