"""Checkpoints' public names: save one, open one, describe one.

The file's layout, its writer (:func:`save_checkpoint`) and its reader live in
:mod:`napari_finetune.model.checkpoint_format`; opening any model path, ours or a
bioimage.io package, is :func:`napari_finetune.loading.load_checkpoint`, on a floor
above this one. Both stay importable from here, their documented path.

A model the user brings is accepted through the same layout: a factory whose
keyword arguments rebuild it (see
:func:`napari_finetune.model.bring_your_own.checkpoint_from_factory`). The factory
is called only when it is on the allow-list of
:mod:`napari_finetune.model.architectures` or trusted by the user (``trust=``):
a file must never make the loader run code.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping

import torch

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
    "with_channel_recorded",
]


def load_checkpoint(
    path: str | os.PathLike, device: str | torch.device = "cpu", trust: Trust = None
) -> Checkpoint:
    """Read a checkpoint or a bioimage.io package: :func:`napari_finetune.loading.load_checkpoint`.

    The documented path of the public name (README, outside checks); the
    parameters, return value and errors are the loader's.

    Parameters
    ----------
    path : path-like
        The checkpoint file, or a bioimage.io model package (a ``.zip`` or a folder
        with ``rdf.yaml`` / ``bioimageio.yaml``).
    device : str or torch.device
        Where the model is put.
    trust : str or collection of str, optional
        Model factories or a package's source files the user trusts beyond the allow-list.

    Raises
    ------
    CheckpointError
        The loader's one line: what is wrong with the file and what to do.
    """
    # The one import up from model/ (pyproject.toml's layers contract names it): a
    # package path needs the bioimage.io reader, which sits above this floor, and the
    # loader above both dispatches. Imported when called, so that importing model/
    # never imports a floor above it.
    from napari_finetune.loading import load_checkpoint as load

    return load(path, device=device, trust=trust)


def describe_checkpoint(ckpt: Checkpoint, roles: Mapping[str, str | None] | None = None) -> str:
    """Human-readable summary: architecture, channels, normalisation, the run's record.

    ``roles`` (channel name -> instance role or None) puts each channel's role beside
    its name: ``nuclei (object)``.
    """
    n_params = sum(p.numel() for p in ckpt.model.parameters())
    channels = [
        f"{name} ({roles[name]})" if roles and roles.get(name) else name
        for name in ckpt.channel_names
    ]
    lines = [
        f"file:          {ckpt.path}",
        f"sha256:        {ckpt.sha256[:16]}...",
        f"architecture:  {ckpt.architecture.get('factory')} {ckpt.architecture.get('kwargs')}",
        f"parameters:    {n_params:,}",
        f"channels:      {', '.join(channels)}",
        f"normalization: {ckpt.normalization}",
    ]
    run = ckpt.metadata.get("run")
    if run:
        lines.append("run:")
        lines += [f"  {key}: {value}" for key, value in run.items()]
    return "\n".join(lines)


def with_channel_recorded(ckpt: Checkpoint, channel: int | None) -> Checkpoint:
    """``ckpt`` whose metadata records ``channel`` (``"input_channel"``), the store's channel
    a single-channel model trains on, or records none.

    The export of the tuned model cuts its bioimage.io test tensors from that channel
    even when the store names no channels (the recorded ``input_channels`` name it
    otherwise). A model tuned again on no chosen channel drops the index it came with,
    which no longer says what it read. ``train --channel`` and the panel's runs (its
    Channel row) both record it here.
    """
    metadata = {k: v for k, v in ckpt.metadata.items() if k != "input_channel"}
    if channel is not None:
        metadata["input_channel"] = channel
    if metadata == ckpt.metadata:
        return ckpt
    return dataclasses.replace(ckpt, metadata=metadata)


def __getattr__(name: str) -> Callable[..., object]:
    """Names that moved out of this module stay importable from it."""
    if name == "checkpoint_from_factory":  # to model/bring_your_own.py
        from napari_finetune.model.bring_your_own import checkpoint_from_factory

        return checkpoint_from_factory
    if name == "call_factory":  # to model/factory.py
        from napari_finetune.model.factory import call_factory

        return call_factory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
