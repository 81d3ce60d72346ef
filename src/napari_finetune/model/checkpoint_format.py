"""The checkpoint file: what it holds (:class:`Checkpoint`), how one is written and read.

Layout of the file (plain types and tensors only, so ``torch.load(...,
weights_only=True)`` reads it)::

    {"format": "napari-finetune-checkpoint", "format_version": 1,
     "architecture": {"factory": "package.module:callable", "kwargs": {...}},
     "state_dict": {...},
     "metadata": {"channel_names": [...], "channel_colors": [...],
                  "normalization": {...}, "run": {...}}}

:func:`read_checkpoint` reads this layout only. Opening any model path (this file
or a bioimage.io package) is :func:`napari_finetune.loading.load_checkpoint`, on a
floor above this one and the bioimage.io reader; the readers of other formats build
their :class:`Checkpoint` from here.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from napari_finetune import palette
from napari_finetune.errors import one_line
from napari_finetune.model.architectures import Trust
from napari_finetune.model.atomic_write import write_atomically
from napari_finetune.model.factory import CheckpointError, build_model
from napari_finetune.model.state_dict_fit import mismatch_line

FORMAT = "napari-finetune-checkpoint"
FORMAT_VERSION = 1
DEFAULT_NORMALIZATION = {"method": "percentile", "low": 1.0, "high": 99.0}

# How a reader rebuilds the model from the file's architecture record, its metadata
# and the user's trust (the loader passes one that also knows a bioimage.io
# package's own source file, which lives on a floor above this one).
BuildModel = Callable[[dict[str, Any], dict[str, Any], Trust], nn.Module]


@dataclass
class Checkpoint:
    """What :func:`~napari_finetune.loading.load_checkpoint` returns.

    Attributes
    ----------
    model : torch.nn.Module
        Rebuilt model with the weights loaded, in eval mode, on the CPU.
    metadata : dict
        ``channel_names``, ``normalization``, ``run`` (the record of a fine-tuning
        run, if any) and whatever else was saved.
    architecture : dict
        ``factory`` and ``kwargs`` that rebuilt ``model``.
    path : pathlib.Path or None
        Where it was read from.
    sha256 : str
        Hash of the file's bytes, recorded by fine-tuning runs as their source.
    """

    model: nn.Module
    metadata: dict[str, Any] = field(default_factory=dict)
    architecture: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    sha256: str = ""

    @property
    def channel_names(self) -> list[str]:
        """Names of the output channels (``channel_0``... when none were saved)."""
        return channel_names_of(self.metadata, _out_channels(self.architecture))

    @property
    def channel_colors(self) -> list[str]:
        """The saved colour of each channel, else :mod:`napari_finetune.palette`'s."""
        return palette.channel_colors(self.channel_names, self.metadata)

    @property
    def normalization(self) -> dict[str, Any]:
        """How raw intensities are scaled before the model sees them."""
        return dict(self.metadata.get("normalization") or DEFAULT_NORMALIZATION)


