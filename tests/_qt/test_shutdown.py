"""Closing napari mid-run or right after a stroke: exit code 0 and the painting on disk.

Each case is its own napari process (``shutdown_app.py``) on the test's
Xvfb display, with a tiny store and a tiny UNet; the store is then read back
with the project's own readers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests._qt.conftest import CHANNELS, SHAPE, make_volume

APP = Path(__file__).with_name("shutdown_app.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(case: str, store: Path, checkpoint: Path, out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]
    )
    env["OMP_NUM_THREADS"] = "1"  # tiny model: threads only add start-up and spinning
    return subprocess.run(
        [sys.executable, str(APP), case, str(store), str(checkpoint), str(out)],
        capture_output=True, text=True, timeout=240, env=env, cwd=str(out),
    )


def _check_store(store: Path, out: Path) -> None:
    from napari_finetune.io.omezarr import list_labels, load_corrections, open_volume

    assert list_labels(store) == ["corrections"]
    expected = np.load(out / "expected.npy")
    assert np.count_nonzero(expected) > 0
    np.testing.assert_array_equal(load_corrections(store), expected)
    np.testing.assert_array_equal(np.asarray(open_volume(store).data), make_volume())


@pytest.fixture
def slower_checkpoint(tmp_path: Path) -> Path:
    """The default 3D UNet (1.6 M parameters): a step takes long enough to be cut by an exit."""
    import torch

    from napari_finetune.model.checkpoint import save_checkpoint
    from napari_finetune.model.unet import UNet

    torch.manual_seed(0)
    return save_checkpoint(tmp_path / "unet.pt", UNet(dims=3, out_channels=2),
                           {"channel_names": CHANNELS})


@pytest.mark.parametrize("case", [
    "close-mid-run", "quit-mid-run", "stroke-then-close", "remove-dock-mid-run",
    "close-then-exit", "close-mid-predict", "exit-without-close",
])
def test_shutdown_case_exits_0_with_the_painting_saved(case, tiny_store, tiny_checkpoint,
                                                      slower_checkpoint, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    checkpoint = (slower_checkpoint if case in ("close-then-exit", "close-mid-predict")
                  else tiny_checkpoint)
    result = _run(case, tiny_store, checkpoint, out)
    log = f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}"
    assert result.returncode == 0, log
    assert "event loop ended" in result.stdout, log
    assert "has been deleted" not in result.stderr and "Traceback" not in result.stderr, log
    if case not in ("stroke-then-close", "close-mid-predict", "exit-without-close"):
        assert "'step'" in result.stdout, log  # it was training when it ended
    if case == "remove-dock-mid-run":
        # The run ended at its next step (quit()), long before its 100 000 steps.
        assert "run ended" in result.stdout and "'finished'" not in result.stdout, log
    _check_store(tiny_store, out)


def test_an_autosaver_whose_timer_qt_deleted_still_saves_at_close(qtbot, tiny_store):
    """PyQt destroys the Python-owned QObjects of a script that ends with napari open in
    no order: the autosaver's QTimer can be gone when the widget's ``destroyed`` handler
    closes the saver. Its ``timer.stop()`` raised there, and PyQt aborted the process
    (exit 134) with the painting unsaved."""
    from napari.layers import Labels
    from qtpy import sip

    from napari_finetune._qt.corrections import Autosaver
    from napari_finetune.io.omezarr import load_corrections

    layer = Labels(np.zeros(SHAPE, dtype=np.uint8))
    saver = Autosaver(layer, str(tiny_store), CHANNELS, save=lambda *a, **k: False)
    layer.paint((8, 20, 20), 2)  # starts the timer: a save pending
    sip.delete(saver.timer)  # what PyQt's exit does
    assert not saver.pending
    assert saver.close() is True
    np.testing.assert_array_equal(load_corrections(tiny_store), np.asarray(layer.data))
