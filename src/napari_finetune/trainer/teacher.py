"""The frozen starting model, as a callable ``teacher(x) -> logits``.

With LoRA the teacher is the student with its adapters disabled (no second
copy of the weights); a full fine-tune keeps a frozen deep copy, freed when
distillation and the hold are dropped (``trainer.teacher = None``). Both run
in eval mode: the teacher reproduces what the starting model predicted, and
its BatchNorm statistics are never updated.

:meth:`Teacher.forward` is the seam fault injection wraps
(:func:`napari_finetune.testing.oom_in_teacher`); nothing here knows of tests.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # for the type only: importing peft takes seconds
    from peft import PeftModel


class Teacher:
    """Base: :meth:`forward` without autograd.

    Attributes
    ----------
    channels : int or None
        How many leading output channels the teacher gives: those the starting
        model had, when the student got a channel for a new structure since
        (its old rows are the starting model's, so the first ``channels``
        outputs are the starting model's exactly). None: all of them.
    """

    channels: int | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = self.forward(x)
        return out if self.channels is None else out[:, : self.channels]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class FrozenCopyTeacher(Teacher):
    """A frozen deep copy of the starting model (full fine-tune)."""

    def __init__(self, model: nn.Module, channels: int | None = None) -> None:
        self.channels = channels
        self.module = copy.deepcopy(model).eval()
        for param in self.module.parameters():
            param.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


class AdapterOffTeacher(Teacher):
    """The LoRA student with its adapters disabled (PEFT ``disable_adapter``)."""

    def __init__(self, peft_model: PeftModel, channels: int | None = None) -> None:
        self.channels = channels
        self.module = peft_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from napari_finetune.model.modes import evaluating

        # Each module's flag put back, not the whole model set to training: BatchNorms
        # held in eval on purpose (an added channel's run holds the old layers') stay so.
        with evaluating(self.module), self.module.disable_adapter():
            return self.module(x)
