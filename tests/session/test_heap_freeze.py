"""A dock's heap freeze hides old objects from the collector, and gives them back."""

from __future__ import annotations

import gc
import weakref

import pytest

from napari_finetune.session import heap

pytestmark = pytest.mark.usefixtures("unfrozen")  # nothing frozen during a test


class _Layer:
    """Stands for a napari layer: an array in a reference cycle only the collector frees."""

    def __init__(self) -> None:
        self.data = bytearray(1024)
        self.me = self


def _old_cycle_garbage(hold: heap.HeapHold) -> weakref.ref:
    """A cycle made before ``hold`` froze the heap, then dropped: a weakref to it."""
    layer = _Layer()
    ref = weakref.ref(layer)
    hold.freeze()
    del layer
    gc.collect()
    return ref


def test_a_freeze_hides_old_objects_from_collections():
    hold = heap.HeapHold()
    try:
        assert gc.get_freeze_count() == 0
        ref = _old_cycle_garbage(hold)
        assert gc.get_freeze_count() > 0
        assert ref() is not None  # what the unfreeze below is for
    finally:
        hold.release()


def test_a_removed_layer_is_freed():
    hold = heap.HeapHold()
    try:
        ref = _old_cycle_garbage(hold)
        hold.layer_removed(object())  # napari's removed event
        gc.collect()
        assert ref() is None
        assert gc.get_freeze_count() == 0
    finally:
        hold.release()


def test_the_close_gives_everything_back_and_freezes_no_more():
    before = heap.holders()
    hold = heap.HeapHold()
    assert heap.holders() == before + 1
    ref = _old_cycle_garbage(hold)
    hold.release()
    gc.collect()
    assert ref() is None
    assert heap.holders() == before and not hold.held
    assert not hold.freeze()  # a closed dock freezes nothing
    assert gc.get_freeze_count() == 0
    hold.release()  # twice: counted once
    assert heap.holders() == before


def _full_collections_during(work) -> int:
    """How many automatic full collections ran while ``work()`` ran (gc.callbacks)."""
    seen = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info.get("generation") == 2:
            seen.append(1)

    gc.callbacks.append(count)
    try:
        work()
    finally:
        gc.callbacks.remove(count)
    return len(seen)


def _allocate_long_lived() -> list[list[int]]:
    """Many tracked objects that survive young collections, as an import's modules do."""
    return [[i] for i in range(400_000)]


def test_no_automatic_full_collection_while_imports_run():
    assert _full_collections_during(_allocate_long_lived) > 0  # what the quiet is for
    threshold = gc.get_threshold()
    with heap.no_full_collections(), heap.no_full_collections():  # nested: one quiet
        assert _full_collections_during(_allocate_long_lived) == 0
    assert gc.get_threshold() == threshold  # given back, once
    assert _full_collections_during(_allocate_long_lived) > 0


def test_the_quiet_ends_when_the_imports_fail():
    threshold = gc.get_threshold()
    with pytest.raises(ImportError), heap.no_full_collections():
        raise ImportError("no such engine")
    assert gc.get_threshold() == threshold
