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
* a non-finite loss or gradient under bf16/fp16 falls back to fp32 for good,
  and so does a finite one that disagrees with an fp32 pass of the same batch
  (:mod:`~napari_finetune.trainer.precision_check`).

The loop (:class:`~napari_finetune.trainer.loop.Finetuner`)
calls these; code driving a ``Finetuner`` by hand calls the public face,
:mod:`~napari_finetune.trainer.recovery` (``halve_batch(trainer)``,
``survive_oom(trainer, epoch)``, ``probe_precision(trainer)``), which delegates here.

With several ranks every decision here is taken by all of them at once
(:mod:`~napari_finetune.trainer.sync`), so their ladders never differ.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from napari_finetune.devices import empty_device_cache
from napari_finetune.errors import RecoveryError, is_oom_error
from napari_finetune.trainer import step as _step
from napari_finetune.trainer.batchnorm_floor import split_respects
from napari_finetune.trainer.oom import oom_line
from napari_finetune.trainer.precision import Precision
from napari_finetune.trainer.precision_check import (
    PrecisionCheck,
    captured_outputs,
    judge,
    not_compared,
)
from napari_finetune.trainer.run_state import RunState, TrainingParts
from napari_finetune.trainer.state import (
    left_as_it_was,
    restore_batchnorm,
    restore_rng,
    rng_state,
)
from napari_finetune.trainer.sync import LocalSync

if TYPE_CHECKING:
    from napari_finetune.data.sampling import PatchSampler
    from napari_finetune.trainer.snapshot import MemoryHistory

__all__ = [
    "compare_with_fp32",
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
    state is the one the line describes.

    One real micro-batch is run forward and backward at the run's precision.
    Under bf16/fp16 a non-finite loss or gradient falls back to fp32 for good;
    a finite result is then compared with an fp32 pass of the same weights,
    inputs and random states (:func:`compare_with_fp32`), and a disagreement
    falls back to fp32 too, the verdict naming the measured cosine. The check
    is kept in ``state.precision_check`` for the run record. With several
    ranks (``sync``) an out-of-memory, a non-finite result or a disagreement
    on any rank counts for all. Random states, BatchNorm statistics,
    gradients and weights are left as they were.
    """
    model, precision = parts.model, parts.precision
    with left_as_it_was(model, sampler) as bn:
        images, labels = sampler.sample(state.batch_size)
        while True:
            failure = None
            finite = True
            # The random states of this attempt, for the fp32 pass to draw the
            # same dropout (and anything else random in the forward).
            rng = rng_state(None)
            try:
                model.zero_grad(set_to_none=True)
                n = min(state.batch_size, len(images))
                with captured_outputs(model) as mixed_outputs:
                    loss = float(
                        _step.accumulate_gradients(
                            parts, state, images[:n], labels[:n], scaled=False,
                            micro_batches=[n],
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
        check = None
        if precision.enabled and finite:
            restore_batchnorm(bn)
            check = compare_with_fp32(
                state, parts, images[:n], labels[:n], mixed_outputs, rng, sync
            )
            state.precision_check = check
        if precision.enabled and not finite:
            tried = precision.describe()
            precision.fall_back_to_fp32()
            verdict = (
                f"precision probe: non-finite loss or gradients under {tried}; "
                "training in fp32 from now on"
            )
        elif check is not None and not check.agree:
            precision.fall_back_to_fp32()
            verdict = f"precision probe: {check.verdict}"
        else:
            verdict = (
                f"precision probe passed at batch {state.batch_size} × "
                f"{state.accumulation}: mixed precision {precision.describe()}"
            )
            if check is not None:
                verdict += f"; {check.verdict}"
    yield "probe", verdict


def compare_with_fp32(
    state: RunState,
    parts: TrainingParts,
    images: np.ndarray,
    labels: np.ndarray,
    mixed_outputs: list[torch.Tensor],
    rng: dict[str, Any],
    sync: LocalSync = _step.ALONE,
) -> PrecisionCheck:
    """Run the probe's batch again in fp32 and compare it with the mixed-precision pass.

    Call it with the mixed-precision pass's gradients still on the model and
    its BatchNorm statistics put back: the fp32 pass starts from the same
    weights, statistics and random states (``rng``, taken before the mixed
    pass), so only the precision differs. One more forward and backward; the
    caller's :func:`~napari_finetune.trainer.state.left_as_it_was` puts the
    gradients, statistics and random states back afterwards.

    Parameters
    ----------
    state, parts : RunState, TrainingParts
        The run; ``parts.precision`` is the mixed precision compared.
    images, labels : numpy.ndarray
        The probe's micro-batch, exactly as the mixed pass got it.
    mixed_outputs : list of torch.Tensor
        The model's outputs of the mixed pass
        (:func:`~napari_finetune.trainer.precision_check.captured_outputs`).
    rng : dict
        :func:`~napari_finetune.trainer.state.rng_state` before the mixed pass.
    sync : LocalSync
        With several ranks a disagreement on any rank counts for all.

    Returns
    -------
    PrecisionCheck
        The figures and the verdict; ``not_compared`` (kept as agreeing) when
        the fp32 pass runs out of memory.
    """
    model, dtype = parts.model, parts.precision.dtype_name
    trainable = [p for p in model.parameters() if p.grad is not None]
    mixed_grads = [p.grad.detach().clone() for p in trainable if p.grad is not None]
    fp32 = dataclasses.replace(parts, precision=Precision(parts.device, enabled=False))
    restore_rng(None, rng)
    model.zero_grad(set_to_none=True)
    failure = None
    try:
        with captured_outputs(model) as fp32_outputs:
            _step.accumulate_gradients(
                fp32, state, images, labels, scaled=False, micro_batches=[len(images)]
            )
        fp32_grads = [
            torch.zeros_like(p) if p.grad is None else p.grad for p in trainable
        ]
        check = judge(dtype, mixed_outputs, fp32_outputs, mixed_grads, fp32_grads)
    except Exception as exc:
        if not is_oom_error(exc):
            raise
        failure = oom_line(exc)
    if failure is not None:
        # Outside the except block: its traceback holds the fp32 activations.
        release_failed_attempt(parts)
        check = not_compared(
            dtype, f"the fp32 pass ran out of memory at batch {len(images)} ({failure})"
        )
    if sync.any(not check.agree) and check.agree:
        check = check.disagreed_elsewhere()
    return check


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
