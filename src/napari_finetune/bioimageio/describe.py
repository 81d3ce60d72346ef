"""The bioimage.io model description (format 0.5) of a checkpoint, built with ``bioimageio.spec``.

:func:`build_description` writes the package's files (weights, TorchScript,
README, environment) into a working folder next to the test tensors and
returns a validated ``ModelDescr`` that points at them;
``save_bioimageio_package`` then zips folder and description together.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bioimageio.spec import ValidationContext
from bioimageio.spec.model import v0_5

from napari_finetune import __version__
from napari_finetune.bioimageio.normalization import preprocessing_from_normalization
from napari_finetune.bioimageio.readme import readme_text
from napari_finetune.model.checkpoint_format import Checkpoint
from napari_finetune.model.torchscript import to_torchscript
from napari_finetune.objects.roles import METADATA_KEY as ROLES_KEY

INPUT_ID = "raw"
OUTPUT_ID = "probabilities"
ENVIRONMENT = """\
name: napari-finetune
channels:
  - conda-forge
  - nodefaults
dependencies:
  - python>=3.10
  - pip
  - pip:
      - napari-finetune=={version}
"""


@dataclass
class PackageFields:
    """What the user can set on a package (the CLI's options), with the volume's geometry."""

    name: str
    description: str
    authors: list[str]
    license: str
    cite: list[dict[str, str]]
    axes: str
    scale: list[float] | None = None
    units: dict[str, str] = field(default_factory=dict)
    # The model's input channels, in order (a store's omero labels when known).
    input_channels: list[str] = field(default_factory=lambda: ["raw"])


def build_description(
    ckpt: Checkpoint,
    folder: Path,
    fields: PackageFields,
    test_shape: Sequence[int],
    multiple: int,
) -> v0_5.ModelDescr:
    """A ``bioimageio.spec`` ``ModelDescr`` for ``ckpt``, its files written into ``folder``.

    ``folder`` must already hold ``input.npy`` and ``output.npy`` (the test
    tensors, with batch and channel axes). Validated offline: no URL is visited.

    Raises
    ------
    ValueError
        The checkpoint or a field cannot be described (one line).
    """
    weights = _write_weights(ckpt, folder)
    readme = folder / "README.md"
    readme.write_text(
        readme_text(
            fields.name, fields.description, ckpt.channel_names, ckpt.normalization,
            ckpt.architecture, fields.axes, test_shape,
            str(ckpt.path or "a model in memory"), ckpt.sha256, ckpt.metadata.get("run"),
        ),
        encoding="utf-8",
    )
    record = {
        "version": __version__,
        "architecture": ckpt.architecture,
        "normalization": ckpt.normalization,
        "source_sha256": ckpt.sha256,
    }
    if ckpt.metadata.get("run"):
        record["run"] = ckpt.metadata["run"]
    if ckpt.metadata.get(ROLES_KEY):
        # The channels' object roles travel with the package (plain types).
        record[ROLES_KEY] = ckpt.metadata[ROLES_KEY]
    config = {"napari_finetune": record}
    with ValidationContext(root=folder, perform_io_checks=False):
        try:
            return v0_5.ModelDescr(
                name=fields.name,
                description=fields.description,
                authors=[v0_5.Author(name=name) for name in fields.authors],
                cite=[v0_5.CiteEntry(**entry) for entry in fields.cite],
                license=fields.license,
                documentation=v0_5.FileDescr(source=readme),
                tags=["napari-finetune", "unet", f"{len(fields.axes)}d", "segmentation"],
                inputs=[_input(folder, fields, ckpt.normalization, multiple)],
                outputs=[_output(folder, fields, ckpt.channel_names)],
                weights=weights,
                config=v0_5.Config(**config),
            )
        except Exception as exc:  # pydantic ValidationError: many lines, keep the first error
            errors = getattr(exc, "errors", None)
            first = errors()[0] if callable(errors) else {"loc": (), "msg": str(exc)}
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(
                f"the bioimage.io description is invalid at {where}: {first['msg']}"
            ) from None


def _input(
    folder: Path, fields: PackageFields, spec: dict[str, Any], multiple: int
) -> v0_5.InputTensorDescr:
    raw_dtype = str(_npy_dtype(folder / "input.npy"))
    float32 = v0_5.EnsureDtypeDescr(kwargs=v0_5.EnsureDtypeKwargs(dtype="float32"))
    return v0_5.InputTensorDescr(
        id=v0_5.TensorId(INPUT_ID),
        description=("the image, one channel" if len(fields.input_channels) == 1 else
                     f"the image, {len(fields.input_channels)} channels, each normalised "
                     "on its own"),
        axes=[
            v0_5.BatchAxis(),
            v0_5.ChannelAxis(channel_names=list(fields.input_channels)),
            *(
                v0_5.SpaceInputAxis(
                    id=v0_5.AxisId(a),
                    size=v0_5.ParameterizedSize(min=multiple, step=multiple),
                    **_geometry(fields, i),
                )
                for i, a in enumerate(fields.axes)
            ),
        ],
        test_tensor=v0_5.FileDescr(source=folder / "input.npy"),
        data=v0_5.IntervalOrRatioDataDescr(type=raw_dtype),
        # Cast first and last: without them bioimage.io casts back to the raw dtype.
        preprocessing=[float32, *preprocessing_from_normalization(spec, fields.axes), float32],
    )


def _output(
    folder: Path, fields: PackageFields, channel_names: list[str]
) -> v0_5.OutputTensorDescr:
    return v0_5.OutputTensorDescr(
        id=v0_5.TensorId(OUTPUT_ID),
        description="probability of each channel (sigmoid of the logits)",
        axes=[
            v0_5.BatchAxis(),
            v0_5.ChannelAxis(channel_names=list(channel_names)),
            *(
                v0_5.SpaceOutputAxis(
                    id=v0_5.AxisId(a),
                    size=v0_5.SizeReference(
                        tensor_id=v0_5.TensorId(INPUT_ID), axis_id=v0_5.AxisId(a)
                    ),
                    **_geometry(fields, i),
                )
                for i, a in enumerate(fields.axes)
            ),
        ],
        test_tensor=v0_5.FileDescr(source=folder / "output.npy"),
        data=v0_5.IntervalOrRatioDataDescr(type="float32", range=(0.0, 1.0)),
        postprocessing=[
            v0_5.SigmoidDescr(),
            v0_5.EnsureDtypeDescr(kwargs=v0_5.EnsureDtypeKwargs(dtype="float32")),
        ],
    )


def _geometry(fields: PackageFields, index: int) -> dict[str, Any]:
    """``scale`` and ``unit`` of a spatial axis, where the volume records them."""
    out: dict[str, Any] = {}
    if fields.scale and len(fields.scale) == len(fields.axes) and fields.scale[index] > 0:
        out["scale"] = float(fields.scale[index])
    unit = fields.units.get(fields.axes[index])
    if unit in typing.get_args(v0_5.SpaceUnit):
        out["unit"] = unit
    return out


def _write_weights(ckpt: Checkpoint, folder: Path) -> v0_5.WeightsDescr:
    """State dict + TorchScript files, and their ``WeightsDescr``."""
    # A CPU copy: the TorchScript file must load on any machine, and the caller's model
    # (a trainer's, maybe on a GPU) stays where and as it is.
    model = copy.deepcopy(ckpt.model).cpu().eval()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(state, folder / "weights.pt")
    (folder / "environment.yaml").write_text(ENVIRONMENT.format(version=__version__))
    torchscript = folder / "model.torchscript"
    to_torchscript(model).save(str(torchscript))
    version = v0_5.Version(torch.__version__.split("+")[0])
    return v0_5.WeightsDescr(
        pytorch_state_dict=v0_5.PytorchStateDictWeightsDescr(
            source=folder / "weights.pt",
            architecture=_architecture(ckpt, folder),
            pytorch_version=version,
            dependencies=v0_5.FileDescr(source=folder / "environment.yaml"),
        ),
        torchscript=v0_5.TorchscriptWeightsDescr(
            source=torchscript, pytorch_version=version, parent="pytorch_state_dict"
        ),
    )


def _architecture(
    ckpt: Checkpoint, folder: Path
) -> v0_5.ArchitectureFromLibraryDescr | v0_5.ArchitectureFromFileDescr:
    factory = str(ckpt.architecture.get("factory", ""))
    kwargs = dict(ckpt.architecture.get("kwargs") or {})
    module, _, qualname = factory.partition(":")
    source_file = (ckpt.metadata.get("bioimageio") or {}).get("architecture_file")
    if source_file and factory == f"{source_file['name']}:{source_file['callable']}":
        # Built from an imported package's own file: that file goes into this package too.
        path = folder / source_file["name"]
        path.write_text(source_file["code"], encoding="utf-8")
        return v0_5.ArchitectureFromFileDescr(
            source=path, callable=v0_5.Identifier(source_file["callable"]), kwargs=kwargs
        )
    if not module or not qualname.isidentifier():
        raise ValueError(
            f"the model's factory {factory!r} is not 'package.module:Callable', which "
            "bioimage.io's architecture needs; export the model through a top-level factory"
        )
    return v0_5.ArchitectureFromLibraryDescr(
        import_from=module, callable=v0_5.Identifier(qualname), kwargs=kwargs
    )


def _npy_dtype(path: Path) -> np.dtype:
    return np.load(path, mmap_mode="r").dtype
