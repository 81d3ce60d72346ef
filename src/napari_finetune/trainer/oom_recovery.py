"""Stepping down instead of dying, on the typed run state: the ladder and the probe.

The functions here change a run's :class:`~napari_finetune.trainer.run_state.RunState`
(``batch_size``, ``accumulation``, ``distillation``, ``hold_other_channels``,
the teacher) and clear its :class:`~napari_finetune.trainer.run_state.TrainingParts`
(gradients, the scaler's half-done step), so the loop, the widget and outside
tests share one set of rules (docs/architecture.md, recovery):

* an out-of-memory first halves the micro-batch and raises the accumulation so
  the samples per optimizer step stay the same; at batch 1 the teacher is
  freed and distillation and the hold are dropped; then nothing is left;
* recovery runs after the ``except`` block has been left (the traceback holds
  the failed attempt's activations), then ``gc`` and the device cache;
* a non-finite loss or gradient under bf16/fp16 falls back to fp32 for good.

The loop (:mod:`~napari_finetune.trainer.retry`, :mod:`~napari_finetune.trainer.start`)
calls these; code driving a ``Finetuner`` by hand calls the public face,
:mod:`~napari_finetune.trainer.recovery` (``halve_batch(trainer)``,
``survive_oom(trainer, epoch)``, ``probe_precision(trainer)``), which delegates here.

With several ranks every decision here is taken by all of them at once
(:mod:`~napari_finetune.trainer.sync`), so their ladders never differ.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from napari_finetune.devices import empty_device_cache
from napari_finetune.errors import RecoveryError, is_oom_error
from napari_finetune.trainer import step as _step
from napari_finetune.trainer.batchnorm_floor import split_respects
from napari_finetune.trainer.oom import oom_line
from napari_finetune.trainer.precision import Precision
from napari_finetune.trainer.run_state import RunState, TrainingParts
from napari_finetune.trainer.state import left_as_it_was, restore_batchnorm
from napari_finetune.trainer.sync import LocalSync

if TYPE_CHECKING:
    from napari_finetune.data.sampling import PatchSampler
    from napari_finetune.trainer.snapshot import MemoryHistory

__all__ = [
    "halve_micro_batch",
    "iter_probe",
    "nothing_left_message",
    "recover_from_oom",
    "release_failed_attempt",
]


def release_failed_attempt(parts: TrainingParts) -> None:
    """Clear stale gradients and scaler state, collect garbage, empty the device cache."""
    parts.optimizer.zero_grad(set_to_none=True)
    parts.model.zero_grad(set_to_none=True)
    parts.precision.reset_step_state()
    gc.collect()
    empty_device_cache(parts.device)


# --- the ladder -------------------------------------------------------------------


def halve_micro_batch(state: RunState) -> bool:
    """Halve the micro-batch, keep the samples per optimizer step; False at batch 1.

    8 x 1 -> 4 x 2 -> 2 x 4 -> 1 x 8; an odd step of 5 goes 5 x 1 -> 3 x 2
    (3 + 2) -> 2 x 3 (2 + 2 + 1) -> 1 x 5.

    Parameters
    ----------
    state : RunState
        Its ``batch_size`` and ``accumulation`` change in place.

    Returns
    -------
    bool
        False when the micro-batch is 1 already, or when halving it would give
        a BatchNorm layer one value per channel (the run's measured floor).
    """
    if state.batch_size <= 1:
        return False
    smaller = (state.batch_size + 1) // 2
    # BatchNorm layers that see one value per channel per sample cannot train
    # on a micro-batch of 1: the ladder stops above that (the log said why).
    if not split_respects(state.batchnorm_floor, state.samples_per_step, smaller):
        return False
    state.use_micro_batch(smaller)
    return True


def recover_from_oom(state: RunState, parts: TrainingParts, where: str | None = None) -> bool:
    """Step down after an out-of-memory; call it after leaving the ``except`` block.

    First halve the batch; at batch 1 drop distillation and the hold on the
    other channels and free the teacher. Stale gradients are cleared, garbage
    collected and the device cache emptied. The action is appended to
    ``state.recovery_log`` (a line for the log).

    Parameters
    ----------
    state : RunState
        Changed in place.
    parts : TrainingParts
        Its gradients and the scaler's half-done step are cleared.
    where : str, optional
        "at step N" by default; the probe passes "in the precision probe",
        ``survive_oom(trainer, epoch)`` "at epoch E, step N".

    Returns
    -------
    bool
        False when nothing is left to give up.
    """
    release_failed_attempt(parts)
    step = state.steps_done + 1
    where = where or f"at step {step}"
    old = (state.batch_size, state.accumulation)
    if halve_micro_batch(state):
        # The rung left, for the climb back (trainer.ladder).
        state.climb.stepped_down(old[0], state.batch_size)
        message = (
            f"out of memory {where}: batch {old[0]} → {state.batch_size}, accumulation "
            f"{old[1]} → {state.accumulation} (effective {state.samples_per_step})"
        )
    elif state.has_teacher_terms:
        state.drop_teacher(step)
        gc.collect()
        empty_device_cache(parts.device)
        message = (
            f"out of memory {where} at batch {state.batch_size}: dropped distillation and "
            "the hold on the other channels, freed the teacher"
        )
    else:
        return False
    state.recovery_log.append(message)
    return True


# --- the precision probe ----------------------------------------------------------


def iter_probe(
    state: RunState,
    parts: TrainingParts,
    sampler: PatchSampler,
    history: MemoryHistory | None = None,
    sync: LocalSync = _step.ALONE,
) -> Iterator[tuple[str, str]]:
    """The precision probe as it happens: ``("recovery", line)`` per step down,
    then ``("probe", verdict)``; the run yields a Status for each while the
    state is the one the line describes. With several ranks (``sync``) an
    out-of-memory or a non-finite result on any rank counts for all.
    """
    model, precision = parts.model, parts.precision
    with left_as_it_was(model, sampler) as bn:
        images, labels = sampler.sample(state.batch_size)
        while True:
            failure = None
            finite = True
            try:
                model.zero_grad(set_to_none=True)
                n = min(state.batch_size, len(images))
                loss = float(
                    _step.accumulate_gradients(
                        parts, state, images[:n], labels[:n], scaled=False, micro_batches=[n]
                    )
                )
                finite = math.isfinite(loss) and precision.gradients_finite(model)
            except Exception as exc:
                if not is_oom_error(exc):
                    raise
                failure = oom_line(exc)
            if not sync.any(failure is not None):
                break
            failure = sync.failure_line(failure, "another rank ran out of memory")
            restore_batchnorm(bn)
            snapshot = history.dump_first_oom() if history is not None else ""
            if not recover_from_oom(state, parts, where="in the precision probe"):
                raise RecoveryError(
                    nothing_left_message(state, precision, failure, "the precision probe")
                )
            yield "recovery", state.recovery_log[-1]
            if snapshot:
                yield "recovery", snapshot
        finite = not sync.any(not finite)
        if precision.enabled and not finite:
            tried = precision.describe()
            precision.fall_back_to_fp32()
            verdict = (
                f"precision probe: non-finite loss or gradients under {tried}; "
                "training in fp32 from now on"
            )
        else:
            verdict = (
                f"precision probe passed at batch {state.batch_size} × "
                f"{state.accumulation}: mixed precision {precision.describe()}"
            )
    yield "probe", verdict


def nothing_left_message(state: RunState, precision: Precision, failure: str, where: str) -> str:
    """The final error: what failed, and every step down that was tried before."""
    tried = list(state.recovery_log)
    lines = [
        f"out of memory in {where} with nothing left to give up "
        f"(batch {state.batch_size} × accumulation {state.accumulation}, mixed precision "
        f"{precision.describe()}, distillation and hold dropped). Last error: {failure}.",
        "Tried, in order:" if tried else "Nothing could be tried.",
    ]
    lines += [f"  - {line}" for line in tried]
    lines.append(
        "Use a smaller patch_shape, a smaller model, or another device "
        "(close other programs using the GPU)."
    )
    return "\n".join(lines)
