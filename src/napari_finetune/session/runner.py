"""Who runs a job: the :class:`JobRunner` protocol a :class:`Session` is given, and the inline one.

A job is a generator of events that returns its result
(:mod:`napari_finetune.session.work`). A runner starts it, hands each event,
the result or the failure to the :class:`JobCallbacks`, and says last that it
ended (``on_finished(stopped)``); :meth:`JobHandle.stop` ends it at its next
event. The Session never knows whether the job runs in this thread
(:class:`InlineRunner`: tests, the command line), in napari's thread worker
(``napari_finetune._qt.runner.ThreadRunner``) or elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from napari_finetune.session.events import Event
from napari_finetune.session.work import Job, guarded

R = TypeVar("R")


def _ignore(*_: object) -> None:
    """The default callback: nothing to do."""


@dataclass
class JobCallbacks(Generic[R]):
    """What a runner calls: each event, the result, a failure, then the end (always last).

    Attributes
    ----------
    on_started : callable
        The job's handle, before its first event (so a callback can stop it).
    on_event : callable
        Each event the job yields, in order.
    on_result : callable
        The job's return value, when it ran to its end.
    on_error : callable
        The exception that ended the job (a ``RuntimeError`` arrives as
        :class:`~napari_finetune.session.events.JobError`).
    on_finished : callable
        Last, however the job ended; ``stopped`` is True when :meth:`JobHandle.stop`
        ended it before its end.
    """

    on_started: Callable[[JobHandle], None] = _ignore
    on_event: Callable[[Event], None] = _ignore
    on_result: Callable[[R], None] = _ignore
    on_error: Callable[[Exception], None] = _ignore
    on_finished: Callable[[bool], None] = _ignore


class JobHandle(Protocol):
    """A started job."""

    def stop(self) -> None:
        """End the job at its next event (its ``finally`` blocks run)."""


class JobRunner(Protocol):
    """Starts jobs; a :class:`~napari_finetune.session.session.Session` is given one."""

    def start(self, job: Job[R], callbacks: JobCallbacks[R]) -> JobHandle:
        """Run ``job`` (a generator not started yet), reporting to ``callbacks``."""


class InlineHandle:
    """The handle of a job the :class:`InlineRunner` runs: a stop flag read at each event."""

    def __init__(self) -> None:
        self.stop_asked = False

    def stop(self) -> None:
        """End the job at its next event (asked from one of its own callbacks)."""
        self.stop_asked = True


class InlineRunner:
    """Runs a job to its end in the calling thread: ``start`` returns when it has ended.

    For tests and the command line. A stop can only come from the job's own
    callbacks (nothing else runs meanwhile); the job is closed at its next
    event, as napari's worker does after ``quit()``.
    """

    def start(self, job: Job[R], callbacks: JobCallbacks[R]) -> InlineHandle:
        """Run ``job`` here; every callback has been called when this returns."""
        handle = InlineHandle()
        run = guarded(lambda: job)()
        stopped = False
        callbacks.on_started(handle)
        try:
            while True:
                if handle.stop_asked:
                    run.close()
                    stopped = True
                    break
                try:
                    event = next(run)
                except StopIteration as end:
                    callbacks.on_result(end.value)
                    break
                callbacks.on_event(event)
        except Exception as exc:  # the job's failure goes to the callback, as a worker's does
            callbacks.on_error(exc)
        finally:
            callbacks.on_finished(stopped)
        return handle
