"""The fine-tuning loop as a generator of :class:`Status` events.

Construction is cheap on purpose (the widget builds a :class:`Finetuner` on the
Qt main thread): the patch sampler, the optimizer (the first AdamW costs ~1.6 s
of lazy imports), the PEFT wrapping and the teacher are built by
:meth:`Finetuner.build` (:mod:`~napari_finetune.trainer.run_setup`), which
:meth:`Finetuner.run` calls in the worker thread.

An optimizer step draws its samples once; if it runs out of memory anywhere
(student forward, teacher forward, backward, optimizer step) the loop leaves
the ``except`` block, undoes the failed attempt (BatchNorm statistics, stale
gradients, the scaler's half-done step), steps down the ladder
(:func:`~napari_finetune.trainer.oom_recovery.recover_from_oom`) and redoes the same
step with the same samples cut smaller. A step is never skipped or applied
twice, and the step counter only moves when the optimizer stepped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from napari_finetune.model.lora import describe_adapters
from napari_finetune.trainer import collector, record
from napari_finetune.trainer.batchnorm_floor import describe_floor
from napari_finetune.trainer.retry import optimizer_step
from napari_finetune.trainer.run_setup import RunSetup
from napari_finetune.trainer.start import memory_aware_start
from napari_finetune.trainer.status import Status

if TYPE_CHECKING:
    pass


class Finetuner(RunSetup):
    """Fine-tunes ``model`` on painted corrections of ``image``.

    The parameters, attributes and :meth:`build` are :class:`RunSetup`'s.
    """

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
            yield from memory_aware_start(self)
            total = self.config.steps
            # The feed draws the next steps' samples in a background thread (same
            # sequence as drawing here); it is closed before the run's last event
            # and on any error, so no thread outlives run().
            from napari_finetune.data.prefetch import SampleFeed, stage_for

            self.feed = SampleFeed(
                self.sampler, self.config.prefetch_steps, stage_for(self.device)
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
                self._rescore_anchors()
                images, labels = self.feed.next(self.samples_per_step)
                yield from optimizer_step(self, images, labels)
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

    def _rescore_anchors(self) -> None:
        """Every ``hard_anchor_every`` steps, weight the anchors by the model's errors.

        The feed is closed first: the steps it drew ahead are given back, so
        the new weights apply from the same draw with or without prefetch.
        """
        every = self.config.hard_anchor_every
        step = self.steps_done
        if not every or step % every or step == self._rescored_at:
            return
        from napari_finetune.trainer.hard_anchors import rescore

        if self.feed is not None:
            self.feed.close()
        rescore(self)
        self._rescored_at = step

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
        with self.lock:
            return predict_block(self.model, block, device=str(self.device))

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


__all__ = ["Finetuner"]
