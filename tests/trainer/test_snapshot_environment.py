"""The allocator snapshot on out-of-memory, and the run's environment on record."""

from __future__ import annotations

import platform
import socket

import pytest
import torch
from engine_setup import make_trainer

from napari_finetune import __version__, testing
from napari_finetune.model.checkpoint import load_checkpoint
from napari_finetune.trainer.environment import describe_environment, run_environment
from napari_finetune.trainer.snapshot import VIEWER, MemoryHistory, oom_path


def test_no_snapshot_asked_for_says_nothing():
    history = MemoryHistory(None, torch.device("cuda"))
    assert history.start() == "" and history.dump_first_oom() == "" and history.finish() == ""


def test_the_real_cpu_path_is_one_line_and_no_file(tmp_path):
    path = tmp_path / "memory.pickle"
    trainer = make_trainer(steps=2, batch_size=4, memory_snapshot=str(path))
    trainer.build()
    testing.oom_above_batch(trainer.model, 2, times=1)
    events = list(trainer.run())
    lines = [e.message for e in events if "memory snapshot" in e.message]
    assert lines == [
        f"memory snapshot: the allocator history exists on CUDA only; nothing is written to "
        f"{path} on cpu"
    ]
    assert events[-1].kind == "finished" and not list(tmp_path.iterdir())


def test_snapshots_at_the_first_oom_and_at_the_end(tmp_path):
    path = tmp_path / "snaps" / "memory.pickle"
    trainer = make_trainer(steps=3, batch_size=8, memory_snapshot=str(path))
    # The trainer trains on the CPU; its history behaves as on a CUDA device
    # (an index-less one, as the trainer builds it).
    trainer.memory_history = MemoryHistory(str(path), torch.device("cuda"))
    trainer.build()
    testing.oom_above_batch(trainer.model, 4, times=1)  # one OOM, in the probe
    with testing.FakeCuda() as cuda:
        events = list(trainer.run())
    assert cuda.history[0] == ("record", "all", 200_000)
    assert cuda.history[1:3] == [("dump", str(oom_path(path))), ("dump", str(path))]
    assert cuda.history[3][:2] == ("record", None) and len(cuda.history) == 4
    assert oom_path(path).name == "memory.oom.pickle"
    assert oom_path(path).is_file() and path.is_file()
    messages = [e.message for e in events]
    assert (
        f"memory snapshot of the first out-of-memory written to {oom_path(path)}: open it at "
        f"{VIEWER}" in messages
    )
    assert events[-1].message == (
        f"finished 3 steps; memory snapshot at the end of the run written to {path}: open it "
        f"at {VIEWER}"
    )
    assert VIEWER == "https://pytorch.org/memory_viz"
    run = load_checkpoint(trainer.export(tmp_path / "out.pt")).metadata["run"]
    assert run["memory"]["memory_snapshots"] == [str(oom_path(path)), str(path)]


def test_a_failed_run_still_writes_the_end_snapshot(tmp_path):
    path = tmp_path / "memory.pickle"
    trainer = make_trainer(steps=2, batch_size=1, memory_snapshot=str(path))
    trainer.memory_history = MemoryHistory(str(path), torch.device("cuda"))
    trainer.build()
    testing.always_oom(trainer.model)
    with testing.FakeCuda() as cuda:
        try:
            list(trainer.run())
        except RuntimeError:
            pass
    assert [c[0] for c in cuda.history] == ["record", "dump", "dump", "record"]
    assert path.is_file() and oom_path(path).is_file()


def test_a_torch_without_the_api_is_one_line(monkeypatch, tmp_path):
    def missing(*_args, **_kwargs):
        raise AttributeError("module has no attribute '_record_memory_history'")

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", missing)
    history = MemoryHistory(str(tmp_path / "m.pickle"), torch.device("cuda"))
    line = history.start()
    assert line.startswith("memory snapshot: this PyTorch (") and "nothing is written" in line
    assert history.dump_first_oom() == "" and history.finish() == ""


def test_the_run_record_names_the_environment(tmp_path):
    trainer = make_trainer(steps=1, batch_size=2)
    list(trainer.run())
    run = load_checkpoint(trainer.export(tmp_path / "env.pt")).metadata["run"]
    env = run["environment"]
    assert env["python"] == platform.python_version()
    assert env["torch"] == str(torch.__version__)
    assert env["napari_finetune"] == __version__
    assert env["host"] == socket.gethostname()
    assert env["device"]["type"] == "cpu" and env["device"]["name"]
    assert env["device"]["capability"] is None and env["device"]["total_memory_bytes"] > 0


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_device_description(device):
    with testing.FakeCuda(total_bytes=150_000_000_000, name="NVIDIA H200", capability=(9, 0)):
        env = run_environment(device)
    assert env["device"] == {
        "type": "cuda",
        "name": "NVIDIA H200",
        "capability": "9.0",
        "total_memory_bytes": 150_000_000_000,
    }
    line = describe_environment(env)
    assert "device cuda NVIDIA H200 (capability 9.0, 139.7 GiB)" in line
    assert f"torch {torch.__version__}" in line and f"python {platform.python_version()}" in line
