"""The architecture allow-list: a checkpoint file never makes the loader run code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from napari_finetune.model.architectures import is_allowed, resolve_factory
from napari_finetune.model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from napari_finetune.model.unet import UNet


def hostile_checkpoint(path: Path, victim: Path, factory: str = "subprocess:run") -> Path:
    """A well-formed checkpoint whose architecture names ``subprocess.run(["touch", victim])``."""
    payload = {
        "format": "napari-finetune-checkpoint",
        "format_version": 1,
        "architecture": {"factory": factory, "kwargs": {"args": ["touch", str(victim)]}},
        "state_dict": {},
        "metadata": {},
    }
    torch.save(payload, path)
    # The attack needs nothing but plain data: weights_only=True reads it.
    assert torch.load(path, weights_only=True)["architecture"]["factory"] == factory
    return path


def test_load_checkpoint_refuses_a_factory_off_the_allow_list(tmp_path):
    victim = tmp_path / "pwned"
    path = hostile_checkpoint(tmp_path / "evil.pt", victim)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert not victim.exists()
    assert len(message.splitlines()) == 1
    assert "subprocess:run" in message and "trust" in message


def test_refusal_happens_before_any_import(tmp_path):
    # A module is code too: naming one that is not imported yet must not import it.
    victim = tmp_path / "pwned"
    path = hostile_checkpoint(tmp_path / "evil.pt", victim, factory="antigravity:fly")
    with pytest.raises(CheckpointError, match="antigravity:fly"):
        load_checkpoint(path)
    assert "antigravity" not in sys.modules


def test_info_command_refuses_it_in_a_real_process(tmp_path):
    victim = tmp_path / "pwned"
    path = hostile_checkpoint(tmp_path / "evil.pt", victim)
    cli = [sys.executable, "-m", "napari_finetune.cli"]
    done = subprocess.run([*cli, "info", str(path)], capture_output=True, text=True, timeout=120)
    assert not victim.exists()
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "subprocess:run" in lines[0] and "--trust-factory subprocess:run" in lines[0]
    # Trusted explicitly, the factory is called (and then the file is judged as usual).
    trusted = subprocess.run(
        [*cli, "info", str(path), "--trust-factory", "subprocess:run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert victim.exists()
    assert "Traceback" not in trusted.stderr


def test_trust_argument_loads_what_it_names_and_nothing_else(tmp_path):
    victim = tmp_path / "pwned"
    path = hostile_checkpoint(tmp_path / "evil.pt", victim)
    with pytest.raises(CheckpointError):
        load_checkpoint(path, trust=["os:system", "subprocess"])  # a module is not a callable
    assert not victim.exists()
    with pytest.raises(CheckpointError, match="not a torch.nn.Module"):
        load_checkpoint(path, trust=["subprocess:run"])
    assert victim.exists()  # trusted: the user asked for it


def test_own_unet_loads_without_trust(tmp_path):
    model = UNet(dims=2, depth=1, features=4).eval()
    loaded = load_checkpoint(save_checkpoint(tmp_path / "m.pt", model))
    assert isinstance(loaded.model, UNet)


def test_allow_list_names():
    assert is_allowed("napari_finetune.model.unet:UNet")
    assert is_allowed("monai.networks.nets:BasicUNet")
    assert is_allowed("monai.networks.nets.unet:UNet")
    assert is_allowed("torch_em.model:AnisotropicUNet")
    assert not is_allowed("monai.networks.nets:__builtins__")
    assert not is_allowed("builtins:eval")
    assert not is_allowed("napari_finetune.model.checkpoint:save_checkpoint")
    assert is_allowed("my.pkg:build", trust=["my.pkg:build"])
    assert resolve_factory("napari_finetune.model.unet:UNet") is UNet


def test_entry_point_registrations_are_allowed(tmp_path, monkeypatch):
    # A real installed distribution (a .dist-info on sys.path) registering a factory.
    pkg = tmp_path / "site"
    (pkg / "fancy_nets").mkdir(parents=True)
    (pkg / "fancy_nets" / "__init__.py").write_text(
        "from torch import nn\n\ndef tiny(width=2):\n    return nn.Conv2d(1, width, 3)\n"
    )
    info = pkg / "fancy_nets-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fancy-nets\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[napari_finetune.architectures]\ntiny = fancy_nets:tiny\n"
    )
    monkeypatch.syspath_prepend(str(pkg))
    assert is_allowed("fancy_nets:tiny")
    assert not is_allowed("fancy_nets:nn")
    model = torch.nn.Conv2d(1, 3, 3)
    architecture = {"factory": "fancy_nets:tiny", "kwargs": {"width": 3}}
    path = save_checkpoint(tmp_path / "m.pt", model, architecture=architecture)
    assert load_checkpoint(path).model.out_channels == 3


def test_a_class_argument_is_resolved_through_the_allow_list(tmp_path):
    # Constructor arguments that name a class are plain strings in the file; they pass
    # the same check as the factory, before anything is imported.
    victim = tmp_path / "pwned"
    payload = {
        "format": "napari-finetune-checkpoint",
        "format_version": 1,
        "architecture": {
            "factory": "napari_finetune.model.unet:UNet",
            "kwargs": {"dims": "antigravity:fly"},
            "callable_kwargs": ["dims"],
        },
        "state_dict": {},
        "metadata": {},
    }
    path = tmp_path / "evil.pt"
    torch.save(payload, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "argument 'dims'" in message
    assert "--trust-factory antigravity:fly" in message
    assert "antigravity" not in sys.modules and not victim.exists()


class Block(torch.nn.Conv2d):
    """A class passed as a constructor argument (like torch-em's conv_block_impl)."""


class WithBlock(torch.nn.Module):
    def __init__(self, block: type = Block, width: int = 2) -> None:
        super().__init__()
        self.init_kwargs = {"block": block, "width": width}
        self.conv = block(1, width, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


def test_class_arguments_export_as_names_and_rebuild_when_trusted(tmp_path):
    model = WithBlock()
    path = save_checkpoint(tmp_path / "m.pt", model)
    architecture = torch.load(path, weights_only=True)["architecture"]
    assert architecture["kwargs"] == {"block": f"{__name__}:Block", "width": 2}
    assert architecture["callable_kwargs"] == ["block"]
    factory = f"{__name__}:WithBlock"
    with pytest.raises(CheckpointError, match=f"{__name__}:Block"):
        load_checkpoint(path, trust=[factory])  # the argument's class is not trusted yet
    loaded = load_checkpoint(path, trust=[factory, f"{__name__}:Block"])
    assert loaded.model.init_kwargs["block"] is Block
