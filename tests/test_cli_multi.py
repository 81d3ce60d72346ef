"""``napari-finetune train --nproc N``: torchrun started for the user, rank 0 speaks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from napari_finetune.cli.multi import without_nproc
from napari_finetune.model.checkpoint import load_checkpoint
from test_cli import assert_one_line_error, run_cli


def test_the_relaunched_command_drops_nproc_only():
    argv = ["train", "v.zarr", "--nproc", "2", "-c", "m.pt", "--nproc=3", "--steps", "2"]
    assert without_nproc(argv) == ["train", "v.zarr", "-c", "m.pt", "--steps", "2"]


def test_nproc_below_one_is_a_one_line_error(capsys, tmp_path, painted_store, checkpoint):
    code, _, err = run_cli(
        capsys, "train", painted_store, "-c", checkpoint, "-o", tmp_path / "o.pt", "--nproc", "0"
    )
    assert_one_line_error(code, err)
    assert "--nproc 0" in err


@pytest.mark.slow
def test_train_with_two_processes_exports_once_with_the_ranks(tmp_path, painted_store, checkpoint):
    out = tmp_path / "tuned.pt"
    result = subprocess.run(
        [sys.executable, "-m", "napari_finetune.cli", "train", str(painted_store), "-c",
         str(checkpoint), "-o", str(out), "--steps", "2", "--patch-shape", "8", "16", "16",
         "--batch-size", "2", "--device", "cpu", "-q", "--nproc", "2", "--global-samples", "4"],
        capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert "2 processes × 2 samples" in result.stdout
    assert result.stdout.count("finished after 2/2 steps; exported") == 1  # rank 0 alone
    run = load_checkpoint(out).metadata["run"]
    assert run["ranks"] == 2 and run["samples_per_step"] == 2
    assert run["samples_per_step_all_ranks"] == 4 and run["ended"] == "finished"
