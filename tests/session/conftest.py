"""Fixtures of the Session tests: a painted tiny store, its image, a recording viewer.

Everything real and small (the 16 x 40 x 40 store and the depth-2 UNet of
tests/conftest.py); no Qt, no napari viewer.
"""

from __future__ import annotations

import numpy as np
import pytest

from napari_finetune.config import FinetuneConfig
from napari_finetune.session.runner import InlineRunner
from napari_finetune.session.session import Session
from napari_finetune.session.viewer import LayerKind

CHANNELS = ["membrane", "mitochondria"]


class RecordingViewer:
    """A :class:`~napari_finetune.session.viewer.ViewerPort` that keeps what it was shown."""

    def __init__(self, region: tuple[slice, ...] | None = None) -> None:
        self.region = region
        self.layers: dict[str, tuple[np.ndarray, LayerKind]] = {}
        self.shown: list[str] = []
        self.regions: list[tuple[str, tuple[slice, ...]]] = []  # show_region's, in order

    def shown_region(self) -> tuple[slice, ...] | None:
        return self.region

    def show_layer(self, name: str, data: np.ndarray, kind: LayerKind) -> None:
        self.layers[name] = (data, kind)
        self.shown.append(name)

    def show_region(
        self, name: str, data: np.ndarray, region: tuple[slice, ...], kind: LayerKind,
    ) -> None:
        if name in self.layers and self.layers[name][0].shape == data.shape:
            self.layers[name][0][region] = data[region]
        else:
            self.layers[name] = (data, kind)
        self.regions.append((name, region))


def tiny_config(steps: int = 2) -> FinetuneConfig:
    """A run of ``steps`` full fine-tuning steps on the CPU, one sample a step."""
    return FinetuneConfig(steps=steps, batch_size=1, mode="full", device="cpu",
                          patch_shape=(16, 32, 32))


@pytest.fixture
def session(painted_store, checkpoint) -> Session:
    """A session on the painted store with the tiny checkpoint, run inline, a recording viewer."""
    from napari_finetune.io.omezarr import load_corrections, open_volume

    return Session(
        InlineRunner(), viewer=RecordingViewer((slice(0, 16), slice(0, 32), slice(0, 32))),
        image=np.asarray(open_volume(painted_store).data), checkpoint=str(checkpoint),
        corrections=np.asarray(load_corrections(painted_store)), store=str(painted_store),
        channel_names=list(CHANNELS), config=tiny_config(),
    )


@pytest.fixture
def record(session: Session) -> dict[str, list]:
    """Every busy change, refusal, end and run status the session signals, in order."""
    got: dict[str, list] = {"busy": [], "refused": [], "ended": [], "status": []}
    for name, items in got.items():
        getattr(session.events, name).connect(items.append)
    return got
