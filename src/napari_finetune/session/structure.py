"""A new structure for the model: one more output channel, written as a new checkpoint.

The Session's :meth:`~napari_finetune.session.session.Session.add_structure` runs
:func:`add_structure_job`: the checkpoint is read, widened by
:func:`~napari_finetune.model.add_channel.add_output_channel` (the old channels'
roles written beside the new one, as ``train --add-channel`` does) and saved
beside it (:func:`structure_path`: a model shipped with the package goes beside the
image's store or into the user's data folder instead). The new
channel is painted with label ``2 + C``, C the old channel count.
"""

from __future__ import annotations

import os
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
                f"the model is now {self.path}")


def structure_path(checkpoint: str, name: str, store: str | None = None) -> Path:
    """Where the widened checkpoint goes: ``<stem>+<name>.pt`` beside ``checkpoint``.

    A model that ships with the package (the sample's) is never widened into the
    package's folder (site-packages when writable: a reinstall would delete the user's
    model, and every environment would share it): it goes beside the image's
    ``store``, else into the user's data folder, the one the sample stores are cached
    in (:func:`~napari_finetune.samples.synthetic_em.cache_dir`). So does a checkpoint
    whose own folder cannot be written.
    """
    source = Path(checkpoint)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    filename = f"{source.stem}+{safe}.pt"
    if not _shipped(source) and os.access(source.parent, os.W_OK):
        return source.parent / filename
    beside_store = Path(store).parent if store else None
    if beside_store is not None and os.access(beside_store, os.W_OK):
        return beside_store / filename
    from napari_finetune.samples.synthetic_em import cache_dir

    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return folder / filename


def _shipped(path: Path) -> bool:
    """Whether ``path`` is inside the installed package (a model shipped with it)."""
    import napari_finetune

    package = Path(napari_finetune.__file__).resolve().parent
    return path.resolve().is_relative_to(package)


def add_structure_job(
    checkpoint: str, name: str, role: str, trust: tuple[str, ...] = (),
    out: str | None = None, store: str | None = None,
) -> Job[StructureAdded]:
    """Read ``checkpoint``, give it channel ``name`` of ``role`` and save it: at ``out``,
    else where :func:`structure_path` says (``store``: the image's store).

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
    path = Path(out) if out is not None else structure_path(checkpoint, name, store)
    save_checkpoint(path, wide.model, wide.metadata, wide.architecture)
    return StructureAdded(str(path), name, role, tuple(str(n) for n in wide.channel_names))
