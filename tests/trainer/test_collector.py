"""A run hides the objects that existed before it from the garbage collector, and only then."""

from __future__ import annotations

import gc
import weakref

import pytest
from engine_setup import make_trainer

from napari_finetune import testing
from napari_finetune.trainer import collector


@pytest.fixture
def unfrozen():
    """The process as a user's is: nothing frozen (the suite's conftest froze its imports)."""
    before = gc.get_freeze_count()
    gc.unfreeze()
    yield
    gc.unfreeze()
    if before:
        gc.freeze()


class Node:
    """A reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_a_run_freezes_what_came_before_it_and_gives_it_back(unfrozen):
    cycle = Node()
    gone = weakref.ref(cycle)
    trainer = make_trainer(steps=2)
    run = trainer.run()
    first = next(run)
    assert gc.get_freeze_count() > 0, first.message
    del cycle
    gc.collect()
    assert gone() is not None  # hidden while the run lasts: its collections are cheap
    assert [e.kind for e in run][-1] == "finished"
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None  # handed back: collected as before the run


def test_the_failed_attempts_tensors_are_freed_while_the_freeze_holds(unfrozen):
    trainer = make_trainer(steps=1, batch_size=4, distillation=0.0, hold_other_channels=False)
    trainer.build()
    refs = []
    trainer.model.encoders[0].register_forward_hook(
        lambda module, args, output: refs.append(weakref.ref(output)))
    run = trainer.run()
    assert next(run).kind == "probe"
    assert gc.get_freeze_count() > 0
    refs.clear()
    testing.oom_in_backward_above_batch(trainer.model.head, 2, times=1)
    assert next(run).kind == "recovery"
    assert refs and all(r() is None for r in refs), "the failed attempt's tensors are alive"
    assert [e.kind for e in run] == ["step", "finished"]
    assert gc.get_freeze_count() == 0


def test_a_run_stopped_midway_gives_the_objects_back(unfrozen):
    run = make_trainer(steps=50).run()
    next(run)
    assert gc.get_freeze_count() > 0
    run.close()  # a napari worker that quit, an abandoned generator
    assert gc.get_freeze_count() == 0


def test_a_freeze_made_before_the_run_is_left_as_it_was(unfrozen):
    gc.freeze()  # a host that froze its own start-up objects
    cycle = Node()  # garbage made after the host's freeze, before the run
    gone = weakref.ref(cycle)
    del cycle
    trainer = make_trainer(steps=1)
    assert [e.kind for e in trainer.run()][-1] == "finished"
    assert gc.get_freeze_count() > 0  # the host's freeze still holds
    gc.collect()
    assert gone() is None  # and the run froze nothing of its own


def test_overlapping_holders_unfreeze_once_the_last_ends(unfrozen):
    first = collector.hide_existing_objects()
    second = collector.hide_existing_objects()
    assert first and second
    collector.show_again(first)
    assert gc.get_freeze_count() > 0  # the second still holds it
    collector.show_again(second)
    assert gc.get_freeze_count() == 0
