"""What a run needs before step 1, built in the worker thread.

Construction of a :class:`~napari_finetune.trainer.loop.Finetuner` stays cheap
(the widget does it on the Qt main thread); the patch sampler, the BatchNorm
floor, PEFT's adapters, the teacher and the optimizer (the first AdamW costs
~1.6 s of lazy imports) are built here, when the run starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import torch

from napari_finetune.arrays import AxesImage, VolumeArray
from napari_finetune.config import FinetuneConfig
from napari_finetune.data.sampling import PatchSampler
from napari_finetune.trainer.batchnorm_floor import (
    BatchNormFloor,
    batchnorm_floor,
    describe_floor,
    refuse_batch,
    split_respects,
)
from napari_finetune.trainer.losses import corrected_channels, needs_teacher
from napari_finetune.trainer.precision import Precision
from napari_finetune.trainer.run_state import TrainingParts
from napari_finetune.trainer.state import batchnorm_modules

if TYPE_CHECKING:
    from napari_finetune.trainer.teacher import Teacher


def make_sampler(
    image: VolumeArray | AxesImage,
    corrections: VolumeArray,
    config: FinetuneConfig,
    normalization_range: tuple[float, float] | list[tuple[float, float]],
    out_channels: int,
    rank: int = 0,
) -> PatchSampler:
    """The run's patch sampler: anchors, held-out strokes, the in-memory region.

    Each rank of a multi-process run draws its own patches (seed + rank); the
    held-out regions, chosen with the config's seed, are the same on every rank.
    """
    sampler = PatchSampler(
        image,
        corrections,
        config.patch_shape,
        normalization_range,
        seed=config.seed,
        max_label=out_channels + 1,
        cache_bytes=int(config.sample_cache_gib * 2**30),
        holdout_fraction=config.validation_fraction,
    )
    if rank:
        sampler.rng = np.random.default_rng(config.seed + rank)
    return sampler


def measure_floor(
    model: torch.nn.Module,
    config: FinetuneConfig,
    device: torch.device,
    samples_per_step: int,
    batch_size: int,
) -> tuple[BatchNormFloor | None, str]:
    """The BatchNorm floor and its log line ("" when batch 1 trains).

    Raises
    ------
    ValueError
        The run's micro-batches cannot all stay above the floor (one line with a
        batch and a patch size that work).
    """
    patch = tuple(config.patch_shape)
    floor = batchnorm_floor(model, patch, device)
    if floor is None or floor.min_batch <= 1:
        return floor, ""
    if not split_respects(floor, samples_per_step, batch_size):
        raise ValueError(refuse_batch(floor, patch, samples_per_step))
    return floor, describe_floor(floor, patch)


class AdamWKernel(TypedDict, total=False):
    """The keyword that picks AdamW's kernel (none: torch's default)."""

    fused: bool


def adamw_implementation(device: torch.device, params: Sequence[torch.Tensor]) -> AdamWKernel:
    """AdamW's ``fused`` kernel on CUDA, torch's default elsewhere.

    The fused kernel updates every weight and both moments in one launch and
    allocates nothing once the moments exist, so from the second step on an
    optimizer step cannot run out of memory half-way and needs no copy of the
    weights to undo (``step.step_can_allocate``). The default (foreach) path
    allocates temporaries after it has begun to update, so it keeps the copy.
    """
    floating = all(p.is_floating_point() for p in params)
    if device.type == "cuda" and floating:
        return AdamWKernel(fused=True)
    return AdamWKernel()


def build_parts(
    model: torch.nn.Module,
    config: FinetuneConfig,
    precision: Precision,
    classes_present: list[int],
    out_channels: int,
    distillation: float,
    hold_other_channels: bool,
    taught: int | None = None,
) -> tuple[TrainingParts, Teacher | None]:
    """Wrap LoRA adapters (or keep a frozen copy), make the teacher and the optimizer.

    ``taught``: the channels the starting model had, when the model got one for a new
    structure since (the teacher gives those only); None: every channel. When the
    channels from ``taught`` on have weights of their own
    (:func:`~napari_finetune.model.add_channel.added_parameters`), only those train,
    in either mode: the old channels' outputs stay the starting model's bit for bit
    (with any normalisation: the old layers' BatchNorms are held in eval mode, so
    training-mode forwards do not move their running statistics).
    """
    from napari_finetune.model.add_channel import added_parameters
    from napari_finetune.trainer.teacher import AdapterOffTeacher, FrozenCopyTeacher

    own = added_parameters(model, taught) if taught is not None else None

    corrected = corrected_channels(classes_present, out_channels)
    want_teacher = needs_teacher(corrected, distillation, hold_other_channels, taught)
    teacher: Teacher | None
    if config.mode == "lora":
        from napari_finetune.model.lora import wrap_lora

        model = wrap_lora(model, config.lora_rank, config.lora_alpha, config.seed)
        teacher = AdapterOffTeacher(model, taught) if want_teacher else None
    else:
        teacher = FrozenCopyTeacher(model, taught) if want_teacher else None
    if own is not None:
        _train_only(model, own)
    model.train()
    if own is not None:
        _hold_batchnorm(model, own)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params,
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        **adamw_implementation(precision.device, params),
    )
    parts = TrainingParts(model, optimizer, precision, corrected, batchnorm_modules(model))
    return parts, teacher


def _hold_batchnorm(model: torch.nn.Module, modules: list[str]) -> None:
    """Put every BatchNorm outside ``modules`` in eval mode.

    Frozen weights are not enough: a BatchNorm in training mode updates its running
    statistics on every forward, and the old channels' eval-mode outputs read those,
    so they would drift from the starting model's although no weight of theirs
    trains. In eval mode the old layers normalise with their own statistics, as the
    starting model does. :func:`napari_finetune.model.modes.evaluating` puts the flags
    back per module, so a prediction during the run does not wake them.
    """
    from napari_finetune.trainer.state import BATCHNORM_TYPES

    prefixes = tuple(f"{name}." for name in modules)
    for name, module in model.named_modules():
        held = not any(name.startswith(p) or f".{p}" in name for p in prefixes)
        if held and isinstance(module, BATCHNORM_TYPES):
            module.eval()


def _train_only(model: torch.nn.Module, modules: list[str]) -> None:
    """Let only the parameters under ``modules`` (names in the plain model) train.

    Matched as a part of the parameter's name, so the names hold inside PEFT's
    wrapper too (``base_model.model.added.0.block.0.base_layer.weight``). A LoRA
    adapter elsewhere keeps its zero ``B`` and so adds exactly 0 to its layer.
    """
    prefixes = tuple(f"{name}." for name in modules)
    for name, param in model.named_parameters():
        own = any(name.startswith(p) or f".{p}" in name for p in prefixes)
        param.requires_grad_(own)
