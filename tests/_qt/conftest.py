"""Fixtures for the dock widget: a tiny OME-Zarr store, a tiny UNet checkpoint, the docked widget.

Everything is real (ome-zarr-py store, torch model, napari viewer under Xvfb),
only small: a 16 x 64 x 64 volume and a 2-level UNet train at several steps
per second on two shared cores.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from qtpy.QtCore import Qt

SHAPE = (16, 64, 64)
CHANNELS = ["membrane", "mitochondria"]


@pytest.fixture(autouse=True)
def _user_settings_in_tmp(tmp_path_factory):
    """Every widget remembers its settings in a folder of this test, never the user's own:
    a developer whose napari runs on a scheduler must not send the tests there."""
    from qtpy.QtCore import QSettings

    from napari_finetune._qt.run_on import default_store

    real = Path(default_store().fileName()).parent.parent
    QSettings.setPath(QSettings.IniFormat, QSettings.UserScope,
                      str(tmp_path_factory.mktemp("settings")))
    yield
    QSettings.setPath(QSettings.IniFormat, QSettings.UserScope, str(real))


def make_volume(shape=SHAPE, seed: int = 0) -> np.ndarray:
    """Dark grid lines (membranes) and two bright blobs (mitochondria) on grey noise."""
    rng = np.random.default_rng(seed)
    z, y, x = np.indices(shape)
    image = 150 + 10 * rng.standard_normal(shape)
    image[(y % 16 < 2) | (x % 16 < 2)] = 60
    for cz, cy, cx in [(8, 24, 24), (8, 40, 44)]:
        image[(z - cz) ** 2 / 9 + (y - cy) ** 2 / 25 + (x - cx) ** 2 / 25 < 1] = 220
    return np.clip(image, 0, 255).astype(np.uint8)


@pytest.fixture
def tiny_store(tmp_path: Path) -> Path:
    """An NGFF 0.5 store written by ome-zarr-py: one ZYX image, no labels yet."""
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    path = tmp_path / "tiny.ome.zarr"
    store = parse_url(str(path), mode="w").store
    root = zarr.group(store=store)
    write_image(make_volume(), root, axes="zyx", scale_factors=[], storage_options={
        "chunks": (16, 32, 32)})
    return path


@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> Path:
    """A randomly initialised 3D UNet (depth 2, 4 features) with named channels."""
    import torch

    from napari_finetune.model.checkpoint import save_checkpoint
    from napari_finetune.model.unet import UNet

    torch.manual_seed(0)
    model = UNet(dims=3, in_channels=1, out_channels=2, depth=2, features=4)
    return save_checkpoint(tmp_path / "tiny_unet.pt", model, {
        "channel_names": CHANNELS,
        "normalization": {"method": "percentile", "low": 1.0, "high": 99.0},
    })


@pytest.fixture
def docked(make_napari_viewer, qtbot, tiny_store, tiny_checkpoint):
    """(viewer, widget, image layer): the store opened with the plugin's reader, widget docked."""
    viewer = make_napari_viewer()
    layers = viewer.open(str(tiny_store), plugin="napari-finetune")
    image = layers[0]
    assert image.metadata["ome_zarr_path"]
    widget = dock_panel(viewer, qtbot)
    choose_checkpoint(qtbot, widget, str(tiny_checkpoint))
    # The model read and the engine warmed up: a Predict clicked now starts at once (one
    # clicked earlier is kept until then, test_widget_early_click).
    qtbot.waitUntil(lambda: widget.state.info is not None and widget.state.warming == 0,
                    timeout=60_000)
    yield viewer, widget, image
    wait_idle(qtbot, widget)


def dock_panel(viewer, qtbot, timeout: int = 60_000):
    """Dock the widget as napari's Plugins menu does; its panel once built.

    The dock shows at once; the panel comes in a later event-loop turn, when its
    modules are imported (``napari_finetune._qt.widget``).
    """
    _, dock = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")
    assert dock.panel is None  # built in a later turn, never inside napari's docking
    # Back at the signal, before the panel's own later turns (its jobs' start): a test
    # sees the panel as a user's first click does.
    with qtbot.waitSignal(dock.panel_ready, timeout=timeout):
        pass
    return dock.panel


def choose_checkpoint(qtbot, widget, path) -> None:
    """Type ``path`` into the model field and press Return, as a user does."""
    edit = widget.checkpoint_edit
    edit.clear()
    qtbot.keyClicks(edit, str(path))
    qtbot.keyClick(edit, Qt.Key_Return)


def wait_idle(qtbot, widget, timeout: int = 120_000) -> None:
    """Wait for the widget's job and any autosave to end (no worker outlives a test)."""
    # A kept click (Predict before the model was there) is work to come, not idleness.
    qtbot.waitUntil(lambda: widget.state.busy is None and not widget.state.queued,
                    timeout=timeout)
    saver = widget.state.autosaver
    if saver is not None:
        saver.timer.stop()
        qtbot.waitUntil(lambda: saver.in_flight == 0, timeout=timeout)
    qtbot.waitUntil(lambda: widget.state.running == 0 and widget.state.busy is None,
                    timeout=timeout)

