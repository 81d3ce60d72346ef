"""Shared set-up of the bioimage.io tests: a tiny checkpoint, a volume, a network guard."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
import torch
from bioimageio.spec.utils import read_yaml, write_yaml

from napari_finetune.model.checkpoint import save_checkpoint
from napari_finetune.model.unet import UNet

CHANNELS = ["membrane", "mitochondria"]
RUN = {"steps": 3, "final_dtype": "float32", "painted_voxels": 1234}


def tiny_checkpoint(path: Path, normalization: dict | None = None, dims: int = 3) -> Path:
    """A depth-1 UNet (multiple 2) with the sample's channels and a run record."""
    torch.manual_seed(0)
    model = UNet(dims=dims, depth=1, features=4, out_channels=2)
    metadata = {"channel_names": CHANNELS, "run": dict(RUN)}
    if normalization:
        metadata["normalization"] = normalization
    return save_checkpoint(path, model, metadata)


def volume(shape: tuple[int, ...] = (12, 40, 40)) -> np.ndarray:
    """A smooth uint8 image with structure at several scales (not a constant tile)."""
    rng = np.random.default_rng(1)
    grid = np.meshgrid(*(np.linspace(0, 6, s) for s in shape), indexing="ij")
    smooth = np.sin(sum(grid)) * 60 + 120
    return np.clip(smooth + rng.normal(0, 15, shape), 0, 255).astype(np.uint8)


def export_package(tmp_path: Path, check: bool = False, **kwargs) -> Path:
    """The tiny checkpoint written as a bioimage.io package (not tested unless ``check``)."""
    from napari_finetune.bioimageio.export import export_bioimageio

    ckpt = tiny_checkpoint(tmp_path / "tiny.pt", kwargs.pop("normalization", None))
    image = kwargs.pop("image", None)
    return export_bioimageio(
        ckpt, tmp_path / "tiny.zip", volume() if image is None else image, check=check, **kwargs
    )


def unpack(package: Path, folder: Path) -> Path:
    """The package as a folder (the other form bioimage.io models come in)."""
    import zipfile

    with zipfile.ZipFile(package) as archive:
        archive.extractall(folder)
    return folder


def edit_rdf(folder: Path, change) -> Path:
    """Apply ``change(dict)`` to the folder package's ``rdf.yaml``."""
    rdf = folder / "rdf.yaml"
    content = read_yaml(rdf)
    change(content)
    write_yaml(content, rdf)
    return folder


def block_network(monkeypatch: pytest.MonkeyPatch) -> list:
    """Make every connection and DNS lookup fail; returns the record of attempts to check."""
    attempts: list = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("the tests run offline")

    monkeypatch.setattr(socket.socket, "connect", lambda self, *a: refuse(*a))
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts
