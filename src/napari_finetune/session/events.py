"""What the widget's jobs report while they run (napari's ``yielded`` signal).

A job yields these typed events; its result comes through the worker's
``returned`` signal and a failure through ``errored`` (napari then marks the
task as failed). The widget dispatches on the event's type, never on text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from napari_finetune.trainer.loop import Finetuner
    from napari_finetune.trainer.status import Status


@dataclass(frozen=True)
class Progress:
    """``done`` of ``total`` blocks of ``what`` ("predict", "save predictions"...)."""

    done: int
    total: int
    what: str


@dataclass(frozen=True)
class Saved:
    """The corrections were written into ``store`` (before training)."""

    store: str


@dataclass(frozen=True)
class TrainerReady:
    """The run's :class:`Finetuner` exists; kept for Export and Predict after the run."""

    trainer: Finetuner


@dataclass(frozen=True)
class RunStatus:
    """One event of ``Finetuner.run()``: the probe, a step, a recovery, the end."""

    status: Status


@dataclass(frozen=True)
class Placement:
    """Where a remote run trains ("the dask worker ADDR (host H, device D)"), or what it
    waits for while queued ("waiting for a worker with a GPU (GPU=1), 1 run ahead")."""

    text: str


@dataclass(frozen=True)
class Preview:
    """Probabilities of ``region`` with the current weights (channels first)."""

    region: tuple[slice, ...]
    probs: np.ndarray


@dataclass(frozen=True)
class PreviewFailed:
    """A preview could not be computed (``line``: the error's type and first line); the
    run goes on without it."""

    line: str


@dataclass(frozen=True)
class RegionPredicted:
    """The region in view is predicted, before the rest of the volume: ``masks`` are the
    prediction's own arrays (one per channel), final inside ``region``."""

    region: tuple[slice, ...]
    masks: list[np.ndarray]


Event = (Progress | Saved | TrainerReady | RunStatus | Placement | Preview | PreviewFailed
         | RegionPredicted)


class JobError(Exception):
    """A job's ``RuntimeError``, re-raised under a type napari's worker reports.

    The generator worker takes a ``RuntimeError`` for "this worker was deleted"
    and only warns about it; torch raises most of its failures as one.
    """
