"""Redo one optimizer step with the same samples until it is applied.

The loop's heart, kept apart from :mod:`loop`: an out-of-memory anywhere in
the attempt (student or teacher forward, backward, optimizer step) is caught,
only a line of text is kept (the traceback holds the failed attempt's
activations), and the recovery runs after the ``except`` block: BatchNorm
statistics restored, stale gradients and the scaler's half-done step cleared,
``gc`` + device cache, one rung down the ladder, then the same samples again.
Non-finite results under mixed precision fall back to fp32 and redo the step
with the weights unchanged; an fp16 GradScaler skip is reported and redone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from napari_finetune.errors import one_line
from napari_finetune.trainer.ladder import after_applied_step, retry_at_bottom
from napari_finetune.trainer.recovery import (
    RecoveryError,
    is_oom_error,
    nothing_left_message,
    survive_oom,
)
from napari_finetune.trainer.start import choose_micro_batch
from napari_finetune.trainer.state import batchnorm_state, restore_batchnorm
from napari_finetune.trainer.status import Status
from napari_finetune.trainer.step import run_step

# Consecutive GradScaler skips of one step before fp16 is given up for fp32.
MAX_SCALER_SKIPS = 8


def optimizer_step(trainer: Any, images: np.ndarray, labels: np.ndarray) -> Iterator[Status]:
    """Redo one optimizer step with the same samples until it is applied."""
    step = trainer.steps_done + 1
    while True:
        failure = None
        with trainer._lock:
            saved = batchnorm_state(trainer.model, trainer._bn_modules)
            try:
                outcome = run_step(trainer, images, labels)
            except Exception as exc:
                if not is_oom_error(exc):
                    raise
                # Keep a line of text only: the exception's traceback holds
                # the failed attempt's activations.
                failure = one_line(exc)
        if failure is not None:
            restore_batchnorm(saved)
            del saved
            snapshot = trainer.memory_history.dump_first_oom()
            trainer.climb.out_of_memory()
            # At the bottom rung a transient OOM gets a few retries (cache
            # emptied) before the teacher is freed or the run gives up.
            retry = retry_at_bottom(trainer, step)
            had_teacher = trainer.teacher is not None
            if retry:
                trainer.recovery_log.append(retry)
            elif not survive_oom(trainer, trainer.epoch):
                raise RecoveryError(nothing_left_message(trainer, failure, f"step {step}"))
            else:
                trainer.climb.retries = 0
            yield trainer.status("recovery", trainer.recovery_log[-1])
            if snapshot:
                yield trainer.status("recovery", snapshot)
            if had_teacher and trainer.teacher is None and trainer.config.autobatch_on(
                trainer.device.type
            ):
                # The teacher's memory is free: measure again and grow into it.
                status = choose_micro_batch(trainer, (images, labels))
                trainer.recovery_log.append(status.message)
                yield trainer.status("recovery", status.message)
            continue
        if outcome.kind == "nonfinite":
            restore_batchnorm(saved)
            if not trainer.precision.enabled:
                raise FloatingPointError(
                    f"the loss of step {step} is {outcome.loss} in fp32: check the image "
                    "normalisation and the learning rate."
                )
            message = (
                f"non-finite loss or gradients at step {step} under "
                f"{trainer.precision.describe()}: falling back to fp32 for good, redoing the "
                "step (weights unchanged)"
            )
            trainer.precision.fall_back_to_fp32()
            trainer.recovery_log.append(message)
            yield trainer.status("recovery", message)
            continue
        if outcome.kind == "skipped":
            restore_batchnorm(saved)
            trainer.scaler_skips += 1
            before, after = outcome.scale
            message = (
                f"fp16 overflow at step {step}: the GradScaler skipped the update "
                f"(scale {before:g} → {after:g}); redoing the step"
            )
            if trainer.scaler_skips >= MAX_SCALER_SKIPS:
                trainer.precision.fall_back_to_fp32()
                message += f"; {trainer.scaler_skips} skips in a row: fp32 from now on"
            trainer.recovery_log.append(message)
            yield trainer.status("recovery", message)
            continue
        trainer.scaler_skips = 0
        trainer.steps_done = step
        trainer.last_loss = outcome.loss
        trainer._painted_seen += int(np.count_nonzero(labels))
        message = f"step {step}/{trainer.config.steps}: loss {outcome.loss:.4f}"
        checked = trainer.validate_if_due()
        yield trainer.status("step", f"{message}; {checked}" if checked else message)
        climbed = after_applied_step(trainer)
        if climbed:
            trainer.recovery_log.append(climbed)
            yield trainer.status("recovery", climbed)
        return
