"""A run with a dock open starts with the heap frozen; a dropped trainer is still freed.

The Session on the tiny store, run inline, a :class:`HeapHold` standing for the dock.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from napari_finetune.session import heap
from napari_finetune.session.session import Session


@pytest.fixture
def dock(unfrozen):
    """A dock's hold, nothing frozen before; the suite's own freeze put back after."""
    hold = heap.HeapHold()
    yield hold
    hold.release()


def test_a_run_freezes_at_its_start_and_a_released_trainer_is_freed(session: Session, dock):
    dock.freeze()  # the dock's jobs started; the run's own freeze then stands aside
    young = ["made after the dock's freeze"]  # the warm-up's imports stand for it
    frozen_in_run: list[bool] = []  # at each status: young hidden from the collector?
    session.events.status.connect(lambda _: frozen_in_run.append(
        not any(o is young for o in gc.get_objects())))  # frozen objects are not listed
    assert session.trainer is None and not frozen_in_run
    assert session.finetune() is True
    assert frozen_in_run and all(frozen_in_run)  # frozen from the run's start on
    trainer = session.trainer
    assert trainer is not None
    trainer.cycle = trainer  # as a failed step's traceback can tie it: only a collection frees it
    ref = weakref.ref(trainer)
    del trainer
    dock.freeze()  # a warm-up ending during the run freezes the trainer with the heap
    session.release_trainer()
    gc.collect()
    assert ref() is None


def test_no_dock_no_freeze(session: Session):
    before = gc.get_freeze_count()
    gc.unfreeze()
    try:
        assert heap.holders() == 0
        assert not heap.freeze_for_run()
        assert gc.get_freeze_count() == 0
    finally:
        if before:
            gc.freeze()


def test_a_freeze_waits_until_the_unfrozen_garbage_is_collected(dock):
    """A trainer given back (or a layer removed) and then, before any full collection,
    a freeze point (the next run's start, a warm-up's end): the garbage must not be
    hidden again, or it would never be freed while the dock stays open."""

    class Kept:  # stands for a dropped trainer or a removed layer: a reference cycle
        pass

    for unfreeze in (heap.give_back, dock.layer_removed):
        garbage = Kept()
        garbage.cycle = garbage
        ref = weakref.ref(garbage)
        assert dock.freeze()
        del garbage
        unfreeze()  # what the Session / the viewer's removed event call
        assert not heap.freeze_for_run() and not dock.freeze()  # they wait ...
        assert gc.get_freeze_count() == 0
        gc.collect()  # ... for the next full collection, which frees it
        assert ref() is None
        assert heap.may_freeze() and heap.freeze_for_run()  # and freeze again after it
        gc.unfreeze()
