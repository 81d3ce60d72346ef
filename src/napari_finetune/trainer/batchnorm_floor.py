"""The smallest micro-batch a model's BatchNorm layers can train at, found before step 1.

BatchNorm in training mode needs more than one value per channel: the
micro-batch times the spatial size its input has at that layer. A UNet whose
bottleneck is 1x1x1 at the run's patch therefore cannot train at batch 1,
and torch says so only in the middle of a run ("Expected more than 1 value
per channel when training"), for instance after the out-of-memory ladder
halved the batch to 1. One forward pass at the patch, with hooks on the
BatchNorm layers, measures the values per channel each layer sees per sample;
the ladder then never steps below the batch they need, and a configuration
that cannot work at all is refused with the patch size that would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from napari_finetune.errors import first_line
from napari_finetune.trainer.micro_batches import split_sizes
from napari_finetune.trainer.state import BATCHNORM_TYPES


class _FoundNarrowest(Exception):
    """Raised by the hook to end the measuring pass at a 1-value layer."""


@dataclass(frozen=True)
class BatchNormFloor:
    """What the narrowest BatchNorm layer of a model sees at a patch.

    Attributes
    ----------
    layer : str
        Its name in the model (``named_modules``).
    values_per_sample : int
        Values per channel one sample gives it (its input's spatial size).
    min_batch : int
        Smallest micro-batch with more than one value per channel.
    """

    layer: str
    values_per_sample: int
    min_batch: int


def batchnorm_floor(
    model: torch.nn.Module, patch_shape: Sequence[int], device: torch.device | str = "cpu"
) -> BatchNormFloor | None:
    """Measure the narrowest BatchNorm layer at ``patch_shape`` (None: no BatchNorm).

    One no-grad forward of a single zero patch in eval mode, so running
    statistics, gradients and the RNG are untouched; the model's mode is
    restored afterwards.

    Raises
    ------
    ValueError
        The model cannot run on the patch at all (a pooling that leaves
        nothing, for instance); the message names the patch.
    """
    # Keyed by Module: the hooks below receive their module as one.
    names: dict[torch.nn.Module, str] = {
        module: name
        for name, module in model.named_modules()
        if isinstance(module, BATCHNORM_TYPES)
    }
    if not names:
        return None
    seen: dict[str, int] = {}

    def record(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        values = args[0][0, 0].numel()
        seen[names[module]] = min(seen.get(names[module], values), values)
        if values <= 1:  # the narrowest possible: no need to run the rest
            raise _FoundNarrowest

    handles = [module.register_forward_pre_hook(record) for module in names]
    was_training = model.training
    try:
        model.eval()
        from napari_finetune.devices import model_in_channels

        x = torch.zeros((1, model_in_channels(model), *patch_shape), device=device)
        with torch.no_grad():
            model(x)
    except _FoundNarrowest:
        pass
    except RuntimeError as exc:
        shape = "x".join(str(s) for s in patch_shape)
        first = first_line(exc)
        raise ValueError(
            f"the model cannot run on patches of {shape} ({first}); use a larger --patch-shape."
        ) from None
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    layer = min(seen, key=seen.__getitem__)
    values = seen[layer]
    return BatchNormFloor(layer=layer, values_per_sample=values, min_batch=1 if values > 1 else 2)


def describe_floor(floor: BatchNormFloor, patch_shape: Sequence[int]) -> str:
    """The log line for a floor above batch 1."""
    shape = "x".join(str(s) for s in patch_shape)
    return (
        f"BatchNorm layer {floor.layer} sees {floor.values_per_sample} value per channel "
        f"per sample at patches of {shape}: the micro-batch stays at {floor.min_batch} "
        "or more (a larger --patch-shape lifts this)"
    )


def refuse_batch(floor: BatchNormFloor, patch_shape: Sequence[int], samples: int) -> str:
    """The error for a run whose samples per step are below the floor."""
    shape = "x".join(str(s) for s in patch_shape)
    larger = " ".join(str(2 * s) for s in patch_shape)
    return (
        f"BatchNorm layer {floor.layer} needs more than 1 value per channel, but at patches "
        f"of {shape} one sample gives it {floor.values_per_sample}: use --batch-size "
        f"{floor.min_batch} or more (now {samples} per step), or a larger patch such as "
        f"--patch-shape {larger}."
    )


def split_respects(floor: BatchNormFloor | None, samples: int, batch_size: int) -> bool:
    """Whether cutting ``samples`` into micro-batches of ``batch_size`` keeps every one
    at or above the floor (an odd step of 3 at batch 2 is cut 2 + 1)."""

    if floor is None or floor.min_batch <= 1:
        return True
    return min(split_sizes(samples, batch_size)) >= floor.min_batch
