"""Asking the user before a checkpoint's model code is imported.

A checkpoint names the callable that rebuilds its model
(``"package.module:callable"``). Only the allow-list of
:mod:`napari_finetune.model.architectures` is imported without asking; for
any other name the loader refuses before importing anything, the worker
reports the name (:func:`untrusted_factory`), and the widget asks the user
with :func:`ask_to_trust`. Only a Yes loads the file again with that one
name trusted.
"""

from __future__ import annotations

import os
from pathlib import Path

from qtpy.QtWidgets import QMessageBox, QWidget

from napari_finetune._qt.state import CheckpointInfo, Untrusted
from napari_finetune.palette import channel_colors
from napari_finetune.session.work import Job


def untrusted_factory(path: str | os.PathLike, trust: tuple[str, ...] = ()) -> str | None:
    """The factory ``path`` names when the allow-list and ``trust`` refuse it, else None.

    Reads the file as plain data (``weights_only=True``): nothing it names is
    imported here.
    """
    import torch

    from napari_finetune.model.architectures import is_allowed

    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # the loader's own error already says what is wrong with the file
        return None
    architecture = payload.get("architecture") if isinstance(payload, dict) else None
    factory = architecture.get("factory") if isinstance(architecture, dict) else None
    if not isinstance(factory, str) or is_allowed(factory, trust):
        return None
    return factory.strip()


def describe_factory(factory: str) -> tuple[str, str]:
    """``("package", "module:callable")`` of ``"package.module:callable"``."""
    module = factory.partition(":")[0]
    return module.split(".")[0], factory


def trust_question(path: str, factory: str) -> str:
    """The dialog's text: which package, which callable, what trusting it means."""
    package, _ = describe_factory(factory)
    module, _, name = factory.partition(":")
    return (
        f"The model file\n  {path}\nasks to build its network by calling\n"
        f"  {name or '?'}  from the module  {module}  (package '{package}').\n\n"
        "napari-finetune does not know this callable. Loading the file would import "
        f"'{module}' and call '{name}' with arguments written in the file, which can run "
        "any code on this computer.\n\n"
        f"Trust '{package}' and load the model with {factory}?"
    )


def ask_to_trust(parent: QWidget, path: str, factory: str) -> bool:
    """Ask with a modal Yes/No dialog (No is the default); True on Yes."""
    answer = QMessageBox.question(
        parent,
        "Trust this model's code?",
        trust_question(path, factory),
        QMessageBox.Yes | QMessageBox.No,
        QMessageBox.No,
    )
    return answer == QMessageBox.Yes


def refusal(path: str, factory: str) -> str:
    """What the log says after a No: which factory was refused, and what to do."""
    package, _ = describe_factory(factory)
    return (f"{Path(path).name} was not loaded: its model is built by {factory} "
            f"(package '{package}'), which you did not trust. Nothing from it was "
            "imported or run; choose another checkpoint.")


def info_job(path: str, trust: tuple[str, ...] = ()) -> Job[CheckpointInfo | Untrusted]:
    """Read what the widget shows of a checkpoint, or the factory it needs trusted."""
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.model.checkpoint import CheckpointError

    yield from ()
    try:
        # The allow-list is checked on the factory's name before anything is imported.
        ckpt = load_checkpoint(path, trust=trust)
    except CheckpointError:
        factory = untrusted_factory(path, trust)
        if factory is None:
            raise
        return Untrusted(path, factory)  # the widget asks the user; nothing was imported
    from napari_finetune.devices import model_in_channels
    from napari_finetune.model.lora import adapter_overhead

    # Here, in the worker: importing napari_finetune.objects costs ~1.6 s, which the role
    # editor (on the main thread) then finds already paid.
    from napari_finetune.objects import ChannelRole, roles_from_metadata, sources_from_metadata

    names = ckpt.channel_names
    try:
        roles = roles_from_metadata(ckpt.metadata, names)
        problem = ""
    except ValueError as exc:  # bad roles cost the stored roles, not the whole checkpoint
        roles, problem = {name: ChannelRole() for name in names}, str(exc)
    return CheckpointInfo(
        path=path, channel_names=names, colors=channel_colors(names, ckpt.metadata),
        normalization=ckpt.normalization, dims=int(getattr(ckpt.model, "dims", 3)),
        trust=tuple(trust), lora_share_per_rank=adapter_overhead(ckpt.model, 1),
        roles=roles, roles_problem=problem, roles_sources=sources_from_metadata(ckpt.metadata),
        in_channels=model_in_channels(ckpt.model),
    )
