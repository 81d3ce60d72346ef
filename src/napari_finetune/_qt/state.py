"""What the widget tracks between job events, and how a run is ended or released."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from napari_finetune._qt import worker as jobs
from napari_finetune._qt.corrections import Autosaver
from napari_finetune._qt.shutdown import end_jobs


@dataclass
class CheckpointInfo:
    """What the widget needs to know about the chosen model (read in a worker)."""

    path: str
    channel_names: list[str]
    colors: list[str]
    normalization: dict
    dims: int
    trust: tuple[str, ...] = ()  # factories the user trusted for this file (the dialog's Yes)


@dataclass
class RunState:
    """Everything the widget tracks between events."""

    info: CheckpointInfo | None = None
    busy: str | None = None  # "predict", "train", "export", "save" or None
    trainer: Any = None  # kept after a run, for Export and Predict
    worker: Any = None
    autosaver: Autosaver | None = None
    retired_savers: list[Autosaver] = field(default_factory=list)  # layers followed before
    region: tuple[slice, ...] | None = None
    clicked_at: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    statuses: list[Any] = field(default_factory=list)
    previews: int = 0
    errors: list[str] = field(default_factory=list)
    exported: str | None = None
    running: int = 0  # jobs started and not finished (autosaves included)
    run_summary: str = ""  # how the last run ended, kept on the bar after the final predict
    jobs: list[Any] = field(default_factory=list)  # the widget's workers not yet finished
    closed: bool = False  # the dock or the viewer closed: events only update this state
    stop_requested: bool = False  # Stop pressed before the run's job started
    # "Paint here next": the uncertainty map of the current weights (key: which weights),
    # and the regions suggested since, skipped when asked again.
    uncertainty: Any = None
    uncertainty_key: tuple | None = None
    suggested: list[tuple[slice, ...]] = field(default_factory=list)


def stop(s: RunState) -> None:
    """Stop at the next step (the weights of the last completed step are kept)."""
    s.stop_requested = True
    if s.trainer is not None:
        s.trainer.stop()
    elif s.worker is not None:
        s.worker.quit()  # still saving or building: end before training starts


def shut_down(s: RunState, wait_s: float) -> bool:
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
    saver_jobs = [job for saver in savers for job in saver.jobs]
    for saver in savers:
        saver.close()
    s.retired_savers.clear()
    return end_jobs([*s.jobs, *saver_jobs], lambda: stop(s), wait_s)


def release_trainer(s: RunState) -> None:
    """Drop the previous run's trainer and give its device memory back."""
    if s.trainer is not None:
        s.trainer = None
        jobs.release_memory()
