"""Redo one optimizer step with the same samples until it is applied.

The loop's heart, kept apart from :mod:`loop`: an out-of-memory anywhere in
the attempt (student or teacher forward, backward, optimizer step) is caught,
only a line of text is kept (the traceback holds the failed attempt's
activations), and the recovery runs after the ``except`` block: BatchNorm
statistics restored, stale gradients and the scaler's half-done step cleared,
``gc`` + device cache, one rung down the ladder, then the same samples again.
Non-finite results under mixed precision fall back to fp32 and redo the step
with the weights unchanged; an fp16 GradScaler skip is reported and redone.

With several ranks the attempt's outcome is already agreed when
:func:`~napari_finetune.trainer.step.run_step` returns or raises (every rank
sees the same out-of-memory, the same loss, the same summed gradients), so
every rank takes the same branch here, at the same step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from napari_finetune.errors import RecoveryError, is_oom_error
from napari_finetune.trainer.ladder import after_applied_step, retry_at_bottom
from napari_finetune.trainer.oom import oom_line
from napari_finetune.trainer.oom_recovery import nothing_left_message, recover_from_oom
from napari_finetune.trainer.run_state import RunState
from napari_finetune.trainer.start import choose_micro_batch
from napari_finetune.trainer.state import batchnorm_state, restore_batchnorm
from napari_finetune.trainer.status import Status
from napari_finetune.trainer.step import run_step

if TYPE_CHECKING:
    from napari_finetune.trainer.loop import Finetuner

# Consecutive GradScaler skips of one step before fp16 is given up for fp32.
MAX_SCALER_SKIPS = 8


def optimizer_step(trainer: Finetuner, images: np.ndarray, labels: np.ndarray) -> Iterator[Status]:
    """Redo one optimizer step with the same samples until it is applied."""
    state, parts, sync = trainer.state, trainer.parts, trainer.sync
    precision = parts.precision
    step = state.steps_done + 1
    while True:
        failure = None
        with trainer.lock:
            saved = batchnorm_state(parts.model, parts.batchnorm)
            try:
                outcome = run_step(
                    parts, state, images, labels, trainer.config.max_grad_norm, sync
                )
            except Exception as exc:
                if not is_oom_error(exc):
                    raise
                # Keep a line of text only: the exception's traceback holds
                # the failed attempt's activations.
                failure = oom_line(exc)
        if failure is not None:
            restore_batchnorm(saved)
            del saved
            yield from _step_down(trainer, state, failure, step, (images, labels))
            continue
        if outcome.kind == "nonfinite":
            restore_batchnorm(saved)
            if not precision.enabled:
                raise FloatingPointError(
                    f"the loss of step {step} is {outcome.loss} in fp32: check the image "
                    "normalisation and the learning rate."
                )
            message = (
                f"non-finite loss or gradients at step {step} under "
                f"{precision.describe()}: falling back to fp32 for good, redoing the "
                "step (weights unchanged)"
                + (f" on all {sync.world_size} ranks" if sync.distributed else "")
            )
            precision.fall_back_to_fp32()
            state.recovery_log.append(message)
            yield trainer.status("recovery", message)
            continue
        if outcome.kind == "skipped":
            restore_batchnorm(saved)
            state.scaler_skips += 1
            before, after = outcome.scale
            message = (
                f"fp16 overflow at step {step}: the GradScaler skipped the update "
                f"(scale {before:g} → {after:g}); redoing the step"
            )
            if state.scaler_skips >= MAX_SCALER_SKIPS:
                precision.fall_back_to_fp32()
                message += f"; {state.scaler_skips} skips in a row: fp32 from now on"
            state.recovery_log.append(message)
            yield trainer.status("recovery", message)
            continue
        sync.align_buffers(parts.model)
        state.scaler_skips = 0
        state.steps_done = step
        state.last_loss = outcome.loss
        state.painted_seen += int(np.count_nonzero(labels))
        message = f"step {step}/{trainer.config.steps}: loss {outcome.loss:.4f}"
        checked = trainer.validate_if_due()
        yield trainer.status("step", f"{message}; {checked}" if checked else message)
        climbed = after_applied_step(state)
        if climbed:
            state.recovery_log.append(climbed)
            yield trainer.status("recovery", climbed)
        return


def _step_down(
    trainer: Finetuner,
    state: RunState,
    failure: str,
    step: int,
    samples: tuple[np.ndarray, np.ndarray],
) -> Iterator[Status]:
    """After an out-of-memory (agreed by every rank): one rung down, or a retry."""
    parts = trainer.parts
    snapshot = trainer.memory_history.dump_first_oom()
    state.climb.out_of_memory()
    # At the bottom rung a transient OOM gets a few retries (cache emptied)
    # before the teacher is freed or the run gives up.
    retry = retry_at_bottom(state, parts.device, step)
    had_teacher = state.teacher is not None
    if retry:
        state.recovery_log.append(retry)
    elif not recover_from_oom(state, parts):
        raise RecoveryError(
            nothing_left_message(state, parts.precision, failure, f"step {step}")
        )
    else:
        state.climb.retries = 0
    yield trainer.status("recovery", state.recovery_log[-1])
    if snapshot:
        yield trainer.status("recovery", snapshot)
    if had_teacher and state.teacher is None and trainer.config.autobatch_on(
        parts.device.type
    ):
        # The teacher's memory is free: measure again and grow into it.
        status = choose_micro_batch(trainer, samples)
        state.recovery_log.append(status.message)
        yield trainer.status("recovery", status.message)
