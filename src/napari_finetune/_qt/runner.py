"""The :class:`~napari_finetune.session.runner.JobRunner` of napari: a thread worker per job.

Each job runs in napari's generator worker (:func:`~napari_finetune._qt.worker.start_job`,
guarded the same way as the widget's own jobs); its events, result and failure
arrive on the main thread through the worker's signals, so a Session given
this runner is only ever changed there. Stop is the worker's ``quit()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from napari_finetune._qt.worker import start_job
from napari_finetune.session.runner import JobCallbacks
from napari_finetune.session.work import Job

if TYPE_CHECKING:
    from napari_finetune._qt.shutdown import JobWorker

R = TypeVar("R")


def _given(job: Job[R]) -> Job[R]:
    """The generator ``job`` as a job function (napari's worker wants one to call)."""
    return (yield from job)


class ThreadHandle:
    """A job in napari's thread worker; the worker is kept for a closing widget to wait on."""

    def __init__(self, worker: JobWorker) -> None:
        self.worker = worker

    def stop(self) -> None:
        """End the job at its next event (napari's ``quit()``)."""
        self.worker.quit()


class ThreadRunner:
    """Runs each job in a napari thread worker; every callback comes on the main thread."""

    def __init__(self) -> None:
        self.workers: list[JobWorker] = []  # not finished yet (a closing widget ends them)

    def start(self, job: Job[R], callbacks: JobCallbacks[R]) -> ThreadHandle:
        """Start ``job`` in a worker thread and return at once."""
        aborted: list[bool] = []

        def finished() -> None:
            if worker in self.workers:
                self.workers.remove(worker)
            callbacks.on_finished(bool(aborted))

        worker = start_job(_given, job, on_event=callbacks.on_event,
                           on_result=callbacks.on_result, on_error=callbacks.on_error,
                           on_aborted=lambda: aborted.append(True), on_finished=finished)
        self.workers.append(worker)
        handle = ThreadHandle(worker)
        callbacks.on_started(handle)  # before any event: those wait for the main thread
        return handle
