"""Reading a checkpoint for a front end, and the trust its model code may need.

A checkpoint names the callable that rebuilds its model
(``"package.module:callable"``). Only the allow-list of
:mod:`napari_finetune.model.architectures` is imported without asking; for
any other name the loader refuses before importing anything, :func:`info_job`
returns an :class:`Untrusted` naming it, and the :class:`~napari_finetune.session.session.Session`
asks its front end (``events.trust_asked``). Only a Yes reads the file again
with that one name trusted. No Qt here: the dialog is the front end's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from napari_finetune.palette import channel_colors
from napari_finetune.session.work import Job

if TYPE_CHECKING:
    from napari_finetune.objects import ChannelRole


@dataclass
class CheckpointInfo:
    """What a front end needs to know about the chosen model (read in a job)."""

    path: str
    channel_names: list[str]
    colors: list[str]
    normalization: dict
    dims: int
    trust: tuple[str, ...] = ()  # factories the user trusted for this file (their Yes)
    lora_share_per_rank: float = 0.0  # weights LoRA adds per unit of rank (model.lora)
    # Every channel's instance role as stored (objects.roles_from_metadata; role None: no
    # objects), in channel order; ``roles_problem`` is the one-line reason when the
    # checkpoint's roles could not be read (then every channel has role None).
    roles: dict[str, ChannelRole] = field(default_factory=dict)
    roles_problem: str = ""
    # Where the stored roles' min size and seed distance came from (objects.SOURCES_KEY).
    roles_sources: dict[str, dict[str, str]] = field(default_factory=dict)
    in_channels: int = 1  # the model's input channels (a store of more: one is chosen)

    def colors_for(self, channel_names: Sequence[str]) -> list[str]:
        """This model's channel colours for a layer of ``channel_names``; none (the
        palette's then) when the layer's classes are another model's."""
        return list(self.colors) if list(channel_names) == self.channel_names else []


@dataclass(frozen=True)
class Untrusted:
    """The checkpoint's model factory needs the user's trust; nothing was imported.

    ``trust`` holds the factories already trusted for this file (kept on a Yes).
    The Session hands it to its front end as the trust request.
    """

    path: str
    factory: str
    trust: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckpointUnusable:
    """A checkpoint read that gave no model: ``line`` says why; ``untrusted`` when the
    user refused its model code (nothing of it was imported or run)."""

    path: str
    line: str
    untrusted: bool = False


def no_roles_message(info: CheckpointInfo) -> str:
    """One line: why no channel gives objects, and where to give one a role."""
    first = info.channel_names[0] if info.channel_names else "CHANNEL"
    where = ("choose a role (boundary or object) for a channel under Objects, or count "
             f"from the command line: napari-finetune predict CKPT STORE --instances "
             f"--role {first}=boundary|object")
    if info.roles_problem:
        return f"No objects: {info.roles_problem} To count: {where}"
    return (f"No objects: {Path(info.path).name} gives no channel an instance role "
            f"(channels: {', '.join(info.channel_names)}); {where}")


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
    """The question's text: which package, which callable, what trusting it means."""
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


def refusal(path: str, factory: str) -> str:
    """What the log says after a No: which factory was refused, and what to do."""
    package, _ = describe_factory(factory)
    return (f"{Path(path).name} was not loaded: its model is built by {factory} "
            f"(package '{package}'), which you did not trust. Nothing from it was "
            "imported or run; choose another checkpoint.")


def info_job(path: str, trust: tuple[str, ...] = ()) -> Job[CheckpointInfo | Untrusted]:
    """Read what a front end shows of a checkpoint, or the factory it needs trusted."""
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
        return Untrusted(path, factory, tuple(trust))  # the user is asked; nothing imported
    from napari_finetune.devices import model_in_channels
    from napari_finetune.model.lora import adapter_overhead

    # Here, in the job: importing napari_finetune.objects costs ~1.6 s, which a role
    # editor (on napari's main thread) then finds already paid.
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
