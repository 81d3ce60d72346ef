"""Stepping down instead of dying: mixed precision, out-of-memory, the probe.

The functions here read and change the public attributes of a
:class:`~napari_finetune.trainer.loop.Finetuner` (``model``, ``teacher``,
``optimizer``, ``precision``, ``batch_size``, ``accumulation``, ``distillation``,
``hold_other_channels``, ``device``), so the loop, the widget and outside
tests share one set of rules (docs/architecture.md, recovery):

* an out-of-memory first halves the micro-batch and raises the accumulation so
  the samples per optimizer step stay the same; at batch 1 the teacher is
  freed and distillation and the hold are dropped; then nothing is left;
* recovery runs after the ``except`` block has been left (the traceback holds
  the failed attempt's activations), then ``gc`` and the device cache;
* a non-finite loss or gradient under bf16/fp16 falls back to fp32 for good.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator
from typing import Any

import torch

from napari_finetune.devices import empty_device_cache
from napari_finetune.errors import RecoveryError, is_oom_error, one_line
from napari_finetune.trainer import step as _step
from napari_finetune.trainer.batchnorm_floor import split_respects
from napari_finetune.trainer.precision import Precision, choose_precision
from napari_finetune.trainer.state import (
    batchnorm_state,
    grad_state,
    restore_batchnorm,
    restore_grads,
    restore_rng,
    rng_state,
)

__all__ = [
    "Precision",
    "RecoveryError",
    "choose_precision",
    "halve_batch",
    "is_oom_error",
    "probe_precision",
    "survive_oom",
]


def release_failed_attempt(trainer: Any) -> None:
    """Clear stale gradients and scaler state, collect garbage, empty the device cache."""
    optimizer = getattr(trainer, "optimizer", None)
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    if getattr(trainer, "model", None) is not None:
        trainer.model.zero_grad(set_to_none=True)
    precision = getattr(trainer, "precision", None)
    if precision is not None:
        precision.reset_step_state()
    gc.collect()
    empty_device_cache(torch.device(getattr(trainer, "device", "cpu")))


# --- the ladder -------------------------------------------------------------------


def halve_batch(trainer: Any) -> bool:
    """Halve the micro-batch, keep the samples per optimizer step; False at batch 1.

    8 x 1 -> 4 x 2 -> 2 x 4 -> 1 x 8; an odd step of 5 goes 5 x 1 -> 3 x 2
    (3 + 2) -> 2 x 3 (2 + 2 + 1) -> 1 x 5.
    """
    if trainer.batch_size <= 1:
        return False
    samples = getattr(trainer, "samples_per_step", trainer.batch_size * trainer.accumulation)
    smaller = (trainer.batch_size + 1) // 2
    # BatchNorm layers that see one value per channel per sample cannot train
    # on a micro-batch of 1: the ladder stops above that (the log said why).
    if not split_respects(getattr(trainer, "batchnorm_floor", None), samples, smaller):
        return False
    trainer.batch_size = smaller
    trainer.accumulation = math.ceil(samples / trainer.batch_size)
    return True


def survive_oom(trainer: Any, epoch: int, where: str | None = None) -> bool:
    """Step down after an out-of-memory; call it after leaving the ``except`` block.

    First halve the batch; at batch 1 drop distillation and the hold on the
    other channels and free the teacher. Stale gradients are cleared, garbage
    collected and the device cache emptied. The action is appended to
    ``trainer.recovery_log`` (a line for the log), when the trainer has one.

    Parameters
    ----------
    trainer : Finetuner
        Changed in place.
    epoch : int
        Where the run stands (kept in the public signature; the Status the
        loop yields next carries it).
    where : str, optional
        "at step N" by default; the probe passes "in the precision probe".

    Returns
    -------
    bool
        False when nothing is left to give up.
    """
    release_failed_attempt(trainer)
    step = getattr(trainer, "steps_done", 0) + 1
    where = where or f"at step {step}"
    old = (trainer.batch_size, trainer.accumulation)
    if halve_batch(trainer):
        climb = getattr(trainer, "climb", None)
        if climb is not None:  # the rung left, for the climb back (trainer.ladder)
            climb.stepped_down(old[0], trainer.batch_size)
        message = (
            f"out of memory {where}: batch {old[0]} → {trainer.batch_size}, accumulation "
            f"{old[1]} → {trainer.accumulation} (effective "
            f"{getattr(trainer, 'samples_per_step', trainer.batch_size * trainer.accumulation)})"
        )
    elif trainer.teacher is not None or trainer.distillation > 0 or trainer.hold_other_channels:
        trainer.teacher = None
        trainer.distillation = 0.0
        trainer.hold_other_channels = False
        if hasattr(trainer, "dropped_at_step"):
            trainer.dropped_at_step = step
        gc.collect()
        empty_device_cache(torch.device(getattr(trainer, "device", "cpu")))
        message = (
            f"out of memory {where} at batch {trainer.batch_size}: dropped distillation and "
            "the hold on the other channels, freed the teacher"
        )
    else:
        return False
    log = getattr(trainer, "recovery_log", None)
    if log is not None:
        log.append(message)
    return True


# --- the precision probe ----------------------------------------------------------


def probe_precision(trainer: Any) -> list[str]:
    """Forward and backward one real micro-batch before training starts.

    Mixed precision falls back to fp32 when the loss or a gradient is not
    finite; an out-of-memory steps down the ladder (:func:`survive_oom`) and
    the probe is tried again. Nothing of training is disturbed: the random
    states (torch CPU/CUDA, numpy, Python, the sampler's generator), the
    BatchNorm running statistics and the gradients are as before, and the
    weights are not stepped.

    Returns
    -------
    list of str
        Log lines: one per recovery action, the verdict last.

    Raises
    ------
    RecoveryError
        Out of memory with nothing left to give up.
    """
    return [message for _, message in iter_probe(trainer)]


def iter_probe(trainer: Any) -> Iterator[tuple[str, str]]:
    """:func:`probe_precision` as it happens: ``("recovery", line)`` per step down,
    then ``("probe", verdict)``; the run yields a Status for each while the
    trainer's state is the one the line describes.
    """
    if hasattr(trainer, "build"):
        trainer.build()
    model, precision = trainer.model, trainer.precision
    rng = rng_state(trainer)
    bn = batchnorm_state(model)
    grads = grad_state(model)
    try:
        images, labels = trainer.sampler.sample(trainer.batch_size)
        while True:
            failure = None
            try:
                model.zero_grad(set_to_none=True)
                n = min(trainer.batch_size, len(images))
                loss = float(
                    _step.accumulate_gradients(
                        trainer, images[:n], labels[:n], scaled=False, micro_batches=[n]
                    )
                )
                finite = math.isfinite(loss) and precision.gradients_finite(model)
            except Exception as exc:
                if not is_oom_error(exc):
                    raise
                failure = one_line(exc)
            if failure is None:
                break
            restore_batchnorm(bn)
            history = getattr(trainer, "memory_history", None)
            snapshot = history.dump_first_oom() if history is not None else ""
            if not survive_oom(trainer, 0, where="in the precision probe"):
                raise RecoveryError(nothing_left_message(trainer, failure, "the precision probe"))
            yield "recovery", (trainer.recovery_log[-1] if hasattr(trainer, "recovery_log") else "")
            if snapshot:
                yield "recovery", snapshot
        if precision.enabled and not finite:
            tried = precision.describe()
            precision.fall_back_to_fp32()
            verdict = (
                f"precision probe: non-finite loss or gradients under {tried}; "
                "training in fp32 from now on"
            )
        else:
            verdict = (
                f"precision probe passed at batch {trainer.batch_size} × "
                f"{trainer.accumulation}: mixed precision {precision.describe()}"
            )
    finally:
        restore_rng(trainer, rng)
        restore_batchnorm(bn)
        restore_grads(grads)
    yield "probe", verdict


def nothing_left_message(trainer: Any, failure: str, where: str) -> str:
    """The final error: what failed, and every step down that was tried before."""
    tried = list(getattr(trainer, "recovery_log", []))
    lines = [
        f"out of memory in {where} with nothing left to give up "
        f"(batch {trainer.batch_size} × accumulation {trainer.accumulation}, mixed precision "
        f"{trainer.precision.describe()}, distillation and hold dropped). Last error: {failure}.",
        "Tried, in order:" if tried else "Nothing could be tried.",
    ]
    lines += [f"  - {line}" for line in tried]
    lines.append(
        "Use a smaller patch_shape, a smaller model, or another device "
        "(close other programs using the GPU)."
    )
    return "\n".join(lines)
