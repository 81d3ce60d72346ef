"""A package's ``pytorch_state_dict`` architecture, built under napari-finetune's trust rules.

bioimage.io names the model's constructor in one of two ways:

- ``ArchitectureFromLibraryDescr`` (``import_from`` + ``callable``): an installed
  library's callable. It becomes the factory ``"import_from:callable"`` and goes
  through the same allow-list as a checkpoint's factory
  (:mod:`napari_finetune.model.architectures`): napari-finetune's UNet, the MONAI
  and torch-em UNets, registered architectures, or one the user trusts.
- ``ArchitectureFromFileDescr`` (``source`` + ``callable``): a Python file inside
  the package. Running it runs the package author's code, so it is run only when
  the user trusts it by name, ``"<file name>:<callable>"`` (``trust=`` /
  ``--trust-factory``), the same way as an unknown factory.
"""

from __future__ import annotations

import hashlib
import sys
import types
from typing import Any

from bioimageio.spec.model import v0_5
from torch import nn

from napari_finetune.model.architectures import Trust, trusted_names
from napari_finetune.model.checkpoint import CheckpointError, build_model

# Where a package's own source files are imported (one module per file content).
MODULE_PREFIX = "napari_finetune_package_"


def file_trust_name(arch: v0_5.ArchitectureFromFileDescr) -> str:
    """``"<file name>:<callable>"``: how the user trusts a package's source file."""
    return f"{_source_name(arch.source)}:{arch.callable}"


def architecture_dict(arch: object) -> dict[str, Any]:
    """``{"factory": ..., "kwargs": ...}`` as a checkpoint records it."""
    if isinstance(arch, v0_5.ArchitectureFromLibraryDescr):
        factory = f"{arch.import_from}:{arch.callable}"
    elif isinstance(arch, v0_5.ArchitectureFromFileDescr):
        factory = file_trust_name(arch)
    else:
        raise CheckpointError(f"unknown bioimage.io architecture description {type(arch).__name__}")
    return {"factory": factory, "kwargs": dict(arch.kwargs)}


def build_package_model(arch: object, trust: Trust = None) -> tuple[nn.Module, dict[str, Any]]:
    """The model a package's architecture describes, and its architecture dict.

    Raises
    ------
    CheckpointError
        A library callable that is not allowed or not installed, or a source
        file the user has not trusted (the message says how to trust it).
    """
    architecture = architecture_dict(arch)
    if isinstance(arch, v0_5.ArchitectureFromLibraryDescr):
        return build_model(architecture, trust=trust), architecture
    assert isinstance(arch, v0_5.ArchitectureFromFileDescr)
    name = architecture["factory"]
    if name not in trusted_names(trust):
        raise CheckpointError(
            f"the package builds its model with {arch.callable} from its own file "
            f"{_source_name(arch.source)}, and importing that file runs its code; if you "
            f"trust the package, load it with --trust-factory {name} (Python: "
            f"load_checkpoint(path, trust=[{name!r}]))."
        )
    fn = getattr(_import_source(arch), str(arch.callable), None)
    if not callable(fn):
        raise CheckpointError(
            f"the package's file {_source_name(arch.source)} defines no callable "
            f"{arch.callable!r}."
        )
    try:
        model = fn(**architecture["kwargs"])
    except TypeError as exc:
        raise CheckpointError(f"{name} rejected the package's kwargs: {exc}") from None
    if not isinstance(model, nn.Module):
        raise CheckpointError(f"{name} returned a {type(model).__name__}, not a torch.nn.Module.")
    if not hasattr(model, "init_kwargs"):
        model.init_kwargs = dict(architecture["kwargs"])
    model.factory = name
    return model, architecture


def read_source(arch: v0_5.ArchitectureFromFileDescr) -> str:
    """The text of the package's architecture file (refused if it is a URL)."""
    refuse_url(arch.source, "architecture file")
    try:
        data = arch.get_reader().read()
    except Exception as exc:  # noqa: BLE001 - missing, a SHA-256 or zip CRC mismatch
        raise CheckpointError(f"cannot read the package's architecture file: {exc}") from None
    return data.decode("utf-8")


def _import_source(arch: v0_5.ArchitectureFromFileDescr) -> types.ModuleType:
    code = read_source(arch)
    # Keyed by content, so two packages with a different model.py never share a module.
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    module_name = f"{MODULE_PREFIX}{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        module = types.ModuleType(module_name)
        module.__file__ = _source_name(arch.source)
        # Registered before running: dataclasses and pickling look the module up.
        sys.modules[module_name] = module
        try:
            exec(compile(code, module.__file__, "exec"), module.__dict__)  # noqa: S102 - trusted
        except Exception as exc:  # the package's code: anything can go wrong
            del sys.modules[module_name]
            raise CheckpointError(
                f"the package's file {module.__file__} failed to run: "
                f"{type(exc).__name__}: {exc}"
            ) from None
    return module


def _source_name(source: object) -> str:
    text = str(source).rstrip("/")
    return text.rsplit("/", 1)[-1]


def refuse_url(source: object, what: str) -> None:
    """Refuse a file that is a URL: nothing is downloaded at run time."""
    text = str(source)
    if text.startswith(("http://", "https://")):
        raise CheckpointError(
            f"the package's {what} is at {text}, and napari-finetune does not download; "
            "open the package's .zip with its files (bioimage.io's download button)."
        )
