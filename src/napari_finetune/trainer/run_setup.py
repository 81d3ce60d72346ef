"""A fine-tuning run's set-up: its inputs, its state, and what is built before step 1.

:class:`RunSetup` is the first half of :class:`~napari_finetune.trainer.loop.Finetuner`:
construction (cheap, so the widget can do it on the Qt main thread), the
:class:`~napari_finetune.trainer.run_state.RunState` and its read-only views,
and :meth:`RunSetup.build` (sampler, PEFT wrapping, teacher, optimizer), which
the run calls in the worker thread. The loop, its events and the use of the
weights are in :mod:`~napari_finetune.trainer.loop`.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from napari_finetune.config import FinetuneConfig
from napari_finetune.trainer import record
from napari_finetune.trainer.memory_info import MemoryInfo
from napari_finetune.trainer.precision import Precision
from napari_finetune.trainer.run_state import FromState, HasState, RunState, TrainingParts
from napari_finetune.trainer.snapshot import MemoryHistory
from napari_finetune.trainer.sync import LocalSync
from napari_finetune.trainer.validation import Validator

if TYPE_CHECKING:
    from collections.abc import Callable

    from napari_finetune.data.prefetch import SampleFeed
    from napari_finetune.data.sampling import PatchSampler
    from napari_finetune.trainer.autobatch import AutobatchDecision
    from napari_finetune.trainer.batchnorm_floor import BatchNormFloor
    from napari_finetune.trainer.ladder import Climb
    from napari_finetune.trainer.teacher import Teacher


class RunSetup(HasState):
    """The inputs, state and built parts of a fine-tuning run (see :class:`Finetuner`).

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
        image: Any,
        corrections: Any,
        config: FinetuneConfig,
        metadata: dict[str, Any] | None = None,
        source_sha256: str | None = None,
        sync: LocalSync | None = None,
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
        self.sync = sync or LocalSync()
        self.state = RunState.from_config(config)
        self._parts: TrainingParts | None = None  # made by build()
        self.sampler: PatchSampler | None = None
        self.feed: SampleFeed | None = None  # its wait_s says how long steps waited
        self._rescored_at: int | None = None  # step of the last anchor re-score
        self.ended: str | None = None  # how the run ended, when not by finishing or stop()
        self.validator = Validator(
            config.validation_every, config.early_stop_checks, config.keep_best
        )
        self.after_build: list[Callable[[RunSetup], None]] = []
        # The memory-aware start: the provider autobatch reads (None: the
        # device's own; tests and benchmarks put a MemoryBudget here), what it
        # chose, the allocator history, and the ladder's way back up.
        self.memory_info: MemoryInfo | None = None
        self.memory_history = MemoryHistory(config.memory_snapshot, self.device)
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._released = False
        self._normalization_range: tuple[float, float] | None = None
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
                self.image,
                self.corrections,
                self.config,
                self.normalization_range,
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
        parts, state.teacher = build_parts(
            self.model,
            self.config,
            self.precision,
            sampler.classes_present,
            self.out_channels,
            state.distillation,
            state.hold_other_channels,
        )
        # Every rank starts from rank 0's weights (LoRA adapters are drawn per process).
        self.sync.align(parts.model)
        self.model, self._parts = parts.model, parts
        for hook in self.after_build:
            hook(self)

    @property
    def channel_names(self) -> list[str]:
        """The model's output channel names (from the checkpoint, or channel-N)."""
        from napari_finetune.model.checkpoint import channel_names_of

        return channel_names_of(self.metadata, self.out_channels)

