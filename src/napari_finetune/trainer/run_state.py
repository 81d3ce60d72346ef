"""One typed run state: everything the ladder changes, and the parts it trains.

:class:`RunState` holds what a run changes as it goes (micro-batch and
accumulation, distillation and the hold, the teacher while it is kept, the
step at which they were dropped, scaler skips, the recovery log, autobatch's
decision, the ladder's way back up, the step counter). The
:class:`~napari_finetune.trainer.loop.Finetuner` owns one and shows its fields
as read-only attributes; the free functions of the loop (``retry``, ``step``,
``recovery``, ``ladder``, ``autobatch``, ``record``) take it, with the
:class:`TrainingParts` (model, optimizer, precision), as typed arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import torch

from napari_finetune.config import FinetuneConfig
from napari_finetune.trainer.climb import Climb
from napari_finetune.trainer.precision import Precision
from napari_finetune.trainer.status import Switch

if TYPE_CHECKING:
    from napari_finetune.trainer.autobatch_decision import AutobatchDecision
    from napari_finetune.trainer.batchnorm_floor import BatchNormFloor
    from napari_finetune.trainer.precision_check import PrecisionCheck
    from napari_finetune.trainer.teacher import Teacher

T = TypeVar("T")


@dataclass
class TrainingParts:
    """What :meth:`Finetuner.build` made: the model as trained and what steps it.

    Attributes
    ----------
    model : torch.nn.Module
        The student (PEFT-wrapped for LoRA).
    optimizer : torch.optim.Optimizer
        AdamW over the trainable parameters.
    precision : Precision
        Autocast dtype and GradScaler (one-way fall-back to fp32).
    corrected : torch.Tensor
        Indices of the channels the corrections paint.
    batchnorm : list of torch.nn.Module
        The BatchNorm layers whose running statistics a failed attempt restores.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    precision: Precision
    corrected: torch.Tensor
    batchnorm: list[torch.nn.Module]

    @property
    def device(self) -> torch.device:
        """Where the run trains."""
        return self.precision.device


@dataclass
class RunState:
    """What the ladder, the precision fall-back and autobatch change during a run.

    Attributes
    ----------
    batch_size, accumulation : int
        Micro-batch and micro-batches per optimizer step.
    samples_per_step : int
        Samples of one optimizer step (fixed for the run).
    distillation : float
        Weight of the distillation term (0.0 once dropped).
    hold_other_channels : bool
        Whether the uncorrected channels are held to the teacher.
    distillation_configured, hold_configured : bool
        What the config asked for (tells "dropped" from "off").
    balance_classes : bool
        Every painted class weighs the same in the supervised term.
    balance_groups : tuple of int
        Painted label values 1, 2, ... in groups that weigh the same in the supervised
        term (a boundary channel's membranes against the rest); empty: no groups.
    teacher : Teacher or None
        The frozen starting model while distillation or the hold need it.
    dropped_at_step : int or None
        Step at which distillation and the hold were given up (0: resumed so).
    scaler_skips : int
        GradScaler skips of the current step in a row.
    recovery_log : list of str
        One line per recovery action, in order.
    autobatch_decision : AutobatchDecision or None
        What the memory-aware start chose, when it ran.
    climb : Climb
        The ladder's way back up.
    batchnorm_floor : BatchNormFloor or None
        The smallest micro-batch the BatchNorm layers train on.
    steps_done : int
        Optimizer steps applied.
    last_loss : float or None
        Loss of the last applied step.
    painted_seen : int
        Painted voxels seen in applied steps (the epoch counts passes over them).
    precision_check : PrecisionCheck or None
        The probe's comparison of mixed precision with fp32 (None: not made,
        an fp32 run or a non-finite probe).
    """

    batch_size: int
    accumulation: int
    samples_per_step: int
    distillation: float
    hold_other_channels: bool
    distillation_configured: bool
    hold_configured: bool
    balance_classes: bool = False
    balance_groups: tuple[int, ...] = ()
    teacher: Teacher | None = None
    dropped_at_step: int | None = None
    scaler_skips: int = 0
    recovery_log: list[str] = field(default_factory=list)
    autobatch_decision: AutobatchDecision | None = None
    climb: Climb = field(default_factory=Climb)
    batchnorm_floor: BatchNormFloor | None = None
    steps_done: int = 0
    last_loss: float | None = None
    painted_seen: int = 0
    precision_check: PrecisionCheck | None = None

    @classmethod
    def from_config(cls, config: FinetuneConfig) -> RunState:
        """The state a run starts in."""
        return cls(
            batch_size=config.batch_size,
            accumulation=config.accumulation,
            samples_per_step=config.samples_per_step,
            distillation=float(config.distillation),
            hold_other_channels=bool(config.hold_other_channels),
            distillation_configured=config.distillation > 0,
            hold_configured=bool(config.hold_other_channels),
            balance_classes=bool(config.balance_classes),
        )

    def balance(self) -> tuple[bool, tuple[int, ...]]:
        """``(balance, groups)`` for :func:`~napari_finetune.trainer.losses.step_normalisers`:
        every class its own group when the classes are balanced, else the groups if any."""
        if self.balance_classes:
            return True, ()
        return bool(self.balance_groups), self.balance_groups

    def use_micro_batch(self, batch: int) -> None:
        """Cut the same samples per step into micro-batches of at most ``batch``."""
        self.batch_size = int(batch)
        self.accumulation = math.ceil(self.samples_per_step / self.batch_size)

    def drop_teacher(self, step: int) -> None:
        """Give up distillation and the hold, free the teacher (from ``step`` on)."""
        self.teacher = None
        self.distillation = 0.0
        self.hold_other_channels = False
        self.dropped_at_step = step

    @property
    def has_teacher_terms(self) -> bool:
        """Whether anything is left to drop (a teacher, distillation or the hold)."""
        return self.teacher is not None or self.distillation > 0 or self.hold_other_channels

    @property
    def distillation_switch(self) -> Switch:
        """"on", "off", or "dropped" (configured on and given up)."""
        return _switch(self.distillation_configured, self.distillation > 0, self.dropped)

    @property
    def hold_switch(self) -> Switch:
        """The hold on the other channels: "on", "off" or "dropped"."""
        return _switch(self.hold_configured, self.hold_other_channels, self.dropped)

    @property
    def dropped(self) -> bool:
        """Whether distillation and the hold were given up."""
        return self.dropped_at_step is not None


def _switch(configured: bool, current: bool, dropped: bool) -> Switch:
    if current:
        return "on"
    return "dropped" if configured and dropped else "off"


class FromState(Generic[T]):
    """A read-only attribute of the owner that is its ``state``'s field of the same name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: HasState | None, objtype: type | None = None) -> T:
        if obj is None:
            return self  # type: ignore[return-value]  # the descriptor itself, on the class
        return getattr(obj.state, self.name)


class HasState(Protocol):
    """An object that owns a :class:`RunState` (the Finetuner)."""

    state: RunState
