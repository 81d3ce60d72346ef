"""The models shipped with the package, by the short name a user types for them.

``napari-finetune train -c starter`` and the panel's model menu take these names, so a
user does not have to find the files inside the installed package. A file of that
name in the working folder still wins: a path a user gives is never reinterpreted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ShippedModel:
    """One model file of the package and what it is for, in a user's words."""

    file: str
    about: str

    @property
    def path(self) -> Path:
        """Where the file is in the installed package."""
        return Path(__file__).with_name(self.file)


SHIPPED = {
    "sample": ShippedModel(
        "synthetic_em_unet.pt",
        "EM, channels membrane and mitochondria: the model of the napari sample"),
    "starter": ShippedModel(
        "starter_unet.pt",
        "any microscope, channels boundaries and objects: fluorescent nuclei and cells as "
        "well as EM, anisotropic voxels; the start for a volume unlike the sample"),
}


def shipped_model(name: str) -> Path | None:
    """The shipped file ``name`` stands for, or None when it names none (or a file of
    that name exists, which is then what the user means)."""
    model = SHIPPED.get(name.strip().lower())
    if model is None or Path(name).exists():
        return None
    return model.path
