"""The command line's memory options, its environment header and ``info``'s environment."""

from __future__ import annotations

import platform

import torch

from napari_finetune import __version__
from napari_finetune.model.checkpoint import load_checkpoint
from test_cli import TRAIN_FAST, assert_one_line_error, run_cli


def test_train_prints_the_environment_and_the_memory_lines(
    capsys, tmp_path, painted_store, checkpoint
):
    out, snap = tmp_path / "tuned.pt", tmp_path / "memory.pickle"
    code, stdout, err = run_cli(
        capsys, "train", painted_store, "-c", checkpoint, "-o", out, "--steps", "1",
        "--autobatch", "--memory-fraction", "0.5", "--memory-snapshot", snap, *TRAIN_FAST,
    )
    assert code == 0, err
    header = stdout.splitlines()[0]
    assert header.startswith(f"napari-finetune {__version__}, python {platform.python_version()}")
    assert f"torch {torch.__version__}, device cpu" in header and ", host " in header
    assert "memory snapshot: the allocator history exists on CUDA only" in stdout
    assert "autobatch: keeping micro-batch 2 × accumulation 1 (2 per step): cpu gives no" in stdout
    assert not snap.exists()
    run = load_checkpoint(out).metadata["run"]
    assert run["config"]["memory_fraction"] == 0.5 and run["config"]["autobatch"] is True
    assert run["config"]["memory_snapshot"] == str(snap)
    assert run["environment"]["torch"] == str(torch.__version__)

    code, stdout, _ = run_cli(capsys, "info", out)
    assert code == 0
    assert f"trained with:  napari-finetune {__version__}, python" in stdout
    assert "device cpu" in stdout


def test_info_without_a_checkpoint_describes_this_machine(capsys):
    code, stdout, _ = run_cli(capsys, "info", "--device", "cpu")
    assert code == 0
    assert stdout.startswith(f"this machine: napari-finetune {__version__}, python ")
    assert f"torch {torch.__version__}, device cpu" in stdout


def test_bad_memory_options_are_one_line(capsys, tmp_path, painted_store, checkpoint):
    out = tmp_path / "tuned.pt"
    code, _, err = run_cli(
        capsys, "train", painted_store, "-c", checkpoint, "-o", out,
        "--memory-snapshot", tmp_path / "no" / "such" / "m.pickle", *TRAIN_FAST,
    )
    assert_one_line_error(code, err)
    assert "folder of --memory-snapshot does not exist" in err
    code, _, err = run_cli(
        capsys, "train", painted_store, "-c", checkpoint, "-o", out,
        "--memory-fraction", "1.5", *TRAIN_FAST,
    )
    assert_one_line_error(code, err)
    # The range the widget's input shares (config_fields), checked before the run starts.
    assert "memory_fraction must be between 0.05 and 1, got 1.5" in err
