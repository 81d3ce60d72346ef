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
* a non-finite loss or gradient under bf16/fp16 is redone in fp32 and the
  next step is mixed again; three such steps within fifty give mixed precision
  up for good, and so does a finite result of the probe that disagrees with an
  fp32 pass of the same batch (:mod:`~napari_finetune.trainer.precision_check`).

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
from collections.abc import Generator, Iterator
from contextlib import contextmanager
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
    BatchNormState,
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
    """The precision probe as it happens: ``("recovery", line)`` per step down
    or retried pass, then ``("probe", verdict)``; the run yields a Status for
    each while the state is the one the line describes.

    One real micro-batch is run forward and backward at the run's precision,
    as training runs it (fp16 through the GradScaler's scaled backward, then
    unscaled). A non-finite result under bf16/fp16 counts as one bad step
    (:meth:`~napari_finetune.trainer.precision.Precision.bad_step`) and the
    pass is tried again (fp16 at half the loss scale); only as many bad steps
    as give mixed precision up in training turn it off here. A finite result
    is then compared with an fp32 pass of the same weights, inputs and random
    states (:func:`compare_with_fp32`), and a disagreement falls back to fp32,
    the verdict naming the measured cosine. The check is kept in
    ``state.precision_check`` for the run record. With several ranks
    (``sync``) an out-of-memory, a non-finite result or a disagreement on any
    rank counts for all. Random states, BatchNorm statistics, gradients and
    weights are left as they were.
    """
    model, precision = parts.model, parts.precision
    with left_as_it_was(model, sampler) as bn:
        images, labels = sampler.sample(state.batch_size)
        while True:
            n, mixed_outputs, rng, finite = yield from _mixed_pass(
                state, parts, images, labels, bn, history, sync
            )
            if not precision.enabled or finite:
                break
            restore_batchnorm(bn)
            mixed = precision.mixed_words
            if precision.bad_step(0):
                break
            precision.resume()
            line = f"precision probe: non-finite loss or gradients under {mixed}; trying again"
            if precision.grad_scaler:
                scale = float(precision.scaler.get_scale())
                precision.scaler.update(scale / 2)  # as training's scaler backs off
                line += f" at loss scale {scale / 2:g}"
            state.recovery_log.append(line)
            yield "recovery", line
        check = None
        if precision.enabled and finite:
            restore_batchnorm(bn)
            check = yield from _compare_at_any_size(
                state, parts, images[:n], labels[:n], mixed_outputs, rng, bn, sync
            )
            state.precision_check = check
        if precision.fell_back:
            verdict = (
                f"precision probe: non-finite loss or gradients under {precision.mixed_words} "
                f"{len(precision.bad_steps)} times; training in fp32 from now on"
            )
        elif check is not None and not check.agree:
            precision.fall_back_to_fp32("it disagreed with fp32 in the probe")
            verdict = f"precision probe: {check.verdict}"
        else:
            verdict = (
                f"precision probe passed at batch {state.batch_size} × "
                f"{state.accumulation}: {precision.describe()}"
            )
            if check is not None:
                verdict += f"; {check.verdict}"
    yield "probe", verdict


def _mixed_pass(
    state: RunState,
    parts: TrainingParts,
    images: np.ndarray,
    labels: np.ndarray,
    bn: BatchNormState,
    history: MemoryHistory | None,
    sync: LocalSync,
) -> Generator[tuple[str, str], None, tuple[int, list[torch.Tensor], dict[str, Any], bool]]:
    """The probe's pass at the run's precision, stepping down on out-of-memory.

    Returns (micro-batch, the outputs, the random states before the pass,
    whether loss and gradients are finite on every rank); the gradients stay
    on the model, unscaled.
    """
    model, precision = parts.model, parts.precision
    while True:
        failure = None
        finite = True
        # The random states of this attempt, for the fp32 pass to draw the
        # same dropout (and anything else random in the forward).
        rng = rng_state(None)
        n = min(state.batch_size, len(images))
        mixed_outputs: list[torch.Tensor] = []
        try:
            model.zero_grad(set_to_none=True)
            with captured_outputs(model) as mixed_outputs:
                loss = _scaled_like_training(parts, state, images[:n], labels[:n])
            finite = math.isfinite(loss) and precision.gradients_finite(model)
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            failure = oom_line(exc)
        if not sync.any(failure is not None):
            return n, mixed_outputs, rng, not sync.any(not finite)
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


