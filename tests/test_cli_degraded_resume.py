"""A checkpoint from a degraded run: explicit settings win, ``--fresh`` ignores it all.

The degraded state (smaller batch, fp32, distillation and hold dropped) a run
ended in is saved with its export so the next run does not run out of memory
the same way. It must never override what the user set on the command line.
"""

from __future__ import annotations

import pytest

from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint
from test_cli import run_cli

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
def degraded(painted_store, checkpoint):
    """(painted store, checkpoint whose previous run ended at batch 1 without distillation)."""
    start = load_checkpoint(checkpoint)
    metadata = {**start.metadata, "run": DEGRADED_RUN}
    return painted_store, save_checkpoint(checkpoint, start.model, metadata)


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
    # This model gets the test's painting mostly wrong: without --no-distillation-check
    # the run would train without distillation for that reason (test_teacher_agreement).
    run, err = _train(capsys, tmp_path, degraded, "--batch-size", "4", "--fresh",
                      "--no-distillation-check")
    assert (run["batch_size"], run["distillation"]) == (4, "on")
    assert run["hold_other_channels"] == "on"
    assert "was not resumed (fresh start)" in err

    run, err = _train(capsys, tmp_path, degraded)
    assert run["batch_size"] == 1 and run["distillation"] == "dropped"
    assert "resumed the previous run's degraded state" in err
