"""The event a fine-tuning run yields: where it stands, frozen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Switch = Literal["on", "off", "dropped"]


@dataclass(frozen=True)
class Status:
    """One event of :meth:`Finetuner.run`.

    Attributes
    ----------
    kind : str
        "probe", "step", "recovery", "stopped" or "finished".
    dtype : {"bfloat16", "float16", "float32"}
        Autocast dtype in use (float32 when mixed precision is off).
    grad_scaler : bool
        Whether a GradScaler scales the fp16 loss.
    batch_size, accumulation : int
        Current micro-batch and micro-batches per optimizer step.
    distillation, hold_other_channels : {"on", "off", "dropped"}
        "dropped" once given up to survive out-of-memory.
    step, total_steps : int
        Optimizer steps completed and planned.
    epoch : int
        Passes over the painted voxels' anchor set (approximate for random sampling).
    loss : float or None
        Loss of the last completed optimizer step.
    message : str
        One line for the log: what just happened.
    distillation_weight : float
        Current distillation weight (0.0 once dropped).
    dropped_at_step : int or None
        Step at which distillation and the hold were dropped, if they were.
    elapsed_s : float
        Seconds since the run started.
    samples_per_step : int or None
        Samples in one optimizer step, fixed when the run starts; None for a
        Status built by hand, where ``batch_size * accumulation`` stands in.
    validation : dict or None
        IoU per channel name on the held-out painted voxels at the last check
        (the message of the step after which it ran says so); None before the
        first check or when nothing is held out.
    """

    kind: str
    dtype: str
    grad_scaler: bool
    batch_size: int
    accumulation: int
    distillation: Switch
    hold_other_channels: Switch
    step: int
    total_steps: int
    epoch: int
    loss: float | None
    message: str
    distillation_weight: float = 0.0
    dropped_at_step: int | None = None
    elapsed_s: float = 0.0
    samples_per_step: int | None = None
    validation: dict[str, float] | None = None

    @property
    def effective_batch(self) -> int:
        """The true samples per optimizer step (constant through recoveries).

        Not ``batch_size * accumulation``: 5 samples cut 3 + 2 are 5, not 6.
        """
        if self.samples_per_step is not None:
            return self.samples_per_step
        return self.batch_size * self.accumulation
