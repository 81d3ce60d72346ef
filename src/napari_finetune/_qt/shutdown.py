"""Ending the widget's work cleanly: the dock is removed, the viewer closes, the app quits.

What "clean" means here:

- the painting is on disk: a save the autosave timer still had pending is
  written synchronously (the timer's delay would otherwise outlive the process);
- a running fine-tuning ends at its next step and the process waits for it, a
  bounded time, so no worker thread is still writing the store or emitting
  signals while Qt and Python tear down;
- from then on job events only update :class:`WidgetState` (plain Python), never
  a widget that may already be deleted, and no new job starts.

:class:`JobWorker` is napari's generator worker that says when its thread
picked the job up and when it let go of it, whichever way it ended
(returned, failed, or abandoned at a yield by ``quit()``, which napari's own
close does to every task it lists).
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

from napari.qt.threading import GeneratorWorker
from qtpy.QtCore import QEvent, QObject, QTimer
from qtpy.QtWidgets import QMainWindow, QWidget

from napari_finetune.session.events import Event
from napari_finetune.session.work import Job

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")

# A fine-tuning step on a large model can take seconds; longer than this and the
# process ends anyway (the weights of the last step are lost, the painting is not).
CLOSE_WAIT_S = 10.0


class JobWorker(GeneratorWorker[Event, None, R]):
    """A generator worker with ``began`` and ``ended`` events any thread can wait on.

    Generic in ``R``, what the job returns (``returned`` carries it).
    """

    def __init__(self, func: Callable[P, Job[R]], *args: P.args, **kwargs: P.kwargs) -> None:
        jobs: list[Job[R]] = []

        def job(*job_args: P.args, **job_kwargs: P.kwargs) -> Job[R]:
            inner = func(*job_args, **job_kwargs)
            jobs.append(inner)
            return (yield from inner)

        super().__init__(job, *args, **kwargs)
        self.began = threading.Event()
        self.ended = threading.Event()
        self._jobs = jobs

    def work(self) -> R | Exception | None:  # noqa: D102 (runs in the worker thread)
        self.began.set()
        try:
            return super().work()
        finally:
            # A quit (Stop before training, napari closing its tasks) leaves the job
            # suspended at a yield: close it here so its ``finally`` blocks run now, in
            # this thread (a run's sample feed and its thread count among them).
            for job in self._jobs:
                job.close()
            self.ended.set()

    def wait(self, timeout_s: float) -> bool:
        """Block until the job let go of its thread; False after ``timeout_s``.

        A job that has not begun and was asked to quit never runs its body
        (the worker checks for quit before its first step), so it counts as
        ended. One that has not begun and was not asked to quit would wait for
        the event loop this call blocks: quit it first.
        """
        deadline = time.monotonic() + timeout_s
        while not (self.ended.is_set() or (not self.began.is_set() and self.abort_requested)):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.ended.wait(min(left, 0.02))
        return True


def end_jobs(workers: Iterable[JobWorker], stop_training: Callable[[], None],
             timeout_s: float) -> bool:
    """Stop training at its next step, quit what has not begun, wait for the rest.

    Jobs that already began (a save, an export) are left to finish: they
    write files, and waiting for them is what keeps those files whole.
    """
    workers = list(workers)
    stop_training()
    for worker in workers:
        if not worker.began.is_set():
            worker.quit()
    deadline = time.monotonic() + timeout_s
    return all(w.wait(max(0.0, deadline - time.monotonic())) for w in workers)


def at_exit_of_a_script(owner: S, ending: Callable[[S], object]) -> None:
    """Call ``ending(owner)`` when the interpreter begins to exit, while it still works fully.

    For a script that ends with napari still open (no ``napari.run()``, no close):
    no Qt signal comes before PyQt destroys its objects in no order, and by
    ``atexit``'s turn the thread pools refuse work, which zarr's writes need
    ("cannot schedule new futures after interpreter shutdown"). ``threading``'s
    own exit callbacks run first, newest first, so one registered now (after
    ``concurrent.futures`` registered its own) runs while the pools still
    take work. That registry is private to ``threading``: ``atexit`` is the
    fallback. ``owner`` is held weakly: a widget closed long before is not
    kept alive until the exit.
    """
    import concurrent.futures.thread  # noqa: F401 (its exit callback registered before ours)

    ref = weakref.ref(owner)

    def end() -> None:
        if (alive := ref()) is not None:
            ending(alive)

    register = getattr(threading, "_register_atexit", atexit.register)
    register(end)


class WindowCloseWatcher(QObject):
    """Calls ``on_close()`` once the main window a widget docks into really closes.

    The window's close can be refused (napari asks for confirmation while a
    task runs), so the Close event alone says nothing; a close that went
    through hides the window right away, within the same call. Minimising
    hides it too, but spontaneously and without a Close event before.
    """

    # ``on_close``'s result is ignored: the widget's close_work says whether its jobs ended
    # in time, which matters to its other callers only.
    def __init__(self, widget: QWidget, on_close: Callable[[], object]) -> None:
        super().__init__(widget)
        self._on_close = on_close
        self._closing = False
        self._watched: QMainWindow | None = None

    def follow(self, widget: QWidget) -> None:
        """Watch the main window ``widget`` is in now (call when it is shown)."""
        window = widget.window()
        if not isinstance(window, QMainWindow) or window is self._watched:
            return  # floating, or already watched
        if self._watched is not None:
            self._watched.removeEventFilter(self)
        self._watched = window
        window.installEventFilter(self)

    def eventFilter(  # noqa: N802 (Qt)
        self, watched: QObject | None, event: QEvent | None,
    ) -> bool:
        if event is not None and watched is not None and watched is self._watched:
            if event.type() == QEvent.Type.Close:
                self._closing = True
                QTimer.singleShot(0, self._refused)  # a close that went through hid it before
            elif event.type() == QEvent.Type.Hide and self._closing and not event.spontaneous():
                self._closing = False
                self._on_close()
        return False

    def _refused(self) -> None:
        self._closing = False
