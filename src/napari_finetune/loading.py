"""Open a model path, whichever kind it is: the loader above ``model/`` and ``bioimageio/``.

A path is one of two things, and :func:`load_checkpoint` walks down once to the
reader that knows it:

- a bioimage.io model package (a ``.zip``, a folder with ``rdf.yaml`` /
  ``bioimageio.yaml``, or that file): :mod:`napari_finetune.bioimageio.load`;
- anything else is read as a napari-finetune checkpoint
  (:func:`napari_finetune.model.checkpoint_format.read_checkpoint`), whose model is
  built by its factory on the allow-list (:mod:`napari_finetune.model.factory`) or,
  for a fine-tuned package whose architecture is the package's own Python file, from
  that file kept in the metadata (:mod:`napari_finetune.bioimageio.source_file`),
  only under the user's trust.

Neither floor below imports the other's reader: this module is where they meet. The
public path :func:`napari_finetune.model.checkpoint.load_checkpoint` answers with this
function (the one import up from ``model/``, named in pyproject.toml's layers contract).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from napari_finetune.bioimageio import is_bioimageio_package
from napari_finetune.bioimageio.source_file import build_from_source, saved_source
from napari_finetune.model.architectures import Trust
from napari_finetune.model.checkpoint_format import Checkpoint, read_checkpoint
from napari_finetune.model.factory import build_model

__all__ = ["load_checkpoint"]


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
        the allow-list of :mod:`napari_finetune.model.architectures`, or a package's
        own source files (``"file.py:callable"``).

    Returns
    -------
    Checkpoint
        The model in eval mode on ``device``, its metadata and architecture record.

    Raises
    ------
    CheckpointError
        Missing file, a file torch cannot read, a file of another format, a
        factory that is neither allowed nor trusted, or weights that do not fit
        the recorded architecture; the message says which.
    """
    path = Path(path)
    if is_bioimageio_package(path):  # a folder or .zip with rdf.yaml / bioimageio.yaml
        # Imported for a package only: the reader brings napari_finetune.objects (scipy,
        # scikit-image), which opening a .pt does not need.
        from napari_finetune.bioimageio.load import load_bioimageio

        return load_bioimageio(path, device=device, trust=trust)
    return read_checkpoint(path, device=device, trust=trust, build=_build)


def _build(architecture: dict[str, Any], metadata: dict[str, Any], trust: Trust) -> nn.Module:
    # A .pt fine-tuned from a package whose architecture is the package's own file
    # keeps that file in its metadata; it is rebuilt from there, never from the allow-list.
    source = saved_source(architecture, metadata)
    if source is not None:
        return build_from_source(source, architecture.get("kwargs") or {}, trust)
    return build_model(architecture, trust=trust)
