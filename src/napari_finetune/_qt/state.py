"""What the widget tracks between job events, and how a run is ended or released.

:class:`WidgetState` is an evented dataclass (psygnal, which napari ships): the
fields the buttons depend on (``info``, ``busy``, ``trainer``, ``closed``, and
``reading``, ``warming`` and ``queued`` while the model is not there yet) emit
on change, and the widget follows them from one connection.
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from psygnal import evented

from napari_finetune._qt.corrections import Autosaver
from napari_finetune._qt.runner import ThreadRunner
from napari_finetune._qt.shutdown import end_jobs
from napari_finetune.session.checkpoint import CheckpointInfo
from napari_finetune.session.session import Busy, Session

if TYPE_CHECKING:
    from napari.layers import Image
    from psygnal import SignalGroup

    from napari_finetune.objects import ChannelRole
    from napari_finetune.trainer.loop import Finetuner
    from napari_finetune.trainer.status import Status

# The fields a button depends on; the others change often (every step) and signal nothing.
EVENTED_FIELDS = ("info", "busy", "trainer", "closed", "reading", "warming", "queued")


@evented(
    signal_aliases=lambda name: name if name in EVENTED_FIELDS else None,
    equality_operators={"trainer": operator.is_, "info": operator.is_},
)
@dataclass
class WidgetState:
    """Everything the widget tracks between events; ``state.events`` signals changes of
    ``info``, ``busy``, ``trainer``, ``closed``, ``reading``, ``warming`` and ``queued``."""

    if TYPE_CHECKING:
        # What ``@evented`` adds at run time, which the checker cannot see; a ClassVar, so
        # that the dataclass does not take it for a field.
        events: ClassVar[SignalGroup]

    info: CheckpointInfo | None = None
    # The model is not there yet: its checkpoint is being read (``reading``), the engine
    # imported (``warming``: warm-up jobs running). A Predict clicked meanwhile is kept
    # (``queued``) and starts once both are done, rather than dropped.
    reading: bool = False
    warming: int = 0
    queued: bool = False
    # The Session the buttons moved onto runs their jobs in ``runner``'s workers; a
    # closing widget stops and waits for those as for its own.
    runner: ThreadRunner = field(default_factory=ThreadRunner)
    session: Session | None = None
    busy: Busy | None = None  # the action running (SHOW: its layers being added)
    trainer: Finetuner | None = None  # kept after a run, for Export and Predict
    autosaver: Autosaver | None = None
    retired_savers: list[Autosaver] = field(default_factory=list)  # layers followed before
    clicked_at: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    statuses: list[Status] = field(default_factory=list)
    previews: int = 0
    errors: list[str] = field(default_factory=list)
    exported: str | None = None
    running: int = 0  # the Session's actions started and not ended
    run_summary: str = ""  # how the last run ended, kept on the bar after the final predict
    closed: bool = False  # the dock or the viewer closed: events only update this state
    stop_requested: bool = False  # Stop pressed (before the run's job started, or during)
    # "Paint here next": the regions the Session suggested for the current weights (it keeps
    # their uncertainty map and skips them when asked again).
    suggested: list[tuple[slice, ...]] = field(default_factory=list)
    # The Objects step: the float32 probability of each channel with a role from the last
    # prediction shown (the masks keep only prob > 0.5, and a role has its own threshold),
    # the image it was predicted on, and a count of predictions shown so far, which objects
    # layers carry so that Save skips objects of an earlier prediction.
    probabilities: dict[str, np.ndarray] = field(default_factory=dict)
    predicted_image: Image | None = None
    prediction_id: int = 0
    # Every channel's instance role as the Objects editor holds it (role None included),
    # starting from the checkpoint's: the next Predict keeps the probability of the channels
    # with a role, Objects labels them and Export stores them. ``roles_error`` is the
    # one-line reason while the editor holds a value no role can have (``roles`` keeps the
    # last valid ones, which nothing uses until the error is fixed).
    roles: dict[str, ChannelRole] = field(default_factory=dict)
    roles_error: str = ""

    def mark(self, name: str) -> None:
        """Record the first time ``name`` happened, in seconds after the Fine-tune click."""
        self.timings.setdefault(name, time.perf_counter() - self.clicked_at)


def stop(s: WidgetState) -> None:
    """End the running job at its next event (napari's ``worker.quit()``).

    A run's events come after whole optimizer steps or recoveries, so the
    weights of the last completed step are kept.
    """
    s.stop_requested = True
    if s.session is not None and s.session.busy is not None:
        s.session.stop()


def shut_down(s: WidgetState, wait_s: float) -> bool:
    """Save the pending painting, end the run at its next step, wait up to ``wait_s``.

    Plain Python on ``s`` only (no widget), so it is safe from ``destroyed``
    and ``aboutToQuit`` alike. Returns False when a job was still running at
    the deadline.
    """
    if s.closed:
        return True
    s.closed = True
    # The painting first (the wait below is bounded); the layer followed now last, as the
    # newest copy, so that an older layer's strokes cannot overwrite it.
    savers = [*s.retired_savers, *([s.autosaver] if s.autosaver is not None else [])]
    for saver in savers:
        saver.close()
    s.retired_savers.clear()
    # One list of jobs: the Session's runner runs them all (actions, the checkpoint read,
    # the warm-up, the autosaves).
    return end_jobs(s.runner.workers, lambda: stop(s), wait_s)


def release_trainer(s: WidgetState) -> None:
    """Drop the previous run's trainer and give its device memory back."""
    if s.session is not None and s.session.trainer is None:
        s.session.trainer = s.trainer  # the widget's (a run's), for the Session to release
    s.trainer = None
    if s.session is not None:  # its memory given back in the Session's runner
        s.session.release_trainer()


