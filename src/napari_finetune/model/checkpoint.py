"""Checkpoints: one file that rebuilds the model, written atomically, read safely.

The file's layout and its writer (:func:`save_checkpoint`) live in
:mod:`napari_finetune.model.checkpoint_format` and are importable from here;
this module reads a file back (:func:`load_checkpoint`), whether it is one of
ours or a bioimage.io package.

A model the user brings is accepted through the same layout: a factory whose
keyword arguments rebuild it (see
:func:`napari_finetune.model.bring_your_own.checkpoint_from_factory`). The factory
is called only when it is on the allow-list of
:mod:`napari_finetune.model.architectures` or trusted by the user (``trust=``):
a file must never make the loader run code.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import torch

from napari_finetune.errors import one_line
from napari_finetune.model.architectures import Trust
from napari_finetune.model.checkpoint_format import (
    DEFAULT_NORMALIZATION,
    FORMAT,
    FORMAT_VERSION,
    Checkpoint,
    architecture_of,
    channel_names_of,
    save_checkpoint,
)
from napari_finetune.model.factory import CheckpointError, build_model
from napari_finetune.model.state_dict_fit import mismatch_line

__all__ = [
    "DEFAULT_NORMALIZATION",
    "FORMAT",
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "architecture_of",
    "build_model",
    "channel_names_of",
    "describe_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
]


def load_checkpoint(
    path: str | os.PathLike, device: str | torch.device = "cpu", trust: Trust = None
) -> Checkpoint:
    """Read a checkpoint with ``weights_only=True`` and rebuild its model.

    Parameters
    ----------
    path : path-like
        The checkpoint file, or a bioimage.io model package (a ``.zip`` or a folder
        with ``rdf.yaml`` / ``bioimageio.yaml``; see :mod:`napari_finetune.bioimageio`).
    device : str or torch.device
        Where the model is put.
    trust : str or collection of str, optional
        Model factories (``"package.module:callable"``) the user trusts beyond
        the allow-list of :mod:`napari_finetune.model.architectures`.

    Raises
    ------
    CheckpointError
        Missing file, a file torch cannot read, a file of another format, a
        factory that is neither allowed nor trusted, or weights that do not fit
        the recorded architecture; the message says which.
    """
    path = Path(path)
    from napari_finetune.bioimageio import is_bioimageio_package

    if is_bioimageio_package(path):  # a folder or .zip with rdf.yaml / bioimageio.yaml
        from napari_finetune.bioimageio.load import load_bioimageio

        return load_bioimageio(path, device=device, trust=trust)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path} (is the path right?)")
    data = path.read_bytes()
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a bad file
        raise CheckpointError(
            f"{path} is not a readable PyTorch checkpoint ({one_line(exc)}); it may be "
            "truncated or not a .pt file. Export it again or pick another file."
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(
            f"{path} is a PyTorch file but not a napari-finetune checkpoint (no "
            f"'format': '{FORMAT}'). A bare state dict can be wrapped with "
            "napari_finetune.model.checkpoint.checkpoint_from_factory()."
        )
    if payload.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} was written by a newer napari-finetune (format "
            f"{payload['format_version']}); upgrade napari-finetune to read it."
        )
    architecture = payload.get("architecture")
    if not isinstance(architecture, dict) or not isinstance(architecture.get("factory"), str):
        raise CheckpointError(
            f"{path} has no usable 'architecture' (a dict with a 'factory' string); "
            "export it again with napari-finetune."
        )
    from napari_finetune.bioimageio.source_file import build_from_source, saved_source

    source = saved_source(architecture, payload.get("metadata"))  # a bioimage.io package's file
    if source is not None:
        model = build_from_source(source, architecture.get("kwargs") or {}, trust)
    else:
        model = build_model(architecture, trust=trust)
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as exc:
        raise CheckpointError(
            f"the weights in {path} do not fit its architecture "
            f"{architecture['factory']}: {mismatch_line(model, payload['state_dict'], exc)}"
        ) from None
    model.to(device).eval()
    return Checkpoint(
        model=model,
        metadata=payload.get("metadata") or {},
        architecture=architecture,
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
    )


def describe_checkpoint(ckpt: Checkpoint) -> str:
    """Human-readable summary: architecture, channels, normalisation, the run's record."""
    n_params = sum(p.numel() for p in ckpt.model.parameters())
    lines = [
        f"file:          {ckpt.path}",
        f"sha256:        {ckpt.sha256[:16]}...",
        f"architecture:  {ckpt.architecture.get('factory')} {ckpt.architecture.get('kwargs')}",
        f"parameters:    {n_params:,}",
        f"channels:      {', '.join(ckpt.channel_names)}",
        f"normalization: {ckpt.normalization}",
    ]
    run = ckpt.metadata.get("run")
    if run:
        lines.append("run:")
        lines += [f"  {key}: {value}" for key, value in run.items()]
    return "\n".join(lines)


def __getattr__(name: str) -> Callable[..., object]:
    """Names that moved out of this module stay importable from it."""
    if name == "checkpoint_from_factory":  # to model/bring_your_own.py
        from napari_finetune.model.bring_your_own import checkpoint_from_factory

        return checkpoint_from_factory
    if name == "call_factory":  # to model/factory.py
        from napari_finetune.model.factory import call_factory

        return call_factory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
