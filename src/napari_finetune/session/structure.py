"""A new structure for the model: one more output channel, written as a new checkpoint.

The Session's :meth:`~napari_finetune.session.session.Session.add_structure` runs
:func:`add_structure_job`: the checkpoint is read, widened by
:func:`~napari_finetune.model.add_channel.add_output_channel` (the old channels'
roles written beside the new one, as ``train --add-channel`` does) and saved
beside it (or in the temporary folder when that one cannot be written). The new
channel is painted with label ``2 + C``, C the old channel count.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from napari_finetune.session.work import Job


@dataclass(frozen=True)
class StructureAdded:
    """What :func:`add_structure_job` wrote: the new checkpoint and its channels."""

    path: str
    name: str
    role: str
    channel_names: tuple[str, ...]

    @property
    def label(self) -> int:
        """The corrections label that paints the new structure."""
        return len(self.channel_names) + 1

    def describe(self) -> str:
        """One line: what was added and how to paint it."""
        return (f"added {self.name} ({self.role}): paint it with label {self.label}; "
                f"the model is now {Path(self.path).name}")


def structure_path(checkpoint: str, name: str) -> Path:
    """Where the widened checkpoint goes: ``<stem>+<name>.pt`` beside ``checkpoint``,
    else in the temporary folder (a model shipped read-only)."""
    source = Path(checkpoint)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    filename = f"{source.stem}+{safe}.pt"
    folder = source.parent if os.access(source.parent, os.W_OK) else Path(tempfile.gettempdir())
    return folder / filename


def add_structure_job(
    checkpoint: str, name: str, role: str, trust: tuple[str, ...] = (),
    out: str | None = None,
) -> Job[StructureAdded]:
    """Read ``checkpoint``, give it channel ``name`` of ``role`` and save it.

    Raises
    ------
    AddChannelError
        One line: a taken name, an unknown role, or a model that cannot have one more
        channel.
    """
    yield from ()
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.model.add_channel import add_output_channel
    from napari_finetune.model.checkpoint import save_checkpoint
    from napari_finetune.objects import roles_from_metadata

    ckpt = load_checkpoint(checkpoint, trust=trust)
    names = [str(n) for n in ckpt.channel_names]
    # The old channels' roles as they read now (defaults stored nowhere): kept beside it.
    before = {n: r.to_dict() for n, r in roles_from_metadata(ckpt.metadata, names).items()
              if r.role}
    wide = add_output_channel(ckpt, name, role, roles_before=before)
    path = Path(out) if out is not None else structure_path(checkpoint, name)
    save_checkpoint(path, wide.model, wide.metadata, wide.architecture)
    return StructureAdded(str(path), name, role, tuple(str(n) for n in wide.channel_names))
