"""bioimage.io model packages: open one as a checkpoint, write a checkpoint as one.

bioimage.io (https://bioimage.io) is the model zoo through which ilastik,
deepImageJ, micro-sam, cellpose and torch-em exchange models. A model package is
a folder, or a ``.zip`` of it, with a description (``rdf.yaml`` or
``bioimageio.yaml``), weights and test tensors.

- :func:`is_bioimageio_package` tells a package from a napari-finetune checkpoint
  without importing ``bioimageio.spec`` (:mod:`napari_finetune.loading` asks it first).
- :mod:`~napari_finetune.bioimageio.load` reads a package with
  ``pytorch_state_dict`` weights into a :class:`~napari_finetune.model.checkpoint.Checkpoint`.
- :mod:`~napari_finetune.bioimageio.export` writes a checkpoint as a package.

``bioimageio.spec`` (and ``bioimageio.core`` for the test of a written package)
are imported only on those paths: the optional extra ``napari-finetune[bioimageio]``
installs them. Nothing here goes to the network: descriptions are read with
``perform_io_checks=False`` and files that are URLs are refused.
"""

from __future__ import annotations

import importlib.util
import os
import zipfile
from pathlib import Path

INSTALL_HINT = "pip install 'napari-finetune[bioimageio]'"

# The names a package's description may have (bioimageio.spec accepts these two
# and any ``*.bioimageio.yaml``).
YAML_NAMES = ("bioimageio.yaml", "rdf.yaml")
YAML_SUFFIX = ".bioimageio.yaml"


def is_description_name(name: str) -> bool:
    """Whether a file name is that of a bioimage.io description."""
    return name in YAML_NAMES or name.endswith(YAML_SUFFIX)


def is_bioimageio_package(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a bioimage.io package: a folder or ``.zip`` with a description.

    A description file itself (``.../rdf.yaml``) counts too. Cheap: a zip is
    recognised by its table of contents (a napari-finetune ``.pt`` is a zip too,
    without such a file).
    """
    path = Path(path)
    if path.is_dir():
        return any(p.is_file() and is_description_name(p.name) for p in path.iterdir())
    if not path.is_file():
        return False
    if is_description_name(path.name):
        return True
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            return any(
                "/" not in name and is_description_name(name) for name in archive.namelist()
            )
    except (zipfile.BadZipFile, OSError):
        return False


def require(module: str, error: type[Exception], task: str) -> None:
    """Raise ``error`` with an install hint when ``module`` is not installed.

    Parameters
    ----------
    module : str
        ``"bioimageio.spec"`` or ``"bioimageio.core"``.
    error : type
        The caller's one-line error type (a ``ValueError`` the CLI prints as is).
    task : str
        What needs it, for the message ("opening a bioimage.io package").
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent namespace "bioimageio" is missing too
        found = False
    if not found:
        raise error(f"{task} needs the {module} package: {INSTALL_HINT}")


__all__ = ["require", "YAML_NAMES", "is_bioimageio_package", "is_description_name"]
