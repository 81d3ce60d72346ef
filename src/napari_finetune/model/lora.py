"""LoRA adapters through PEFT: which layers, wrapping, merging for export.

Every convolution of the network is adapted (groups = 1): 2D and 3D, with any
kernel, the transposed convolutions of a decoder (MONAI UNet's) and the
pointwise output heads. PEFT adapts the layers it merges correctly; the others
(transposed convolutions, which PEFT 0.21 has no LoRA for, and pointwise Conv3d,
which it merges wrongly: huggingface/peft #3768) get
:class:`~napari_finetune.model.lora_layers.ConvLora`, which PEFT's
``disable_adapter()`` and ``merge_and_unload()`` handle like its own layers.

The normalisation layers (GroupNorm, BatchNorm, InstanceNorm, LayerNorm with
affine parameters) train in full, as PEFT ``modules_to_save``: their scale and
shift are where a new microscope's contrast and blur are cheapest to undo, they
hold a few hundred numbers, and PEFT keeps the originals beside the trained
copies, so ``disable_adapter()`` (the LoRA teacher) still runs the starting
model and BatchNorm running statistics of the base model are never touched.
Adapted layers get a LoRA bias, zero at the start and merged into their bias:
PEFT's ``lora_bias`` when every layer PEFT adapts has a bias (it cannot merge
one into a layer without), ours wherever the layer has one.

PEFT is imported only inside :func:`wrap_lora` (``import peft`` takes seconds
and pulls in transformers).
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from typing import TYPE_CHECKING, TypeGuard

import torch
from torch import nn

if TYPE_CHECKING:  # for the type only: importing peft takes seconds
    from peft import PeftModel

_ADAPTABLE = (nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_NORMS = (
    nn.GroupNorm, nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
)


def lora_targets(model: nn.Module) -> list[str]:
    """Qualified names of the convolutions LoRA adapts (every one with groups = 1)."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, _ADAPTABLE) and module.groups == 1
    ]


def trained_norms(model: nn.Module) -> list[str]:
    """Qualified names of the normalisation layers a LoRA run trains in full.

    Every GroupNorm, LayerNorm, BatchNorm and InstanceNorm with parameters
    (affine); the others have nothing to train.
    """
    names = [
        name
        for name, module in model.named_modules()
        if isinstance(module, _NORMS) and any(True for _ in module.parameters(recurse=False))
    ]
    # PEFT finds modules_to_save by the end of their names: leave out a norm
    # whose name also ends another module's name ("1" ends "encoders.1").
    chosen = set(names)
    others = [name for name, _ in model.named_modules() if name not in chosen]
    return [name for name in names if not any(other.endswith(name) for other in others)]


def adapter_overhead(model: nn.Module, rank: int) -> float:
    """Weights LoRA of ``rank`` adds, as a share of the weights of the layers it adapts.

    A convolution's adapter ``A`` has ``in * rank * kernel`` weights against the
    layer's ``in * out * kernel``, and costs the same share of the layer's work,
    so this is also about what adapters add to a step (``B`` is pointwise).
    """
    modules = dict(model.named_modules())
    added = adapted = 0
    for name in lora_targets(model):
        layer = modules[name]
        weight = layer.weight
        kernel = weight[0, 0].numel()
        in_channels = layer.in_channels // layer.groups
        added += in_channels * rank * kernel + rank * layer.out_channels
        adapted += weight.numel()
    return added / adapted if adapted else 0.0


def lora_advice(model: nn.Module, rank: int) -> str:
    """One line to show when the user picks LoRA for ``model`` ("" when LoRA suits it).

    On a narrow network (sample UNet: 8 features in the first level) rank-``rank``
    adapters are not small next to the layers they adapt: a LoRA step is no
    cheaper than a full fine-tune's, so in a fixed time LoRA trains fewer steps.
    """
    return advice_for_share(adapter_overhead(model, rank), rank)


def advice_for_share(share: float, rank: int) -> str:
    """:func:`lora_advice` from :func:`adapter_overhead`'s ``share`` at ``rank``.

    The share grows linearly with the rank, so a caller that knows the share at
    rank 1 (the widget, which reads the model once in a worker) follows the rank
    box without touching the model.
    """
    if share < 0.2:
        return ""
    return (
        f"LoRA rank {rank} adds {100 * share:.0f}% to the weights it adapts on this small "
        "network, so its steps are slower than a full fine-tune's; pick Full unless "
        "memory is short."
    )


