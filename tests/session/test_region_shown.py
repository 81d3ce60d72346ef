"""A prediction's view tiles reach the viewer as tiles: the whole layers are shown once.

The Session on the tiny store, run inline, its view cut into 16-tiles (several per
viewed slice); the viewer port keeps its own copies, so what it shows is only what
it was sent.
"""

from __future__ import annotations

import functools

import numpy as np

from napari_finetune.session import jobs
from napari_finetune.session.session import Outcome, Session
from napari_finetune.session.viewer import LayerKind


class CopyingViewer:
    """A viewer port holding copies: a region not sent is not in its layers."""

    def __init__(self) -> None:
        self.layers: dict[str, np.ndarray] = {}
        self.whole: list[str] = []  # show_layer's names, in order
        self.tiles: list[str] = []  # show_region's names, in order

    def shown_region(self) -> tuple[slice, ...] | None:
        return None

    def show_layer(self, name: str, data: np.ndarray, kind: LayerKind) -> None:
        self.layers[name] = np.array(data, copy=True)
        self.whole.append(name)

    def show_region(
        self, name: str, data: np.ndarray, region: tuple[slice, ...], kind: LayerKind,
    ) -> None:
        if name not in self.layers:
            self.layers[name] = np.zeros_like(data)
        self.layers[name][region] = data[region]
        self.tiles.append(name)


def test_each_view_tile_is_shown_as_a_tile_and_the_whole_layers_once(
        session: Session, monkeypatch):
    tiled = functools.partial(jobs.predict_job, view_tile=16)
    monkeypatch.setattr(jobs, "predict_job", tiled)
    viewer = CopyingViewer()
    session.viewer = viewer
    session.view = (slice(7, 8), slice(0, 40), slice(0, 40))
    ended: list = []
    session.events.ended.connect(ended.append)

    assert session.predict() is True
    assert ended and ended[-1].outcome is Outcome.DONE, ended
    tiles = len(jobs.view_tiles(session.view, 16))
    assert tiles > 1
    names = [f"prediction-{channel}" for channel in session.channel_names]
    for name in names:
        assert viewer.tiles.count(name) == tiles  # once per tile
        assert viewer.whole.count(name) == 1  # the finished prediction, not once per tile
    assert session.prediction is not None
    for name, mask in zip(names, session.prediction.masks, strict=True):
        np.testing.assert_array_equal(viewer.layers[name], mask)