def architecture_of(model: nn.Module) -> dict[str, Any]:
    """Factory path and constructor arguments of ``model``, as plain data.

    The arguments are the model's ``init_kwargs``, or what an architecture
    adapter recovers from it (MONAI models); a class or function among them
    becomes ``"module:qualname"`` and its key is listed under ``callable_kwargs``
    (:mod:`~napari_finetune.model.plain_kwargs`).

    Raises
    ------
    CheckpointError
        If the arguments are unknown or cannot be written as plain data.
    """
    from napari_finetune.model.adapters import constructor_kwargs, factory_of
    from napari_finetune.model.plain_kwargs import NotPlainError, to_plain

    kwargs = constructor_kwargs(model)
    if kwargs is None:
        raise CheckpointError(
            f"{type(model).__name__} does not record its constructor arguments "
            "(an `init_kwargs` dict) and no architecture adapter knows it, so a checkpoint "
            "could not rebuild it; use napari_finetune.model.unet.UNet, build it with "
            "napari_finetune.model.checkpoint.build_model(), or register an adapter."
        )
    try:
        plain, callables = to_plain(copy.deepcopy(kwargs))
    except NotPlainError as exc:
        raise CheckpointError(f"cannot export {type(model).__name__}: {exc}") from None
    architecture: dict[str, Any] = {"factory": factory_of(model), "kwargs": plain}
    if callables:
        architecture["callable_kwargs"] = callables
    return architecture


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    metadata: dict[str, Any] | None = None,
    architecture: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` and ``metadata`` to ``path`` atomically.

    The file is written to a temporary name in the same folder, flushed and
    fsynced, then renamed over ``path``: a crash leaves either the old file or
    the new one, never half of one. Temporaries a killed writer left behind
    are removed by the next save of the same file
    (:mod:`~napari_finetune.model.atomic_write`).

    Parameters
    ----------
    path : path-like
        Destination (``.pt`` by convention).
    model : torch.nn.Module
        A plain model (merge adapters before saving).
    metadata : dict, optional
        Plain types only: str, int, float, bool, None, lists and dicts. The
        channels' colours (``channel_colors``) are added from
        :mod:`napari_finetune.palette` when the metadata has none that fit.
    architecture : dict, optional
        Overrides :func:`architecture_of` (for models that do not record it).

    Returns
    -------
    pathlib.Path
        The written path.

    Raises
    ------
    OSError
        ``ENOSPC`` with a one-line message naming the folder and the space needed
        when the disk is full (checked first, and caught from the write).
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise CheckpointError(f"cannot write {path}: the folder {path.parent} does not exist.")
    architecture = architecture or architecture_of(model)
    metadata = copy.deepcopy(metadata or {})
    names = channel_names_of(metadata, _out_channels(architecture))
    if names:  # the colours travel with the model: every reader draws a channel alike
        metadata[palette.METADATA_KEY] = palette.channel_colors(names, metadata)
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "architecture": architecture,
        "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "metadata": metadata,
    }
    return write_atomically(
        path, lambda handle: torch.save(payload, handle), size_hint=_payload_bytes(payload)
    )


def read_checkpoint(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    trust: Trust = None,
    build: BuildModel | None = None,
) -> Checkpoint:
    """Read a file of this layout with ``weights_only=True`` and rebuild its model.

    Parameters
    ----------
    path : path-like
        The checkpoint file.
    device : str or torch.device
        Where the model is put.
    trust : str or collection of str, optional
        Model factories (``"package.module:callable"``) the user trusts beyond
        the allow-list of :mod:`napari_finetune.model.architectures`.
    build : callable, optional
        ``build(architecture, metadata, trust)`` returns the model before its
        weights are loaded; by default the factory of the record
        (:func:`~napari_finetune.model.factory.build_model`).

    Raises
    ------
    CheckpointError
        Missing file, a file torch cannot read, a file of another format, a
        factory that is neither allowed nor trusted, or weights that do not fit
        the recorded architecture; the message says which.
    """
    path = Path(path)
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
    metadata = payload.get("metadata") or {}
    if build is None:
        model = build_model(architecture, trust=trust)
    else:
        model = build(architecture, metadata, trust)
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
        metadata=metadata,
        architecture=architecture,
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
    )


def channel_names_of(metadata: dict[str, Any], out_channels: int | None) -> list[str]:
    """Saved channel names, or ``channel_0..`` for each output channel."""
    names = list(metadata.get("channel_names") or [])
    if out_channels is not None and len(names) != out_channels:
        names = [f"channel_{i}" for i in range(out_channels)]
    return names


def _payload_bytes(payload: dict[str, Any]) -> int:
    # The tensors dominate; zip headers and the pickled metadata add a little.
    tensors = sum(t.numel() * t.element_size() for t in payload["state_dict"].values())
    return tensors + 256 * 1024


def _out_channels(architecture: dict[str, Any]) -> int | None:
    value = architecture.get("kwargs", {}).get("out_channels")
    return int(value) if value is not None else None
