"""The fine-tuning run: one :class:`Finetuner` owns it, from set-up to export.

Construction is cheap on purpose (the widget builds a :class:`Finetuner` on the
Qt main thread): the patch sampler, the optimizer (the first AdamW costs ~1.6 s
of lazy imports), the PEFT wrapping and the teacher are built by
:meth:`Finetuner.build`, which :meth:`Finetuner.run` calls in the worker thread.

Before step 1 the run chooses its micro-batch (autobatch, when on) and probes
its precision; when the probe falls back to fp32, whose activations are larger
than those just measured, or frees the teacher, the profile is taken again.

An optimizer step draws its samples once; if it runs out of memory anywhere
(student forward, teacher forward, backward, optimizer step) the loop leaves
the ``except`` block (only a line of text is kept: the traceback holds the
failed attempt's activations), undoes the failed attempt (BatchNorm
statistics, stale gradients, the scaler's half-done step), steps down the
ladder (:func:`~napari_finetune.trainer.oom_recovery.recover_from_oom`) and
redoes the same step with the same samples cut smaller. Non-finite results
under mixed precision fall back to fp32 and redo the step with the weights
unchanged; an fp16 GradScaler skip is reported and redone. A step is never
skipped or applied twice, and the step counter only moves when the optimizer
stepped. With several ranks the attempt's outcome is already agreed when
:func:`~napari_finetune.trainer.step.run_step` returns or raises, so every rank
takes the same branch at the same step.

The pure pieces take the :class:`~napari_finetune.trainer.run_state.RunState`
and the :class:`~napari_finetune.trainer.run_state.TrainingParts` (or, for the
record, anything shaped like a run) and never import this module.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from napari_finetune.arrays import AxesImage, VolumeArray
from napari_finetune.config import FinetuneConfig
from napari_finetune.errors import RecoveryError, is_oom_error
from napari_finetune.model.lora import describe_adapters
from napari_finetune.trainer import collector, record
from napari_finetune.trainer.batchnorm_floor import describe_floor
from napari_finetune.trainer.ladder import after_applied_step, retry_at_bottom
from napari_finetune.trainer.memory_info import MemoryInfo
from napari_finetune.trainer.oom import oom_line
from napari_finetune.trainer.oom_recovery import iter_probe, nothing_left_message, recover_from_oom
from napari_finetune.trainer.precision import BAD_STEP_LIMIT, BAD_STEP_WINDOW, Precision
from napari_finetune.trainer.run_state import FromState, RunState, TrainingParts
from napari_finetune.trainer.snapshot import MemoryHistory
from napari_finetune.trainer.state import batchnorm_state, restore_batchnorm
from napari_finetune.trainer.status import Status
from napari_finetune.trainer.step import run_step
from napari_finetune.trainer.sync import LocalSync
from napari_finetune.trainer.validation import Validator

if TYPE_CHECKING:
    from napari_finetune.data.prefetch import SampleFeed
    from napari_finetune.data.sampling import PatchSampler
    from napari_finetune.model.checkpoint_format import Checkpoint
    from napari_finetune.trainer.autobatch import Samples
    from napari_finetune.trainer.autobatch_decision import AutobatchDecision
    from napari_finetune.trainer.batchnorm_floor import BatchNormFloor
    from napari_finetune.trainer.climb import Climb
    from napari_finetune.trainer.teacher import Teacher

# Consecutive GradScaler skips of one step before fp16 is given up for fp32.
MAX_SCALER_SKIPS = 8


class Finetuner:
    """Fine-tunes ``model`` on painted corrections of ``image``; owns the whole run.

    Parameters
    ----------
    model : torch.nn.Module
        The pretrained model (one logit per channel). With ``mode="lora"`` PEFT
        wraps it in place when the run starts.
    image, corrections : array-like
        Raw volume and its corrections (0 unpainted, 1 background, k >= 2
        channel k - 2), same spatial shape, ZYX or YX; numpy, zarr or dask.
    config : FinetuneConfig
        The run's settings.
    metadata : dict, optional
        The checkpoint's metadata: ``channel_names``, ``normalization``, and
        ``run`` (a previous run's record; its degraded state is resumed).
    source_sha256 : str, optional
        Hash of the starting checkpoint, recorded in the export.
    sync : LocalSync, optional
        Where the run's decisions are agreed: this process alone (default), or
        every rank of a multi-process run (:mod:`~napari_finetune.trainer.distributed`).

    Attributes
    ----------
    state : RunState
        What the ladder, the precision fall-back and autobatch change; its
        fields are also read-only attributes of the trainer (``batch_size``,
        ``accumulation``, ``teacher``, ``recovery_log``, ``steps_done``, ...).
    lock : threading.RLock
        Held while the weights change; :meth:`predict` and :meth:`export` take it.
    """

    batch_size: FromState[int] = FromState()
    accumulation: FromState[int] = FromState()
    samples_per_step: FromState[int] = FromState()
    distillation: FromState[float] = FromState()
    hold_other_channels: FromState[bool] = FromState()
    teacher: FromState[Teacher | None] = FromState()
    dropped_at_step: FromState[int | None] = FromState()
    scaler_skips: FromState[int] = FromState()
    recovery_log: FromState[list[str]] = FromState()
    autobatch_decision: FromState[AutobatchDecision | None] = FromState()
    climb: FromState[Climb] = FromState()
    batchnorm_floor: FromState[BatchNormFloor | None] = FromState()
    steps_done: FromState[int] = FromState()
    last_loss: FromState[float | None] = FromState()

    def __init__(
        self,
        model: torch.nn.Module,
        image: VolumeArray | AxesImage,
        corrections: VolumeArray,
        config: FinetuneConfig,
        metadata: dict[str, Any] | None = None,
        source_sha256: str | None = None,
        sync: LocalSync | None = None,
    ) -> None:
        from napari_finetune.devices import (
            check_input_channels,
            check_model_fits_image,
            resolve_device,
        )

        self.axes_image = AxesImage.of(image)
        check_model_fits_image(model, self.axes_image.spatial_shape)
        check_input_channels(model, self.axes_image.channels, self.axes_image.axes)
        self.model = model
        # The array as given: a plain volume is what it always was.
        self.image = self.axes_image.array
        self.corrections = corrections
        self.config = config
        self.metadata = dict(metadata or {})
        # Which channels, in which order, the model was trained on: kept in the export
        # (one channel of several, taken with AxesImage.channel, is named too).
        if not self.axes_image.is_plain:
            self.metadata["input_axes"] = self.axes_image.axes
        if self.axes_image.channel_names:
            self.metadata["input_channels"] = list(self.axes_image.channel_names)
        self.source_sha256 = source_sha256
        self.device = torch.device(resolve_device(config.device))
        self.precision = Precision(self.device, config.mixed_precision, config.cpu_bf16)
        self.sync = sync or LocalSync()
        self.state = RunState.from_config(config)
        self._parts: TrainingParts | None = None  # made by build()
        self.sampler: PatchSampler | None = None
        self.feed: SampleFeed | None = None  # its wait_s says how long steps waited
        self.ended: str | None = None  # how the run ended, when not by finishing or stop()
        self.validator = Validator(
            config.validation_every, config.early_stop_checks, config.keep_best
        )
        self.after_build: list[Callable[[Finetuner], None]] = []
        # The memory-aware start: the provider autobatch reads (None: the
        # device's own; tests and benchmarks put a MemoryBudget here), what it
        # chose, the allocator history, and the ladder's way back up.
        self.memory_info: MemoryInfo | None = None
        self.memory_history = MemoryHistory(config.memory_snapshot, self.device)
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._released = False
        self._normalization_range: tuple[float, float] | None = None
        self._normalization_ranges: list[tuple[float, float]] | None = None
        self._start_time = time.perf_counter()
        self._resumed = record.apply_previous_run(
            self.state, self.precision, config, self.metadata.get("run")
        )
        if self._resumed:
            self.state.recovery_log.append(self._resumed)

    @property
    def parts(self) -> TrainingParts:
        """The model as trained, its optimizer and precision (after :meth:`build`)."""
        if self._parts is None:
            raise RuntimeError("the trainer is not built (or was released): call build() first.")
        return self._parts

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The run's AdamW, once built (None before and after :meth:`release`)."""
        return None if self._parts is None else self._parts.optimizer

    @property
    def corrected(self) -> torch.Tensor | None:
        """Indices of the channels the corrections paint, once built."""
        return None if self._parts is None else self._parts.corrected

    # --- set-up (worker thread) ----------------------------------------------------

    @property
    def normalization_range(self) -> tuple[float, float]:
        """(low, high) intensities of this image under the checkpoint's normalisation."""
        if self._normalization_range is None:
            from napari_finetune.data.normalization import intensity_range
            from napari_finetune.model.checkpoint import DEFAULT_NORMALIZATION

            spec = self.metadata.get("normalization") or DEFAULT_NORMALIZATION
            self._normalization_range = intensity_range(self.image, spec)
        return self._normalization_range

    @normalization_range.setter
    def normalization_range(self, low_high: tuple[float, float]) -> None:
        # A run on part of a volume (the tiles a remote worker was sent) takes the range
        # measured on the whole one, so it normalises exactly as the whole volume's run.
        low, high = (float(v) for v in low_high)
        self._normalization_range = (low, high)

    @property
    def normalization_ranges(self) -> list[tuple[float, float]]:
        """(low, high) of each input channel (one pair for a single-channel image)."""
        if self.axes_image.channels == 1:
            return [self.normalization_range]
        if self._normalization_ranges is None:
            from napari_finetune.data.normalization import intensity_ranges
            from napari_finetune.model.checkpoint import DEFAULT_NORMALIZATION

            spec = self.metadata.get("normalization") or DEFAULT_NORMALIZATION
            self._normalization_ranges = intensity_ranges(self.axes_image, spec)
        return self._normalization_ranges

    @normalization_ranges.setter
    def normalization_ranges(self, ranges: list[tuple[float, float]]) -> None:
        # As normalization_range's setter, per channel: a remote worker's tiles of an image
        # with channels take the ranges measured on the whole image.
        pairs = [(float(low), float(high)) for low, high in ranges]
        if len(pairs) != self.axes_image.channels:
            raise ValueError(f"{len(pairs)} normalisation ranges for an image of "
                             f"{self.axes_image.channels} channels; give one per channel.")
        if self.axes_image.channels == 1:
            self.normalization_range = pairs[0]
        else:
            self._normalization_ranges = pairs

    @property
    def out_channels(self) -> int:
        """Output channels of the model, once the patch is checked to fit it.

        Raises ``ModelShapeError`` (one line naming the sizes) when the model
        cannot run on ``config.patch_shape``.
        """
        from napari_finetune.model.geometry import fit_patch

        return fit_patch(self.model, self.config.patch_shape).out_channels

    @property
    def painted_voxels(self) -> int:
        """Painted (non-zero) voxels of the corrections."""
        return int(self._get_sampler().painted_voxels)

    def _get_sampler(self) -> PatchSampler:
        if self.sampler is None:
            from napari_finetune.trainer.build import make_sampler

            self.sampler = make_sampler(
                self.axes_image if not self.axes_image.is_plain else self.image,
                self.corrections,
                self.config,
                self.normalization_ranges if self.axes_image.channels > 1
                else self.normalization_range,
                self.out_channels,
                rank=self.sync.rank,
            )
        return self.sampler

    def build(self) -> None:
        """Sampler, PEFT wrapping, teacher and optimizer; idempotent.

        Called by :meth:`run`; call it yourself to install fault injection on
        the built trainer (or append a callable to ``after_build``).
        """
        if self._parts is not None or self._released:
            return
        from napari_finetune.trainer.build import build_parts, measure_floor

        sampler, state = self._get_sampler(), self.state
        self.model.to(self.device)
        state.batchnorm_floor, floor_line = measure_floor(
            self.model, self.config, self.device, state.samples_per_step, state.batch_size
        )
        if floor_line:
            state.recovery_log.append(floor_line)
        taught = self.starting_channels
        if taught is not None and taught < self.out_channels:
            # A channel added for a new structure starts from a fit on its painting, not
            # from zero (trainer/new_channel.py: why the steps alone are too slow).
            from napari_finetune.trainer.new_channel import fit_new_channels

            fitted = fit_new_channels(self.model, sampler, taught, state.batch_size, self.device)
            if fitted:
                state.recovery_log.append(fitted)
        if self.config.balance_membranes and not state.balance_classes:
            state.balance_groups, line = self._membrane_groups(sampler.classes_present)
            if line:
                state.recovery_log.append(line)
        # Distillation the user chose (the widget's field, the CLI's option) stays.
        if (state.distillation > 0 and self.config.distillation_check
                and "distillation" not in self.config.explicit_settings):
            self._check_agreement(sampler)
        parts, state.teacher = build_parts(
            self.model,
            self.config,
            self.precision,
            sampler.classes_present,
            self.out_channels,
            state.distillation,
            state.hold_other_channels,
            taught=self.starting_channels,
        )
        # Every rank starts from rank 0's weights (LoRA adapters are drawn per process).
        self.sync.align(parts.model)
        self.model, self._parts = parts.model, parts
        for hook in self.after_build:
            hook(self)

    def _membrane_groups(self, painted: Iterable[int]) -> tuple[tuple[int, ...], str]:
        """The balance groups of the painted label values 1 to ``C + 1`` (a boundary
        channel's membranes 1, the rest 0) and the line saying so; ``((), "")`` when the
        painting has no membrane strokes, or nothing else, or the roles cannot be read
        (the objects step says why; here they only weigh strokes)."""
        from napari_finetune.objects import roles_from_metadata

        names = self.channel_names
        try:
            roles = roles_from_metadata(self.metadata, names)
        except ValueError:
            return (), ""
        groups = (0,) + tuple(int(roles[n].role == "boundary") for n in names)
        values = {int(v) for v in painted if 1 <= int(v) <= len(names) + 1}
        membranes = [names[v - 2] for v in sorted(values) if groups[v - 1]]
        if not membranes or all(groups[v - 1] for v in values):
            return (), ""
        return groups, (f"membrane strokes ({', '.join(membranes)}) weigh as much as the "
                        "other strokes together")

    def _check_agreement(self, sampler: PatchSampler) -> None:
        """Distillation off when the starting model gets less than half of the painting
        right (:mod:`napari_finetune.trainer.teacher_agreement`): it would hold the model
        to the errors the painting corrects. Every rank does what any rank found."""
        from napari_finetune.trainer.teacher_agreement import painted_agreement

        agreement = painted_agreement(self.model, sampler, self.device)
        line = agreement.describe()
        if self.sync.any(not agreement.keeps_distillation):
            if agreement.keeps_distillation:
                line += "; another rank's painting does not: distillation off"
            self.state.distillation = 0.0
        self.state.recovery_log.append(line)

    @property
    def starting_channels(self) -> int | None:
        """The channels the starting model had, when the checkpoint got one for a new
        structure since (:mod:`napari_finetune.model.add_channel`); None otherwise.
        The teacher gives those only: the new channel learns from its painting alone."""
        from napari_finetune.model.add_channel import STARTING_CHANNELS_KEY

        value = self.metadata.get(STARTING_CHANNELS_KEY)
        return None if value is None else int(value)

    @property
    def channel_names(self) -> list[str]:
        """The model's output channel names (from the checkpoint, or channel-N)."""
        from napari_finetune.model.checkpoint import channel_names_of

        return channel_names_of(self.metadata, self.out_channels)

    # --- one run assembly for every front end ---------------------------------------

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Checkpoint, image: VolumeArray | AxesImage, corrections: VolumeArray,
        config: FinetuneConfig,
        sync: LocalSync | None = None, fit_patch: bool = True,
    ) -> Finetuner:
        """The run of ``checkpoint``'s model on ``image``: the one assembly of every front end.

        The patch is fitted to the image and to the model's spatial multiple
        (:func:`~napari_finetune.data.patch_shape.fit_patch_shape`), so the
        widget, the CLI and a session train a given image on the same patch.
        Construction stays cheap: the sampler, the optimizer and the teacher
        are made by :meth:`build`, in the thread that runs :meth:`run`.

        Parameters
        ----------
        checkpoint : Checkpoint
            As :func:`napari_finetune.loading.load_checkpoint` returns it (its
            model, metadata and hash go into the run and its record).
        image, corrections : array-like
            The raw volume and its corrections, same spatial shape; an image with
            channels or time points comes as an :class:`~napari_finetune.arrays.AxesImage`
            and its corrections have its axes without ``c``.
        config : FinetuneConfig
            The run's settings; not changed (the fitted patch goes into a copy).
        sync : LocalSync, optional
            Where the run's decisions are agreed (several ranks); this process by default.
        fit_patch : bool
            False keeps ``config.patch_shape`` as given (a patch the user chose).
        """
        if fit_patch:
            config = cls.fitted_config(checkpoint.model, image, config)
        return cls(checkpoint.model, image, corrections, config, metadata=checkpoint.metadata,
                   source_sha256=checkpoint.sha256, sync=sync)

    @staticmethod
    def fitted_config(
        model: torch.nn.Module, image: VolumeArray | AxesImage, config: FinetuneConfig
    ) -> FinetuneConfig:
        """A copy of ``config`` whose patch fits ``image`` and ``model``'s spatial multiple
        (:func:`~napari_finetune.data.patch_shape.fit_patch_shape`), as every front end's
        run trains it, here or on a remote worker."""
        import dataclasses

        from napari_finetune.data.patch_shape import fit_patch_shape
        from napari_finetune.model.geometry import shape_multiple, spatial_multiple

        shape = AxesImage.of(image).spatial_shape
        # A known voxel size shapes the patch per axis (a model pooling z less, fewer z
        # voxels), unless the user set the patch; unknown: as before, one multiple for all.
        reshape = config.voxel_size is not None and "patch_shape" not in config.explicit_settings
        multiple = (spatial_multiple if reshape else shape_multiple)(model, len(shape))
        return dataclasses.replace(config, patch_shape=fit_patch_shape(
            config.patch_shape, shape, multiple, config.voxel_size if reshape else None))

    # --- the run -------------------------------------------------------------------

    def stop(self) -> None:
        """Stop at the next step; the weights of the last completed step are kept."""
        self._stop.set()

    def run(self) -> Generator[Status, None, None]:
        """Train, yielding a :class:`Status` after the probe, every step and every recovery.

        Raises
        ------
        RecoveryError
            Out of memory with nothing left to give up (the message lists what was tried).
        FloatingPointError
            A non-finite loss in fp32 (nothing left to fall back to).
        """
        if self._released:
            raise RuntimeError("this Finetuner was released; build a new one to train again.")
        self._start_time = time.perf_counter()
        recording = self.memory_history.start()  # the history starts before the build
        hidden = collector.hide_existing_objects()  # recovery's collections stay cheap
        try:
            self.build()
            adapters = describe_adapters(self.model)
            if adapters:  # which layers LoRA reaches (the record lists them by name)
                yield self.status("probe", adapters)
            floor = self.batchnorm_floor
            if floor is not None and floor.min_batch > 1:
                yield self.status("recovery", describe_floor(floor, self.config.patch_shape))
            if self._resumed:
                yield self.status("recovery", self._resumed)
            if recording:
                yield self.status("probe", recording)
            yield from self._memory_aware_start()
            total = self.config.steps
            # The feed draws the next steps' samples in a background thread (same
            # sequence as drawing here); it is closed before the run's last event
            # and on any error, so no thread outlives run().
            from napari_finetune.data.prefetch import SampleFeed, stage_for

            self.feed = SampleFeed(
                self._get_sampler(), self.config.prefetch_steps, stage_for(self.device)
            )
            self.validator.start()  # checks are paid for by training time from here
            while self.steps_done < total:
                if self.sync.any(self._stop.is_set()):  # every rank stops at the same step
                    self.feed.close()
                    yield self.status(
                        "stopped", self._with_snapshot(f"stopped after step {self.steps_done} "
                                                       f"of {total}")
                    )
                    return
                images, labels = self.feed.next(self.samples_per_step)
                yield from self.optimizer_step(images, labels)
                # Agreed, so no rank waits for one that stopped (GPU kernels may
                # score the held-out voxels a hair differently per rank).
                if self.sync.any(bool(self.validator.early_stop())):
                    break
            self.feed.close()
            early = self.validator.early_stop()
            if early:
                self.ended = f"{early} after step {self.steps_done}"
            restored = self.validator.restore_best(self.model, self.steps_done)
            if restored:
                self.state.recovery_log.append(restored)
            done = early or f"finished {total} steps"
            yield self.status("finished", self._with_snapshot(
                f"{done}; {restored}" if restored else done
            ))
        finally:
            try:
                if self.feed is not None:
                    self.feed.close()
                self.memory_history.finish()  # a failed run's history is written all the same
            finally:
                collector.show_again(hidden)

    # --- before step 1 ---------------------------------------------------------------

    def _memory_aware_start(self) -> Iterator[Status]:
        """Autobatch when the config (or the device) asks for it, then the precision probe."""
        use = self.config.autobatch_on(self.device.type)
        if use:
            yield self.choose_micro_batch()
        state, precision = self.state, self.precision
        mixed, had_teacher = precision.enabled, state.teacher is not None
        probe = iter_probe(
            state, self.parts, self._get_sampler(), self.memory_history, self.sync
        )
        for kind, message in probe:
            yield self.status(kind, message)
        fell_back = mixed and not precision.enabled
        freed = had_teacher and state.teacher is None
        if use and (fell_back or freed):
            yield self.choose_micro_batch()

    def choose_micro_batch(self, step_samples: Samples | None = None) -> Status:
        """Run autobatch against ``self.memory_info`` (None: the device's own).

        ``step_samples``: the current step's samples, when called mid-run (after
        the teacher was freed, to grow into the memory it gave back).
        """
        from napari_finetune.trainer.autobatch import autobatch

        state = self.state
        decision = autobatch(
            state, self.parts, self._get_sampler(), self.config.memory_fraction, self.memory_info,
            step_samples,
        )
        message = decision.message
        # Several ranks train one micro-batch: the smallest any of them chose.
        agreed = self.sync.smallest(state.batch_size)
        if agreed != state.batch_size:
            state.use_micro_batch(agreed)
            message += f"; micro-batch {agreed} × {state.accumulation}, the smallest of the ranks"
        state.autobatch_decision = decision
        if decision.applied:
            # The measured choice is the top rung: the ladder climbs back to it,
            # never above it to a batch the profile said does not fit.
            state.climb.rungs.clear()
        return self.status("probe", message)

    # --- one optimizer step ---------------------------------------------------------

    def optimizer_step(self, images: np.ndarray, labels: np.ndarray) -> Iterator[Status]:
        """Redo one optimizer step with the same samples until it is applied."""
        state, parts, sync = self.state, self.parts, self.sync
        precision = parts.precision
        step = state.steps_done + 1
        while True:
            failure = None
            with self.lock:
                saved = batchnorm_state(parts.model, parts.batchnorm)
                try:
                    outcome = run_step(
                        parts, state, images, labels, self.config.max_grad_norm, sync
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
                yield from self._step_down(state, failure, step, (images, labels))
                continue
            if outcome.kind == "nonfinite":
                restore_batchnorm(saved)
                if not precision.enabled:
                    precision.resume()
                    raise FloatingPointError(
                        f"the loss of step {step} is {outcome.loss} in fp32: check the image "
                        "normalisation and the learning rate."
                    )
                message = self._bad_mixed_step(step, outcome.loss)
                state.recovery_log.append(message)
                yield self.status("recovery", message)
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
                    precision.fall_back_to_fp32(
                        f"{state.scaler_skips} loss-scale overflows in a row"
                    )
                    message += f"; {state.scaler_skips} skips in a row: fp32 from now on"
                state.recovery_log.append(message)
                yield self.status("recovery", message)
                continue
            sync.align_buffers(parts.model)
            state.scaler_skips = 0
            state.steps_done = step
            state.last_loss = outcome.loss
            state.painted_seen += int(np.count_nonzero(labels))
            message = f"step {step}/{self.config.steps}: loss {outcome.loss:.4f}"
            if precision.paused:
                # The bad step is done, in fp32: the next one is mixed again.
                precision.resume()
                message += f" (redone in fp32; {precision.mixed_words} again from the next step)"
            checked = self.validate_if_due()
            yield self.status("step", f"{message}; {checked}" if checked else message)
            climbed = after_applied_step(state)
            if climbed:
                state.recovery_log.append(climbed)
                yield self.status("recovery", climbed)
            return

    def _bad_mixed_step(self, step: int, loss: float) -> str:
        """A step non-finite under bf16/fp16: redone in fp32, or mixed precision given up.

        Returns the log line. The same on every rank: the ranks agree on the
        outcome of a step before it gets here.
        """
        precision, sync = self.parts.precision, self.sync
        mixed = precision.mixed_words
        what = "loss" if not math.isfinite(loss) else "gradients"
        ranks = f" on all {sync.world_size} ranks" if sync.distributed else ""
        if precision.bad_step(step):
            return (
                f"step {step}: non-finite {what} under {mixed} again "
                f"({len(precision.bad_steps)} such steps, {BAD_STEP_LIMIT} within "
                f"{BAD_STEP_WINDOW} give it up): training in fp32 from now on, redoing the "
                f"step{ranks} (weights unchanged)"
            )
        return (
            f"step {step}: non-finite {what} under {mixed}; redoing this step in fp32"
            f"{ranks} (weights unchanged), {mixed} again from the next step"
        )

    def _step_down(
        self,
        state: RunState,
        failure: str,
        step: int,
        samples: tuple[np.ndarray, np.ndarray],
    ) -> Iterator[Status]:
        """After an out-of-memory (agreed by every rank): one rung down, or a retry."""
        parts = self.parts
        snapshot = self.memory_history.dump_first_oom()
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
        yield self.status("recovery", state.recovery_log[-1])
        if snapshot:
            yield self.status("recovery", snapshot)
        if had_teacher and state.teacher is None and self.config.autobatch_on(
            parts.device.type
        ):
            # The teacher's memory is free: measure again and grow into it.
            status = self.choose_micro_batch(samples)
            state.recovery_log.append(status.message)
            yield self.status("recovery", status.message)

    def _with_snapshot(self, message: str) -> str:
        line = self.memory_history.finish()
        return f"{message}; {line}" if line else message

    # --- reporting -------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Passes over the painted voxels (each painted voxel seen about this often)."""
        if self.sampler is None:
            return 0
        return self.state.painted_seen // max(1, int(self.sampler.painted_voxels))

    def validate_if_due(self) -> str:
        """Score the held-out voxels when a check is due after this step; its log line.

        Called by the step before its Status is yielded, so the step's Status
        carries the new scores and its message says them.
        """
        due = self.validator.due(self.steps_done, self.config.steps)
        if self.sync.distributed:
            # Each rank's clock says its own thing; all check at the same step.
            due = self.sync.any(due)
        if not due:
            return ""
        return self.validator.check(self, self.model, self.steps_done) or ""

    @property
    def validation(self) -> dict[str, float] | None:
        """Per-channel IoU on the held-out painted voxels at the last check."""
        return self.validator.latest

    def status(self, kind: str, message: str) -> Status:
        """Where the run stands now, frozen."""
        state = self.state
        return Status(
            kind=kind,
            dtype=self.precision.dtype_name,
            grad_scaler=self.precision.grad_scaler,
            batch_size=state.batch_size,
            accumulation=state.accumulation,
            distillation=state.distillation_switch,
            hold_other_channels=state.hold_switch,
            step=state.steps_done,
            total_steps=self.config.steps,
            epoch=self.epoch,
            loss=state.last_loss,
            message=message,
            distillation_weight=float(state.distillation),
            dropped_at_step=state.dropped_at_step,
            elapsed_s=time.perf_counter() - self._start_time,
            samples_per_step=state.samples_per_step,
            validation=self.validator.latest,
        )

    def release(self) -> None:
        """Free what only training needs: optimizer state, the teacher, the device cache.

        The weights stay where they are, for :meth:`predict` and :meth:`export`;
        a released trainer cannot run again (build a new one to continue).
        """
        from napari_finetune.devices import empty_device_cache

        with self.lock:
            self._parts = None
            self.state.teacher = None
            self._released = True
        empty_device_cache(self.device)

    # --- using the weights -------------------------------------------------------------

    def predict(self, region: tuple[slice, ...] | npt.ArrayLike) -> np.ndarray:
        """Sigmoid probabilities ``(C, *spatial)`` with the current weights.

        Parameters
        ----------
        region : tuple of slice or array-like
            Slices into this trainer's image, or a raw (not yet normalised)
            block of it; it is normalised like the training patches.
        """
        from napari_finetune.data.normalization import normalize
        from napari_finetune.predict import predict_block

        if not self.axes_image.is_plain:
            return self._predict_channels(region)
        if isinstance(region, tuple) and all(isinstance(r, slice) for r in region):
            # Through the run's in-memory region when it holds this one (live previews
            # of the painted area then never touch the store).
            sampler = self.sampler
            region = self.image[region] if sampler is None else sampler.read_image(region)
        block = normalize(np.asarray(region), *self.normalization_range)
        with self.lock:
            return predict_block(self.model, block, device=str(self.device))

    def _predict_channels(self, region: tuple[slice, ...] | npt.ArrayLike) -> np.ndarray:
        """:meth:`predict` of an image with channels or time points: ``region`` indexes
        its painting (a time axis first, one time point), or is a raw ``(C, *spatial)``."""
        from napari_finetune.data.normalization import normalize_channels
        from napari_finetune.predict.volume import predict_batch

        if isinstance(region, tuple) and all(isinstance(r, slice) for r in region):
            if len(region) != len(self.axes_image.labels_shape):
                raise ValueError(
                    f"a region of this image has {len(self.axes_image.labels_shape)} slices "
                    f"(axes {self.axes_image.labels_axes.upper()}: a time point first), "
                    f"not {len(region)}"
                )
            raw = self.axes_image.read(region)
        else:
            raw = np.asarray(region)
            raw = raw if raw.ndim == len(self.axes_image.spatial_shape) + 1 else raw[None]
        block = normalize_channels(raw, self.normalization_ranges)
        with self.lock:
            return predict_batch(self.model, block[None], str(self.device), channels=True)[0]

    def export(
        self, path: str | os.PathLike, ended: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> os.PathLike:
        """Write the updated checkpoint (adapters merged, run record) atomically.

        Parameters
        ----------
        path : path-like
            Destination file.
        ended : str, optional
            How the run ended, for the record's ``"ended"`` (e.g. ``"out of memory at
            step 9: ..."``); default ``"finished"`` when every step ran, else
            ``"stopped after step N"``.
        metadata : mapping, optional
            Entries that replace the checkpoint's in the file (e.g. the instance
            roles set in the widget); plain types only. The run's own metadata
            is not changed.
        """
        with self.lock:
            return record.export_checkpoint(self, path, ended, metadata)


__all__ = ["MAX_SCALER_SKIPS", "Finetuner"]
