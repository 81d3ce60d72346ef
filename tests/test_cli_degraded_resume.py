"""A checkpoint from a degraded run: explicit settings win, ``--fresh`` ignores it all.

The degraded state (smaller batch, fp32, distillation and hold dropped) a run
ended in is saved with its export so the next run does not run out of memory
the same way. It must never override what the user set on the command line.
"""

from __future__ import annotations

import numpy as np
import pytest

from napari_finetune.io.omezarr import save_corrections
from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint
from napari_finetune.model.unet import UNet
from test_cli import CHANNELS, make_store, run_cli

# No --batch-size here: whether the batch was set is what these tests are about.
FAST = ["--patch-shape", "8", "16", "16", "--device", "cpu", "-q"]
DEGRADED_RUN = {
    "steps_done": 3,
    "degraded": {
        "device_type": "cpu",
        "batch_size": 1,
        "fell_back_to_fp32": False,
        "distillation_dropped": True,
    },
}


@pytest.fixture
def degraded(tmp_path):
    """(painted store, checkpoint whose previous run ended at batch 1 without distillation)."""
    store = make_store(tmp_path / "vol.zarr")
    corrections = np.zeros((16, 40, 40), np.uint8)
    corrections[4, 5:15, 5:15] = 1
    corrections[4, 20:25, 20:30] = 2
    save_corrections(store, corrections)
    model = UNet(dims=3, depth=2, features=4, out_channels=2)
    metadata = {"channel_names": CHANNELS, "run": DEGRADED_RUN}
    return store, save_checkpoint(tmp_path / "model.pt", model, metadata)


def _train(capsys, tmp_path, degraded, *options):
    store, checkpoint = degraded
    out = tmp_path / "out.pt"
    code, out_text, err = run_cli(
        capsys, "train", store, "-c", checkpoint, "-o", out, *FAST, "--steps", "1",
        *options,
    )
    assert code == 0, err
    return load_checkpoint(out).metadata["run"], out_text + err


def test_explicit_settings_win_over_the_degraded_state(capsys, tmp_path, degraded):
    run, err = _train(
        capsys, tmp_path, degraded, "--batch-size", "4", "--distillation", "0.5"
    )
    assert (run["batch_size"], run["accumulation"]) == (4, 1)
    assert run["distillation"] == "on"
    # the hold on the other channels was not set, so the resumed drop applies to it
    assert run["hold_other_channels"] == "dropped"
    assert "kept batch_size=4 and distillation=0.5 as set" in err
    assert any("kept batch_size=4" in line for line in run["recovery_log"])


def test_without_explicit_settings_the_degraded_state_is_resumed(capsys, tmp_path, degraded):
    run, err = _train(capsys, tmp_path, degraded, "--batch-size", "4", "--fresh")
    assert (run["batch_size"], run["distillation"]) == (4, "on")
    assert run["hold_other_channels"] == "on"
    assert "was not resumed (fresh start)" in err

    run, err = _train(capsys, tmp_path, degraded)
    assert run["batch_size"] == 1 and run["distillation"] == "dropped"
    assert "resumed the previous run's degraded state" in err
