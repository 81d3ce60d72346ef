"""The fine-tuning loop as a generator of :class:`Status` events.

Construction is cheap on purpose (the widget builds a :class:`Finetuner` on the
Qt main thread): the patch sampler, the optimizer (the first AdamW costs ~1.6 s
of lazy imports), the PEFT wrapping and the teacher are built by
:meth:`Finetuner.build`, which :meth:`Finetuner.run` calls in the worker thread.

An optimizer step draws its samples once; if it runs out of memory anywhere
(student forward, teacher forward, backward, optimizer step) the loop leaves
the ``except`` block, undoes the failed attempt (BatchNorm statistics, stale
gradients, the scaler's half-done step), steps down the ladder
(:func:`~napari_finetune.trainer.recovery.survive_oom`) and redoes the same
step with the same samples cut smaller. A step is never skipped or applied
twice, and the step counter only moves when the optimizer stepped.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from napari_finetune.config import FinetuneConfig
from napari_finetune.model.lora import describe_adapters
from napari_finetune.trainer import record
from napari_finetune.trainer.autobatch import AutobatchDecision
from napari_finetune.trainer.batchnorm_floor import (
    BatchNormFloor,
    describe_floor,
)
from napari_finetune.trainer.ladder import Climb
from napari_finetune.trainer.memory_info import MemoryInfo
from napari_finetune.trainer.recovery import Precision
from napari_finetune.trainer.retry import optimizer_step
from napari_finetune.trainer.snapshot import MemoryHistory
from napari_finetune.trainer.start import memory_aware_start
from napari_finetune.trainer.status import Status, switch_state
from napari_finetune.trainer.validation import Validator


class Finetuner:
    """Fine-tunes ``model`` on painted corrections of ``image``.

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
    """

    def __init__(
        self,
        model: torch.nn.Module,
        image: Any,
        corrections: Any,
        config: FinetuneConfig,
        metadata: dict[str, Any] | None = None,
        source_sha256: str | None = None,
    ) -> None:
        from napari_finetune.devices import check_model_fits_image, resolve_device

        check_model_fits_image(model, tuple(np.shape(image)))
        self.model = model
        self.image = image
        self.corrections = corrections
        self.config = config
        self.metadata = dict(metadata or {})
        self.source_sha256 = source_sha256
        self.device = torch.device(resolve_device(config.device))
        self.precision = Precision(self.device, config.mixed_precision, config.cpu_bf16)
        self.batch_size = config.batch_size
        self.accumulation = config.accumulation
        self.samples_per_step = config.samples_per_step
        self.distillation = float(config.distillation)
        self.hold_other_channels = bool(config.hold_other_channels)
        self.teacher: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.sampler: Any = None
        self.feed: Any = None  # the run's SampleFeed (its wait_s says how long steps waited)
        self.corrected: torch.Tensor | None = None
        self.steps_done = 0
        self.last_loss: float | None = None
        self.dropped_at_step: int | None = None
        self.recovery_log: list[str] = []
        self.scaler_skips = 0
        self.ended: str | None = None  # how the run ended, when not by finishing or stop()
        self.batchnorm_floor: BatchNormFloor | None = None  # measured by build()
        self.validator = Validator(
            config.validation_every, config.early_stop_checks, config.keep_best
        )
        self.after_build: list[Callable[[Finetuner], None]] = []
        # The memory-aware start: the provider autobatch reads (None: the
        # device's own; tests and benchmarks put a MemoryBudget here), what it
        # chose, the allocator history, and the ladder's way back up.
        self.memory_info: MemoryInfo | None = None
        self.autobatch_decision: AutobatchDecision | None = None
        self.memory_history = MemoryHistory(config.memory_snapshot, self.device)
        self.climb = Climb()
        self._painted_seen = 0
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._built = False
        self._released = False
        self._normalization_range: tuple[float, float] | None = None
        self._start_time = time.perf_counter()
        self._resumed = record.apply_previous_run(self, self.metadata.get("run"))
        if self._resumed:
            self.recovery_log.append(self._resumed)

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

    def _get_sampler(self) -> Any:
        if self.sampler is None:
            from napari_finetune.trainer.build import make_sampler

            self.sampler = make_sampler(
                self.image,
                self.corrections,
                self.config,
                self.normalization_range,
                self.out_channels,
            )
        return self.sampler

    def build(self) -> None:
        """Sampler, PEFT wrapping, teacher and optimizer; idempotent.

        Called by :meth:`run`; call it yourself to install fault injection on
        the built trainer (or append a callable to ``after_build``).
        """
        if self._built:
            return
        from napari_finetune.trainer.build import build_parts, measure_floor

        sampler = self._get_sampler()
        self.model.to(self.device)
        self.batchnorm_floor, floor_line = measure_floor(
            self.model, self.config, self.device, self.samples_per_step, self.batch_size
        )
        if floor_line:
            self.recovery_log.append(floor_line)
        parts = build_parts(
            self.model,
            self.config,
            sampler.classes_present,
            self.out_channels,
            self.distillation,
            self.hold_other_channels,
        )
        self.model, self.teacher, self.optimizer = parts.model, parts.teacher, parts.optimizer
        self.corrected, self._bn_modules = parts.corrected, parts.batchnorm
        self._built = True
        for hook in self.after_build:
            hook(self)

    # --- the run -------------------------------------------------------------------

    def stop(self) -> None:
        """Stop at the next step; the weights of the last completed step are kept."""
        self._stop.set()

    def run(self) -> Iterator[Status]:
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
            yield from memory_aware_start(self)
            total = self.config.steps
            # The feed draws the next steps' samples in a background thread (same
            # sequence as drawing here); it is closed before the run's last event
            # and on any error, so no thread outlives run().
            from napari_finetune.data.prefetch import SampleFeed, stage_for

            self.feed = SampleFeed(
                self.sampler, self.config.prefetch_steps, stage_for(self.device)
            )
            while self.steps_done < total:
                if self._stop.is_set():
                    self.feed.close()
                    yield self.status(
                        "stopped", self._with_snapshot(f"stopped after step {self.steps_done} "
                                                       f"of {total}")
                    )
                    return
                images, labels = self.feed.next(self.samples_per_step)
                yield from optimizer_step(self, images, labels)
                if self.validator.early_stop():
                    break
            self.feed.close()
            early = self.validator.early_stop()
            if early:
                self.ended = f"{early} after step {self.steps_done}"
            restored = self.validator.restore_best(self.model, self.steps_done)
            if restored:
                self.recovery_log.append(restored)
            done = early or f"finished {total} steps"
            yield self.status("finished", self._with_snapshot(
                f"{done}; {restored}" if restored else done
            ))
        finally:
            if self.feed is not None:
                self.feed.close()
            self.memory_history.finish()  # a failed run's history is written all the same

    def _with_snapshot(self, message: str) -> str:
        line = self.memory_history.finish()
        return f"{message}; {line}" if line else message

    # --- reporting -------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Passes over the painted voxels (each painted voxel seen about this often)."""
        if self.sampler is None:
            return 0
        return self._painted_seen // max(1, int(self.sampler.painted_voxels))

    def validate_if_due(self) -> str:
        """Score the held-out voxels when a check is due after this step; its log line.

        Called by the step before its Status is yielded, so the step's Status
        carries the new scores and its message says them.
        """
        if not self.validator.due(self.steps_done, self.config.steps):
            return ""
        return self.validator.check(self, self.model, self.steps_done) or ""

    @property
    def channel_names(self) -> list[str]:
        """The model's output channel names (from the checkpoint, or channel-N)."""
        from napari_finetune.model.checkpoint import channel_names_of

        return channel_names_of(self.metadata, self.out_channels)

    @property
    def validation(self) -> dict[str, float] | None:
        """Per-channel IoU on the held-out painted voxels at the last check."""
        return self.validator.latest

    def status(self, kind: str, message: str) -> Status:
        """Where the run stands now, frozen."""
        dropped = self.dropped_at_step is not None
        return Status(
            kind=kind,
            dtype=self.precision.dtype_name,
            grad_scaler=self.precision.grad_scaler,
            batch_size=self.batch_size,
            accumulation=self.accumulation,
            distillation=switch_state(
                self.config.distillation > 0, self.distillation > 0, dropped
            ),
            hold_other_channels=switch_state(
                self.config.hold_other_channels, self.hold_other_channels, dropped
            ),
            step=self.steps_done,
            total_steps=self.config.steps,
            epoch=self.epoch,
            loss=self.last_loss,
            message=message,
            distillation_weight=float(self.distillation),
            dropped_at_step=self.dropped_at_step,
            elapsed_s=time.perf_counter() - self._start_time,
            samples_per_step=self.samples_per_step,
            validation=self.validator.latest,
        )

    def release(self) -> None:
        """Free what only training needs: optimizer state, the teacher, the device cache.

        The weights stay where they are, for :meth:`predict` and :meth:`export`;
        a released trainer cannot run again (build a new one to continue).
        """
        from napari_finetune.devices import empty_device_cache

        with self._lock:
            self.optimizer = None
            self.teacher = None
            self._released = True
        empty_device_cache(self.device)

    # --- using the weights -------------------------------------------------------------

    def predict(self, region: Any) -> np.ndarray:
        """Sigmoid probabilities ``(C, *spatial)`` with the current weights.

        Parameters
        ----------
        region : tuple of slice or array-like
            Slices into this trainer's image, or a raw (not yet normalised)
            block of it; it is normalised like the training patches.
        """
        from napari_finetune.data.normalization import normalize
        from napari_finetune.predict import predict_block

        if isinstance(region, tuple) and all(isinstance(r, slice) for r in region):
            # Through the run's in-memory region when it holds this one (live previews
            # of the painted area then never touch the store).
            sampler = self.sampler
            region = self.image[region] if sampler is None else sampler.read_image(region)
        block = normalize(np.asarray(region), *self.normalization_range)
        with self._lock:
            return predict_block(self.model, block, device=str(self.device))

    def export(self, path: str | os.PathLike, ended: str | None = None) -> os.PathLike:
        """Write the updated checkpoint (adapters merged, run record) atomically.

        Parameters
        ----------
        path : path-like
            Destination file.
        ended : str, optional
            How the run ended, for the record's ``"ended"`` (e.g. ``"out of memory at
            step 9: ..."``); default ``"finished"`` when every step ran, else
            ``"stopped after step N"``.
        """
        with self._lock:
            return record.export_checkpoint(self, path, ended)


__all__ = ["Finetuner"]
