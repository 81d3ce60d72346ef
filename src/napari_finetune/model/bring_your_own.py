"""Bring your own model: wrap a factory and its weights into a napari-finetune checkpoint."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from napari_finetune.model.checkpoint_format import save_checkpoint
from napari_finetune.model.factory import CheckpointError, build_model
from napari_finetune.model.state_dict_fit import mismatch_line


def checkpoint_from_factory(
    path: str | os.PathLike,
    factory: str,
    kwargs: dict[str, Any],
    state_dict: dict[str, torch.Tensor] | str | os.PathLike,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Wrap a model the user brings into a napari-finetune checkpoint.

    Parameters
    ----------
    factory : str
        ``"package.module:callable"`` returning the model from ``kwargs``.
    state_dict : dict or path-like
        The weights, or a file holding them (read with ``weights_only=True``).

    The caller names ``factory`` itself, so it is trusted here; loading the
    written file needs the same trust unless the factory is on the allow-list.
    """
    architecture = {"factory": factory, "kwargs": dict(kwargs)}
    model = build_model(architecture, trust=[factory])
    weights: Mapping[str, torch.Tensor] = (
        state_dict
        if isinstance(state_dict, dict)
        else torch.load(state_dict, map_location="cpu", weights_only=True)
    )
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise CheckpointError(
            f"the weights do not fit {factory}({kwargs}): {mismatch_line(model, state_dict, exc)}"
        ) from None
    return save_checkpoint(path, model, metadata, architecture=architecture)
