"""Thread-worker glue: how the widget runs a job off the main thread.

A job (:mod:`napari_finetune.session.jobs`) is a generator run by napari's
generator worker: it yields typed events (:mod:`napari_finetune.session.events`)
that arrive on the main thread through ``yielded``, returns its result
through ``returned`` and fails through ``errored`` (napari marks the task
failed; the widget shows the engine's own message once and is back to a
usable state). ``worker.quit()`` ends a job at its next yield. What a job is
and how it is guarded live in :mod:`napari_finetune.session.work` (no Qt).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from napari_finetune.session.events import Event
from napari_finetune.session.work import Job, guarded

if TYPE_CHECKING:
    from napari_finetune._qt.shutdown import JobWorker

R = TypeVar("R")


# ``job``'s own arguments are ``object``, passed through unchecked: a ParamSpec
# (``Callable[P, Job[R]]`` with ``*args: P.args, **kwargs: P.kwargs``) would check them, but
# PEP 612 allows no keyword-only parameters (the callbacks here) between those two.
def start_job(
    job: Callable[..., Job[R]], *args: object, on_error: Callable[[Exception], None],
    on_event: Callable[[Event], None] | None = None,
    on_result: Callable[[R], None] | None = None,
    on_finished: Callable[[], None] | None = None,
    on_aborted: Callable[[], None] | None = None, **kwargs: object,
) -> JobWorker[R]:
    """Run ``job(*args, **kwargs)`` in a napari generator worker and start it.

    Events go to ``on_event``, the job's return value to ``on_result``, a
    failure to ``on_error`` (napari's task status shows it failed),
    ``quit()`` taking effect to ``on_aborted``; ``on_finished`` comes last
    whichever way it ended. Returns the
    :class:`~napari_finetune._qt.shutdown.JobWorker`, which a closing widget
    can wait for.
    """
    from napari.qt.threading import create_worker

    from napari_finetune._qt.shutdown import JobWorker

    worker = create_worker(guarded(job), *args, _start_thread=False, _worker_class=JobWorker,
                           _connect={"errored": on_error}, **kwargs)
    for signal, slot in ((worker.yielded, on_event), (worker.returned, on_result),
                         (worker.aborted, on_aborted), (worker.finished, on_finished)):
        if slot is not None:
            signal.connect(slot)
    worker.start()
    return worker