def is_lora(model: nn.Module) -> TypeGuard[PeftModel]:
    """Whether ``model`` is a PEFT model (checked without importing peft)."""
    return type(model).__module__.startswith("peft") and hasattr(model, "merge_and_unload")


def wrap_lora(model: nn.Module, rank: int, alpha: float, seed: int = 0) -> PeftModel:
    """Wrap ``model`` in LoRA adapters; only they and the normalisation layers train.

    Parameters
    ----------
    model : torch.nn.Module
        Modified in place by PEFT (its layers are replaced by LoRA layers).
    rank, alpha : int, float
        LoRA rank and scaling numerator (scale = alpha / rank).
    seed : int
        Seeds the adapters' initialisation without touching the global RNG.

    Raises
    ------
    ValueError
        When the model has no convolution PEFT adapts (a Conv2d, or a Conv3d whose
        kernel is larger than 1 on its first two axes).
    """
    from peft import LoraConfig, get_peft_model  # slow import: only here

    from napari_finetune.model.lora_layers import needs_own_lora, replace_with_own_lora

    modules = dict(model.named_modules())
    targets = lora_targets(model)
    own = [name for name in targets if needs_own_lora(modules[name])]
    by_peft = [name for name in targets if name not in own]
    norms = trained_norms(model)
    if not by_peft:
        raise ValueError(
            f"{type(model).__name__} has no Conv2d, or Conv3d with a kernel larger than 1, "
            "for LoRA to adapt; use mode='full'."
        )
    # A full-match pattern: a list would also match names that merely end the same.
    pattern = "|".join(re.escape(name) for name in by_peft)
    config = LoraConfig(
        r=int(rank),
        # PEFT annotates lora_alpha as int but divides it by r: a float alpha works.
        lora_alpha=float(alpha),  # type: ignore[arg-type]
        lora_dropout=0.0,
        target_modules=f"^(?:{pattern})$",
        # PEFT merges a LoRA bias only into a layer that has a bias.
        lora_bias=all(modules[name].bias is not None for name in by_peft),
        modules_to_save=norms or None,
    )
    devices = [model_device(model)] if model_device(model).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        wrapped = get_peft_model(model, config)
        replace_with_own_lora(wrapped.get_base_model(), own, int(rank), float(alpha))
    return wrapped


def adapted_layers(model: nn.Module) -> list[str]:
    """Names (in the user's model) of the layers that carry LoRA adapters; [] without LoRA."""
    if not is_lora(model):
        return []
    return [
        name
        for name, module in base_model(model).named_modules()
        if hasattr(module, "base_layer") and hasattr(module, "lora_A")
    ]


def describe_adapters(model: nn.Module) -> str:
    """One log line: how many layers of which kind carry adapters ("" without LoRA)."""
    modules = dict(base_model(model).named_modules())
    names = adapted_layers(model)
    if not names:
        return ""
    kinds = Counter(_kind(modules[name].base_layer) for name in names)
    listed = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    return f"LoRA adapters on {len(names)} layers ({listed})"


def _kind(layer: nn.Module) -> str:
    kernel = getattr(layer, "kernel_size", ())
    pointwise = bool(kernel) and all(k == 1 for k in kernel)
    return ("pointwise " if pointwise else "") + type(layer).__name__


def model_device(model: nn.Module) -> torch.device:
    """Device of the first parameter (CPU for a model without parameters)."""
    param = next(iter(model.parameters()), None)
    return param.device if param is not None else torch.device("cpu")


def merged_copy(model: nn.Module) -> nn.Module:
    """A plain copy of ``model`` with LoRA merged in, on the CPU, in eval mode.

    The training model (adapters, optimizer state) is left untouched.
    """
    clone = copy.deepcopy(model)
    if is_lora(clone):
        clone = clone.merge_and_unload()
    return clone.cpu().eval()


def merged_to_predict(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with LoRA merged in, on its device and in its mode, to predict.

    Unmerged, each adapted layer runs its base and its adapter (a forward pass 2.6x as
    dear on the CPU). Unlike :func:`merged_copy` the copy stays where ``model`` is (the
    prediction feeds it there) and in its train/eval mode (so it predicts the same);
    ``model`` keeps its adapters. A model without LoRA is returned as it is.
    """
    if not is_lora(model):
        return model
    clone = copy.deepcopy(model).merge_and_unload()
    return clone.train(model.training)


def base_model(model: nn.Module) -> nn.Module:
    """The user's module inside a PEFT wrapper (``model`` itself otherwise)."""
    if is_lora(model):
        return model.get_base_model()
    return model
