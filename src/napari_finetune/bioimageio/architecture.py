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
  ``--trust-factory``), the same way as an unknown factory
  (:mod:`~napari_finetune.bioimageio.source_file`).
"""

from __future__ import annotations

from typing import Any

from bioimageio.spec.model import v0_5
from torch import nn

from napari_finetune.bioimageio.source_file import build_from_source, trust_name, untrusted_source
from napari_finetune.errors import first_line
from napari_finetune.model.architectures import Trust, trusted_names
from napari_finetune.model.factory import CheckpointError, build_model

PackageArchitecture = v0_5.ArchitectureFromLibraryDescr | v0_5.ArchitectureFromFileDescr


def file_trust_name(arch: v0_5.ArchitectureFromFileDescr) -> str:
    """``"<file name>:<callable>"``: how the user trusts a package's source file."""
    return trust_name(_source_name(arch.source), str(arch.callable))


def architecture_dict(arch: PackageArchitecture) -> dict[str, Any]:
    """``{"factory": ..., "kwargs": ...}`` as a checkpoint records it."""
    if isinstance(arch, v0_5.ArchitectureFromLibraryDescr):
        factory = f"{arch.import_from}:{arch.callable}"
    elif isinstance(arch, v0_5.ArchitectureFromFileDescr):
        factory = file_trust_name(arch)
    else:
        raise CheckpointError(f"unknown bioimage.io architecture description {type(arch).__name__}")
    return {"factory": factory, "kwargs": dict(arch.kwargs)}


def trusted_source(
    arch: PackageArchitecture, architecture: dict[str, Any], trust: Trust = None
) -> dict[str, str] | None:
    """The package's own architecture file, ``{"name", "callable", "code"}``, once the user
    trusts it; None for a library callable (the allow-list decides when it is built).

    Raises
    ------
    CheckpointError
        A file the user has not trusted (refused before the file is even read; the
        message says how to trust it), or one that cannot be read.
    """
    if not isinstance(arch, v0_5.ArchitectureFromFileDescr):
        return None
    if architecture["factory"] not in trusted_names(trust):
        raise untrusted_source(_source_name(arch.source), str(arch.callable))
    return source_record(arch)


def build_package_model(
    architecture: dict[str, Any], source: dict[str, str] | None, trust: Trust = None
) -> nn.Module:
    """The model of ``architecture``: built from the package's own file ``source`` (see
    :func:`trusted_source`), or from a library callable under the allow-list.

    The last step of reading a package, and the only one on the model floor, so a
    package's path walks down once.

    Raises
    ------
    CheckpointError
        A library callable that is not allowed or not installed, or a source
        file that fails to run or builds no module.
    """
    if source is not None:
        return build_from_source(source, architecture["kwargs"], trust)
    return build_model(architecture, trust=trust)


def source_record(arch: v0_5.ArchitectureFromFileDescr, code: str | None = None) -> dict[str, str]:
    """``{"name", "callable", "code"}`` of a package's architecture file (read unless given)."""
    return {
        "name": _source_name(arch.source),
        "callable": str(arch.callable),
        "code": read_source(arch) if code is None else code,
    }


def read_source(arch: v0_5.ArchitectureFromFileDescr) -> str:
    """The text of the package's architecture file (refused if it is a URL)."""
    return read_package_file(arch, "architecture file").decode("utf-8")


def read_package_file(
    descr: v0_5.ArchitectureFromFileDescr | v0_5.FileDescr, what: str
) -> bytes:
    """The bytes of one of the package's files: refused if it is a URL, one line if unreadable."""
    refuse_url(descr.source, what)
    try:
        return descr.get_reader().read()
    except Exception as exc:  # noqa: BLE001 - missing, a SHA-256 or zip CRC mismatch
        raise CheckpointError(f"cannot read the package's {what}: {first_line(exc)}") from None


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
