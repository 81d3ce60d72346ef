"""``napari-finetune train --nproc N``: torchrun started for the user, rank 0 speaks."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
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


def _train_with_ranks(store, model, out, *extra):
    """``train --nproc 2`` on real torchrun ranks (CPU, gloo); the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "napari_finetune.cli", "train", str(store), "-c", str(model),
         "-o", str(out), "--steps", "2", "--patch-shape", "8", "16", "16", "--batch-size", "1",
         "--device", "cpu", "-q", "--nproc", "2", *extra],
        capture_output=True, text=True, timeout=240,
    )


@pytest.mark.slow
def test_ranks_train_a_two_channel_model_or_one_channel_of_a_czyx_store(tmp_path):
    from napari_finetune.io.omezarr import save_corrections
    from test_cli_axes import SPATIAL, image_of, model_file, painted, write_store

    store = write_store(tmp_path / "czyx.zarr", np.stack([image_of(SPATIAL, 0),
                                                          image_of(SPATIAL, 1)]),
                        "czyx", ["DAPI", "GFP"])
    save_corrections(store, painted())
    both = tmp_path / "both.pt"
    result = _train_with_ranks(store, model_file(tmp_path / "m2.pt", 2), both)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("finished after 2/2 steps; exported") == 1
    metadata = load_checkpoint(both).metadata
    assert metadata["input_channels"] == ["DAPI", "GFP"] and metadata["input_axes"] == "czyx"
    assert metadata["run"]["ranks"] == 2 and metadata["run"]["ended"] == "finished"
    one = tmp_path / "one.pt"
    result = _train_with_ranks(store, model_file(tmp_path / "m1.pt"), one, "--channel", "1")
    assert result.returncode == 0, result.stderr
    metadata = load_checkpoint(one).metadata
    assert metadata["input_channels"] == ["GFP"] and metadata["run"]["ranks"] == 2


@pytest.mark.slow
def test_ranks_train_on_the_painted_time_points_of_a_tzyx_store(tmp_path):
    from napari_finetune.io.omezarr import save_corrections
    from test_cli_axes import SPATIAL, image_of, model_file, painted, write_store

    store = write_store(tmp_path / "tzyx.zarr",
                        np.stack([image_of(SPATIAL, seed) for seed in range(3)]), "tzyx")
    corrections = np.zeros((3, *SPATIAL), np.uint8)
    corrections[0] = painted()  # two time points painted, the middle one not
    corrections[2, 8, 10:20, 10:20] = 2
    save_corrections(store, corrections)
    out = tmp_path / "tuned.pt"
    result = _train_with_ranks(store, model_file(tmp_path / "m.pt"), out)
    assert result.returncode == 0, result.stderr
    run = load_checkpoint(out).metadata["run"]
    assert run["ranks"] == 2 and run["ended"] == "finished"
    assert run["painted_voxels"] == int((corrections > 0).sum())