def _scaled_like_training(
    parts: TrainingParts, state: RunState, images: np.ndarray, labels: np.ndarray
) -> float:
    """Forward and backward as training does; the gradients left unscaled.

    Under fp16 the backward goes through the GradScaler, as in training, and
    the gradients are divided by the scale after: an unscaled fp16 backward
    underflows where training's does not, and would make the comparison fail
    on a card where fp16 trains well.
    """
    precision = parts.precision
    scaled = precision.grad_scaler and precision.enabled
    loss = float(
        _step.accumulate_gradients(
            parts, state, images, labels, scaled=scaled, micro_batches=[len(images)]
        )
    )
    if scaled:
        inverse = 1.0 / float(precision.scaler.get_scale())
        for p in parts.model.parameters():
            if p.grad is not None:
                p.grad.mul_(inverse)
    return loss


@contextmanager
def true_fp32() -> Iterator[None]:
    """fp32 as the reference means it: TF32 off for matmuls and cuDNN, restored after.

    An Ampere or later card computes "fp32" convolutions in TF32 (10-bit
    mantissa) by default; a reference that rounds like that would hide part of
    the difference the probe measures.
    """
    matmul = torch.backends.cuda.matmul.allow_tf32
    cudnn = torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def _compare_at_any_size(
    state: RunState,
    parts: TrainingParts,
    images: np.ndarray,
    labels: np.ndarray,
    mixed_outputs: list[torch.Tensor],
    rng: dict[str, Any],
    bn: BatchNormState,
    sync: LocalSync,
) -> Generator[tuple[str, str], None, PrecisionCheck]:
    """:func:`compare_with_fp32`, at a smaller micro-batch while fp32 runs out of memory.

    Both passes are run again at the smaller size (the gradients of a batch
    depend on all of it). At one sample with no room left the check is "not
    compared (out of memory)": the run keeps mixed precision on the finiteness
    check alone, and says so.
    """
    n = len(images)
    while True:
        check = compare_with_fp32(state, parts, images[:n], labels[:n], mixed_outputs, rng, sync)
        # Every rank halves together (each pass below holds collectives): an out-of-memory
        # on any rank means all compare again smaller.
        if not sync.any(not check.compared) or n == 1:
            return check
        n //= 2
        line = (
            f"precision probe: the fp32 pass ran out of memory; comparing at micro-batch {n}"
        )
        state.recovery_log.append(line)
        yield "recovery", line
        restore_batchnorm(bn)
        n, mixed_outputs, rng = _rerun_mixed(parts, state, images[:n], labels[:n], bn)


def _rerun_mixed(
    parts: TrainingParts, state: RunState, images: np.ndarray, labels: np.ndarray,
    bn: BatchNormState,
) -> tuple[int, list[torch.Tensor], dict[str, Any]]:
    """The mixed pass again on fewer samples, for a comparison at that size."""
    rng = rng_state(None)
    parts.model.zero_grad(set_to_none=True)
    with captured_outputs(parts.model) as outputs:
        _scaled_like_training(parts, state, images, labels)
    restore_batchnorm(bn)
    return len(images), outputs, rng


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

    Call it with the mixed-precision pass's gradients (unscaled) still on the
    model and its BatchNorm statistics put back: the fp32 pass starts from the
    same weights, statistics and random states (``rng``, taken before the
    mixed pass), so only the precision differs. One more forward and backward,
    in true fp32 (:func:`true_fp32`); the caller's
    :func:`~napari_finetune.trainer.state.left_as_it_was` puts the gradients,
    statistics and random states back afterwards.

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
    model, dtype = parts.model, parts.precision.mixed_dtype_name
    trainable = [p for p in model.parameters() if p.grad is not None]
    mixed_grads = [p.grad.detach().clone() for p in trainable if p.grad is not None]
    fp32 = dataclasses.replace(parts, precision=Precision(parts.device, enabled=False))
    restore_rng(None, rng)
    model.zero_grad(set_to_none=True)
    failure = None
    try:
        with captured_outputs(model) as fp32_outputs, true_fp32():
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
        check = not_compared(dtype, f"the fp32 pass at micro-batch {len(images)}: {failure}")
    if sync.any(not check.agree) and check.agree:
        check = check.disagreed_elsewhere()
    return check


def nothing_left_message(state: RunState, precision: Precision, failure: str, where: str) -> str:
    """The final error: what failed, and every step down that was tried before."""
    tried = list(state.recovery_log)
    lines = [
        f"out of memory in {where} with nothing left to give up "
        f"(batch {state.batch_size} × accumulation {state.accumulation}, "
        f"{precision.describe()}, distillation and hold dropped). Last error: {failure}.",
        "Tried, in order:" if tried else "Nothing could be tried.",
    ]
    lines += [f"  - {line}" for line in tried]
    lines.append(
        "Use a smaller patch_shape, a smaller model, or another device "
        "(close other programs using the GPU)."
    )
    return "\n".join(lines)
