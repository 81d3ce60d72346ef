"""TorchScript of a model, for consumers without Python (bioimage.io, deepImageJ, Fiji)."""

from __future__ import annotations

import warnings

import torch


def to_torchscript(model: torch.nn.Module) -> torch.jit.ScriptModule:
    """``model`` scripted (any input size), else traced on a small valid input.

    Tracing fixes nothing but the graph, so a traced UNet still runs on other
    sizes that are multiples of its pooling; the input it is traced on is twice
    the model's spatial multiple on every axis.
    """
    from napari_finetune.model.geometry import spatial_multiple

    model = model.eval()
    try:
        with warnings.catch_warnings():
            # The UNet's annotated ``init_kwargs`` dict: TorchScript warns and ignores it;
            # torch 2.13 also calls torch.jit deprecated (it still works, and consumers need it).
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.script(model)
    except Exception:  # noqa: BLE001 - scripting fails on many Python constructs; tracing remains
        dims = int(getattr(model, "dims", 3) or 3)
        shape = tuple(2 * m for m in spatial_multiple(model, dims))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.trace(model, torch.zeros((1, 1) + shape))
