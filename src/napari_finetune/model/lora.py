"""LoRA adapters through PEFT: which layers, wrapping, merging for export.

PEFT is imported only inside :func:`wrap_lora` (``import peft`` takes seconds
and pulls in transformers). Targets are the Conv2d/Conv3d layers whose kernel
is larger than 1 on some axis: PEFT 0.21.2 cannot merge LoRA into a pointwise
Conv3d (huggingface/peft #3768, fixed upstream after 0.21.2), and in the UNet the only
pointwise convolution is the 1x1 ``head``, which stays frozen.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def lora_targets(model: nn.Module) -> list[str]:
    """Qualified names of the convolutions LoRA adapts (kernel > 1 on some axis)."""
    names = []
    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Conv3d)) and any(k > 1 for k in module.kernel_size):
            names.append(name)
    return names


def is_lora(model: nn.Module) -> bool:
    """Whether ``model`` is a PEFT model (checked without importing peft)."""
    return type(model).__module__.startswith("peft") and hasattr(model, "merge_and_unload")


def wrap_lora(model: nn.Module, rank: int, alpha: float, seed: int = 0) -> nn.Module:
    """Wrap ``model`` in LoRA adapters; only the adapters are trainable.

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
        When the model has no convolution with a kernel larger than 1.
    """
    from peft import LoraConfig, get_peft_model  # slow import: only here

    targets = lora_targets(model)
    if not targets:
        raise ValueError(
            f"{type(model).__name__} has no Conv2d/Conv3d with a kernel larger than 1 for "
            "LoRA to adapt; use mode='full'."
        )
    config = LoraConfig(
        r=int(rank), lora_alpha=float(alpha), lora_dropout=0.0, target_modules=targets
    )
    devices = [model_device(model)] if model_device(model).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        wrapped = get_peft_model(model, config)
    return wrapped


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


def base_model(model: nn.Module) -> nn.Module:
    """The user's module inside a PEFT wrapper (``model`` itself otherwise)."""
    if is_lora(model):
        return model.get_base_model()
    return model
