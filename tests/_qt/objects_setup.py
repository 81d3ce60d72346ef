"""The tiny model of the conftest with a role for each channel, for the Objects tests."""

from __future__ import annotations

from pathlib import Path

from tests._qt.conftest import CHANNELS

from napari_finetune.objects import ChannelRole, roles_to_metadata

# Thresholds that cut the tiny random UNet's probabilities (membrane ~0.12-0.81,
# mitochondria ~0.11-0.91) into a few dozen regions each, so the counts mean something.
ROLES = {
    "membrane": ChannelRole("boundary", threshold=0.41, min_size=20, seed_distance=2.0),
    "mitochondria": ChannelRole("object", threshold=0.62, min_size=5),
}
LAYER_NAMES = {"membrane": "cells", "mitochondria": "mitochondria objects"}


def save_tiny_unet(path: Path, roles: dict[str, ChannelRole]) -> Path:
    """The conftest's tiny UNet (seed 0) with ``roles`` in its metadata."""
    import torch

    from napari_finetune.model.checkpoint import save_checkpoint
    from napari_finetune.model.unet import UNet

    torch.manual_seed(0)
    model = UNet(dims=3, in_channels=1, out_channels=2, depth=2, features=4)
    return save_checkpoint(path, model, roles_to_metadata(roles, {
        "channel_names": CHANNELS,
        "normalization": {"method": "percentile", "low": 1.0, "high": 99.0},
    }))
