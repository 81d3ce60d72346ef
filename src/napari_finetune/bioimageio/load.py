"""Open a bioimage.io model package as a napari-finetune checkpoint.

:func:`napari_finetune.loading.load_checkpoint` comes here when ``path`` is a
package (a folder or ``.zip`` with ``rdf.yaml`` / ``bioimageio.yaml``, or that file
itself). The description is read and converted to the latest format by ``bioimageio.spec``
with ``perform_io_checks=False``, so nothing is downloaded; a package whose
weights or architecture file are URLs is refused.

What napari-finetune takes from the package:

- the model: ``pytorch_state_dict`` weights (loaded with ``weights_only=True``)
  and the architecture (:mod:`~napari_finetune.bioimageio.architecture`);
- ``channel_names``: the output tensor's channel axis;
- ``normalization``: the input tensor's preprocessing
  (:mod:`~napari_finetune.bioimageio.normalization`);
- ``bioimageio``: name, authors, cite, licence and source of the package, which
  an export of the fine-tuned model carries on.

The model must take what napari-finetune feeds (batch, one channel, ZYX or YX)
and return one logit per channel: the package's output postprocessing must
start with ``sigmoid``. Anything else is refused with one line.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from napari_finetune.bioimageio import require
from napari_finetune.errors import one_line
from napari_finetune.model.architectures import Trust
from napari_finetune.model.checkpoint_format import Checkpoint
from napari_finetune.model.factory import CheckpointError
from napari_finetune.objects.roles import METADATA_KEY as ROLES_KEY

if TYPE_CHECKING:  # bioimageio.spec is imported at run time only once it is known to exist
    from bioimageio.spec.model.v0_5 import ModelDescr



def read_description(path: Path) -> ModelDescr:
    """The package's model description (bioimage.io format 0.5), read offline.

    Raises
    ------
    CheckpointError
        Not a valid model description; the first validation error on one line.
    """
    from bioimageio.spec import InvalidDescr, load_description
    from bioimageio.spec.model import v0_5

    try:
        descr = load_description(path, perform_io_checks=False, format_version="latest")
    except Exception as exc:  # noqa: BLE001 - yaml, zip and validation errors of many types
        raise CheckpointError(
            f"{path} could not be read as a bioimage.io package ("
            f"{one_line(exc)})"
        ) from None
    if isinstance(descr, InvalidDescr) or not isinstance(descr, v0_5.ModelDescr):
        kind = getattr(descr, "type", None)
        if isinstance(descr, InvalidDescr):
            errors = descr.validation_summary.errors
            where = ".".join(str(part) for part in errors[0].loc) if errors else ""
            why = f"{where}: {errors[0].msg}" if errors else "invalid description"
        else:
            why = f"it describes a {kind!r}, not a model"
        raise CheckpointError(f"{path} is not a usable bioimage.io model package ({why}).")
    return descr


def load_bioimageio(
    path: str | os.PathLike, device: str | torch.device = "cpu", trust: Trust = None
) -> Checkpoint:
    """Read a bioimage.io model package into a :class:`Checkpoint`.

    Parameters
    ----------
    path : path-like
        A ``.zip`` package, a folder with ``rdf.yaml`` / ``bioimageio.yaml``, or that file.
    device : str or torch.device
        Where the model is put.
    trust : str or collection of str, optional
        Factories (``"module:callable"``) or package source files
        (``"file.py:callable"``) the user trusts beyond the allow-list.

    Raises
    ------
    CheckpointError
        One line: what in the package napari-finetune cannot use, and what to do.
    """
    path = Path(path)
    require("bioimageio.spec", CheckpointError, f"opening the bioimage.io package {path}")
    # Imported here, after the check: they import bioimageio.spec.
    from napari_finetune.bioimageio.architecture import (
        architecture_dict,
        build_package_model,
        read_package_file,
        trusted_source,
    )
    from napari_finetune.bioimageio.normalization import normalization_from_preprocessing

    descr = read_description(path)
    weights = descr.weights.pytorch_state_dict
    if weights is None:
        present = [name for name, value in descr.weights if value is not None]
        raise CheckpointError(
            f"{path} has no pytorch_state_dict weights (it has {', '.join(present)}); "
            "napari-finetune fine-tunes PyTorch state dicts: ask the model's authors for "
            "that format, or convert the model."
        )
    try:
        axes = _input_axes(descr)
        channel_names = _output_channel_names(descr)
        normalization = normalization_from_preprocessing(descr.inputs[0].preprocessing)
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}.") from None
    # Everything of the package is read before the model is built, the last step and the
    # only one on the model floor: a package's path walks down once.
    architecture = architecture_dict(weights.architecture)
    source = trusted_source(weights.architecture, architecture, trust)
    metadata = {
        "channel_names": channel_names,
        "normalization": normalization,
        "bioimageio": _provenance(descr, path, axes, source),
    }
    ours = _napari_finetune_config(descr)
    run = ours.get("run")
    if isinstance(run, dict):
        metadata["run"] = run
    roles = ours.get(ROLES_KEY)
    if isinstance(roles, dict):  # validated where they are used (objects.roles)
        metadata[ROLES_KEY] = roles
    data = read_package_file(weights, "weights file")
    digest = hashlib.sha256(path.read_bytes() if path.is_file() and path.suffix == ".zip" else data)
    model = build_package_model(architecture, source, trust)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=weights.strict)
    except Exception as exc:  # noqa: BLE001 - torch raises several types for unfit weights
        raise CheckpointError(
            f"the weights of {path} do not fit {architecture['factory']} "
            f"({one_line(exc)})"
        ) from None
    model.to(device).eval()
    return Checkpoint(
        model=model,
        metadata=metadata,
        architecture=architecture,
        path=path,
        sha256=digest.hexdigest(),
    )


def _input_axes(descr: ModelDescr) -> list[str]:
    """The spatial axis ids of the one input; refuse what napari-finetune cannot feed."""
    if len(descr.inputs) != 1:
        raise ValueError(
            f"the model has {len(descr.inputs)} inputs; napari-finetune feeds one image"
        )
    axes = descr.inputs[0].axes
    kinds = [axis.type for axis in axes]
    ids = [str(axis.id) for axis in axes]
    spatial = ids[2:]
    if kinds[:2] != ["batch", "channel"] or spatial not in (["y", "x"], ["z", "y", "x"]):
        raise ValueError(
            f"the model's input axes are {''.join(i[0] for i in ids)} ({', '.join(ids)}); "
            "napari-finetune feeds batch, channel, then z, y, x or y, x"
        )
    if axes[1].size != 1:
        raise ValueError(
            f"the model takes {axes[1].size} input channels; napari-finetune feeds one"
        )
    return spatial


def _output_channel_names(descr: ModelDescr) -> list[str]:
    """Channel names of the one output, whose postprocessing must start with a sigmoid."""
    from bioimageio.spec.model import v0_5

    if len(descr.outputs) != 1:
        raise ValueError(
            f"the model has {len(descr.outputs)} outputs; napari-finetune uses one "
            "(one logit per channel)"
        )
    out = descr.outputs[0]
    channels = [axis for axis in out.axes if axis.type == "channel"]
    if not channels:
        raise ValueError("the model's output has no channel axis; napari-finetune needs one")
    steps = [s for s in out.postprocessing if not isinstance(s, v0_5.EnsureDtypeDescr)]
    if not steps or not isinstance(steps[0], v0_5.SigmoidDescr):
        names = [str(s.id) for s in steps] or ["none"]
        raise ValueError(
            f"the model's output postprocessing is {names}, not a sigmoid first: "
            "napari-finetune trains and predicts one logit per channel and applies the "
            "sigmoid itself, so this model's outputs are not what it expects"
        )
    return [str(name) for name in channels[0].channel_names]


def _provenance(
    descr: ModelDescr, path: Path, axes: list[str], source: dict[str, str] | None
) -> dict[str, Any]:
    """What an export of the fine-tuned model carries on (plain types only); ``source``:
    the package's own architecture file, when it has one."""
    record: dict[str, Any] = {
        "source": str(path),
        "name": descr.name,
        "id": str(descr.id) if descr.id else None,
        "version": str(descr.version) if descr.version else None,
        "format_version": descr.format_version,
        "license": str(descr.license) if descr.license else None,
        "authors": [author.name for author in descr.authors],
        "cite": [
            {
                "text": entry.text,
                **({"doi": str(entry.doi)} if entry.doi else {}),
                **({"url": str(entry.url)} if entry.url else {}),
            }
            for entry in descr.cite
        ],
        "axes": axes,
    }
    if source is not None:
        # Kept so that an export can put the file back into the new package.
        record["architecture_file"] = source
    return record


def _napari_finetune_config(descr: ModelDescr) -> dict[str, Any]:
    """``config.napari_finetune`` of a package napari-finetune wrote ({} otherwise)."""
    extra = getattr(descr.config, "model_extra", None) or {}
    value = extra.get("napari_finetune")
    return value if isinstance(value, dict) else {}
