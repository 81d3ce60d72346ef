"""Keep napari's long-lived heap out of the garbage collector's full collections.

With napari, the sample, the dock and torch imported, the interpreter tracks
~560 000 objects. A full (generation 2) collection walks all of them with the
GIL held: 300-340 ms on a quiet machine, over a second at load 11, in whichever
thread happens to allocate. The warm-up's imports (torch, PEFT, filelock)
allocate enough to set them off, and they were the remaining Predict and
Fine-tune gaps of the UI walk (issue 55). :func:`gc.freeze` moves every object
alive now into a generation that no collection walks: a collection then walks
only what was made since (0 ms measured).

The heap is hidden at three moments: when the dock starts its jobs (before the
warm-up's imports, so the collections those set off walk only young objects),
when a warm-up has imported the engine (torch's and PEFT's modules then stay out
of the walks too; ``FinetunePanel``), and when a run starts with no older
trainer kept (:func:`freeze_for_run`, the Session: what the run makes is young).
A warm-up may end during a run and freeze the run's trainer with it; so
:func:`give_back` unfreezes before the Session drops a trainer, and the
collection that follows can free it and its device memory.

The price, and why it is given back: a frozen object is never freed by the
collector, even once it is cyclic garbage. napari's layers sit in reference
cycles, so a layer frozen and removed later would keep its array for good.
:meth:`HeapHold.layer_removed` (the viewer's ``layers.events.removed``) and
:meth:`HeapHold.release` (the widget's close) unfreeze everything: the removed
layer and the closed widget are then freed by the next full collection, as
without the freeze; the next freeze point hides the heap again. Objects made
before a freeze that become cyclic garbage otherwise (a prediction's model, the
checkpoint's reading) wait for the next unfreeze.

A freeze made by someone else (a host, the test suite) is undone by the same
unfreeze: :func:`gc.unfreeze` cannot undo only a part. Nothing here imports Qt.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0  # open docks that want the heap hidden
# An unfreeze that let garbage be seen (a removed layer, a dropped trainer) until a full
# collection has walked it: a freeze before that collection would hide the garbage again
# and it would never be freed (until the next unfreeze), so the freeze points wait.
_garbage_unseen = False


def _full_collection_done(phase: str, info: dict[str, int]) -> None:
    """``gc.callbacks`` hook: a generation-2 collection ended, the unfrozen garbage is gone."""
    global _garbage_unseen
    if phase == "stop" and info.get("generation") == 2:
        _garbage_unseen = False


gc.callbacks.append(_full_collection_done)


def _unfreeze_garbage() -> None:
    """Unfreeze because something frozen became garbage: no freeze until it is collected."""
    global _garbage_unseen
    _garbage_unseen = True
    gc.unfreeze()


def may_freeze() -> bool:
    """Whether a freeze now hides no garbage an unfreeze was meant to free."""
    return not _garbage_unseen


def holders() -> int:
    """How many open docks hold the heap hidden now."""
    return _holders


class HeapHold:
    """One dock's wish that the long-lived heap stay out of full collections.

    Created when the dock is built; :meth:`freeze` at the freeze points,
    :meth:`layer_removed` when a layer leaves the viewer, :meth:`release` once
    when the dock closes (a second call does nothing).
    """

    def __init__(self) -> None:
        global _holders
        with _lock:
            _holders += 1
        self._held = True

    @property
    def held(self) -> bool:
        """Whether the dock is still open (not :meth:`release`-d)."""
        return self._held

    def freeze(self) -> bool:
        """Hide every object alive now from full collections; whether it did.

        Nothing after :meth:`release`: a closed dock's objects must stay
        collectable.
        """
        if not self._held or not may_freeze():
            return False
        # O(1): CPython splices the generations' lists into the permanent one.
        gc.freeze()
        return True

    def layer_removed(self, *_: object) -> None:
        """Let the collector see the whole heap again, so the removed layer is freed.

        Connected to ``viewer.layers.events.removed`` (its event is ignored): the
        layer and its array sit in reference cycles that only the collector frees.
        """
        _unfreeze_garbage()

    def release(self) -> None:
        """The dock closed: unfreeze, so its session, its layers and the viewer can go."""
        global _holders
        if not self._held:
            return
        self._held = False
        with _lock:
            _holders -= 1
        gc.unfreeze()


def freeze_for_run() -> bool:
    """A run starts: hide what lives now while a dock is open; whether it froze.

    Only with a dock (:func:`holders`): a Session without one leaves the collector
    to the run's own freeze (``trainer/collector.py``), which stands aside when the
    process is frozen already.
    """
    if _holders == 0 or not may_freeze():
        return False
    gc.freeze()
    return True


def give_back() -> None:
    """Unfreeze before a trainer is dropped, while a dock is open (else nothing here froze).

    A trainer frozen with the heap (a warm-up ending during its run) would otherwise
    never be freed by the collection meant to give its memory back.
    """
    if _holders:
        _unfreeze_garbage()


# While an import runs: larger than any count of young collections an import makes.
_QUIET_THRESHOLD = 1 << 30
_quiet = 0  # how many no_full_collections() are open now
_threshold2 = 10  # the collector's own third threshold, put back when the last ends


@contextmanager
def no_full_collections() -> Iterator[None]:
    """No automatic full collection while the block runs (an engine's imports); nestable.

    An import makes tens of thousands of long-lived objects (torch: ~300 000) that
    no freeze has hidden yet: every ten young collections a full one walked the
    half-imported heap again, 90-184 ms each with the GIL held, five of them
    while a warm-up imported torch as the dock showed (the UI walk, issue 55).
    Young collections still run, and so does an explicit ``gc.collect()``; the
    freeze that follows the warm-up (``FinetunePanel``) hides what it imported.
    """
    global _quiet, _threshold2
    with _lock:
        if _quiet == 0:
            first, second, _threshold2 = gc.get_threshold()
            gc.set_threshold(first, second, _QUIET_THRESHOLD)
        _quiet += 1
    try:
        yield
    finally:
        with _lock:
            _quiet -= 1
            if _quiet == 0:
                first, second, _ = gc.get_threshold()
                gc.set_threshold(first, second, _threshold2)
