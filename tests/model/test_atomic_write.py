"""Checkpoint writes: a full disk is one clear line, a killed writer leaves nothing for long."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from napari_finetune.config import FinetuneConfig
from napari_finetune.model import checkpoint as ckpt_module
from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.trainer.loop import Finetuner


def _model():
    return UNet(dims=3, depth=1, features=8)


@pytest.fixture
def full_disk(tmp_path):
    """A real 128 KiB tmpfs (needs root and mount rights; skipped elsewhere)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mount_point)],
        capture_output=True,
    )
    if result.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here; the faked ENOSPC test covers the write")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=False)


def test_full_real_disk_is_one_line_naming_folder_and_space(full_disk):
    with pytest.raises(OSError) as info:
        save_checkpoint(full_disk / "m.pt", _model())
    exc = info.value
    assert exc.errno == errno.ENOSPC and exc.filename == str(full_disk)
    assert "not enough space to write m.pt (needs about" in exc.strerror
    assert "\n" not in str(exc)
    assert list(full_disk.iterdir()) == []


def test_torch_write_failure_becomes_enospc_and_the_trainer_exports_elsewhere(
    tmp_path, monkeypatch
):
    """torch reports a full disk as RuntimeError(... inline_container.cc ...): translated."""
    image = np.random.default_rng(0).random((8, 32, 32)).astype(np.float32)
    corrections = np.zeros(image.shape, np.uint8)
    corrections[4, 4:12, 4:12] = 1
    corrections[4, 16:24, 16:24] = 2
    model = UNet(dims=3, depth=1, features=4, out_channels=1)
    config = FinetuneConfig(steps=1, batch_size=1, patch_shape=(8, 16, 16), device="cpu")
    trainer = Finetuner(model, image, corrections, config)
    list(trainer.run())

    real_save = torch.save

    def disk_full_save(obj, handle, *args, **kwargs):
        handle.write(b"half a zip")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1024 vs 512")

    monkeypatch.setattr(ckpt_module.torch, "save", disk_full_save)
    with pytest.raises(OSError) as info:
        trainer.export(tmp_path / "out.pt")
    assert info.value.errno == errno.ENOSPC
    assert "not enough space to write out.pt" in info.value.strerror
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    monkeypatch.setattr(ckpt_module.torch, "save", real_save)
    elsewhere = trainer.export(tmp_path / "elsewhere.pt")
    assert load_checkpoint(elsewhere).metadata["run"]["steps_done"] == 1


def test_free_space_is_checked_before_writing(tmp_path, monkeypatch):
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(
        "napari_finetune.model.atomic_write.shutil.disk_usage",
        lambda _folder: usage._replace(free=1000),
    )
    with pytest.raises(OSError, match=r"needs about [0-9.]+ MB, 0.0 MB free"):
        save_checkpoint(tmp_path / "m.pt", _model())
    assert list(tmp_path.iterdir()) == []


KILLED_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from napari_finetune.model.checkpoint import save_checkpoint
    from napari_finetune.model.unet import UNet

    def hang(*args, **kwargs):  # the temporary is complete; the rename never comes
        print("writing", flush=True)
        time.sleep(600)

    os.replace = hang
    save_checkpoint(sys.argv[1], UNet(dims=3, depth=1, features=8))
    """
)


def _killed_writer(target: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(target)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()


@pytest.mark.resource  # SIGKILLs its writers
def test_temporaries_of_killed_writers_are_removed_by_the_next_save(tmp_path):
    target = tmp_path / "finetuned.pt"
    for _ in range(3):
        _killed_writer(target)
    # Each killed save removed its predecessor's temporary: one is left, not three.
    leftovers = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1 and not target.exists()
    other = tmp_path / f".other.pt.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp"
    other.write_bytes(b"another target's save")
    legacy_old = tmp_path / ".finetuned.pt.0123456789ab.tmp"
    legacy_old.write_bytes(b"from an older version")
    os.utime(legacy_old, (time.time() - 3600, time.time() - 3600))

    save_checkpoint(target, _model())
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["finetuned.pt", other.name])


def test_a_temporary_of_a_running_writer_is_kept(tmp_path):
    target = tmp_path / "m.pt"
    in_progress = tmp_path / f".m.pt.{os.getppid()}-abcdef012345.tmp"  # the parent runs
    in_progress.write_bytes(b"being written")
    save_checkpoint(target, _model())
    assert in_progress.exists()
