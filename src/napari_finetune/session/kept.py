"""The weights a remote run kept beside a store, offered when that store is opened again.

A remote run that ended before its last step (Stop, napari closed, the worker
or the scheduler lost) left its last weights in ``<store>.remote-last.pt``
(:func:`~napari_finetune.remote.kept.kept_path`). :func:`find_kept_job` reads
that file as plain data (``weights_only``: nothing it names is imported or
run) and says what it is (:class:`KeptWeights`): from when, how many steps,
or why it cannot be used for this store. Using it or setting it aside renames
it (:func:`move_aside`), so the offer is not repeated and the file is never
deleted; a later run cut short keeps its weights under the old name again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from napari_finetune.errors import one_line
from napari_finetune.remote.kept import KEPT_KEY, kept_path, store_name
from napari_finetune.session.work import Job


@dataclass(frozen=True)
class KeptWeights:
    """A kept checkpoint found beside ``store``: what a front end offers to use or set aside.

    Attributes
    ----------
    store, path : str
        The store opened, and the kept file beside it.
    written : datetime
        When the run kept it (its stamp; the file's time when it has none), UTC.
    steps_done, total_steps : int
        The step of the weights, of the run's steps (0 of 0 when unreadable).
    ended : str
        How the run ended, as its record says ("stopped after step 37").
    worker : str
        The dask worker that trained them ('' when the record names none).
    problem : str
        Why the file cannot be this store's checkpoint ('' when it can).
    mtime_ns : int
        The file's modification time when read: a newer file is not the one offered.
    """

    store: str
    path: str
    written: datetime
    steps_done: int = 0
    total_steps: int = 0
    ended: str = ""
    worker: str = ""
    problem: str = ""
    mtime_ns: int = 0

    @property
    def usable(self) -> bool:
        """Whether the file can be loaded as this store's checkpoint."""
        return not self.problem

    @property
    def line(self) -> str:
        """One status line: what the file is, from when, how many steps; or why not."""
        name = Path(self.path).name
        if self.problem:
            return (f"{name} beside the store cannot be used as a checkpoint: {self.problem}; "
                    "set it aside (Discard) to stop this message.")
        when = self.written.astimezone().strftime("%Y-%m-%d %H:%M")
        where = f" on the dask worker {self.worker}" if self.worker else ""
        return (f"Weights kept from a remote run that ended early ({self.ended or 'stopped'}): "
                f"{name}, step {self.steps_done} of {self.total_steps}, trained{where}, kept "
                f"{when}; use them as the checkpoint to go on from there, or set them aside.")


def find_kept_job(store: str) -> Job[KeptWeights | None]:
    """What is kept beside ``store`` (None when nothing is), read in the runner's thread."""
    yield from ()
    return read_kept(store)


def read_kept(store: str) -> KeptWeights | None:
    """Read ``kept_path(store)`` as plain data; a :class:`KeptWeights` saying what it is,
    with its ``problem`` when it is no napari-finetune checkpoint of this store."""
    import torch

    from napari_finetune.model.checkpoint_format import FORMAT

    path = kept_path(store)
    try:
        stat = path.stat()
    except OSError:
        return None  # nothing kept (or gone meanwhile)
    found = KeptWeights(store=str(store), path=str(path), mtime_ns=stat.st_mtime_ns,
                        written=datetime.fromtimestamp(stat.st_mtime, tz=timezone.utc))
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a bad file
        return replace(found, problem=f"it is not a readable PyTorch checkpoint ({one_line(exc)})")
    metadata = payload.get("metadata") if isinstance(payload, dict) else None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT \
            or not isinstance(metadata, dict):
        return replace(found, problem="it is not a napari-finetune checkpoint")
    run = metadata.get("run")
    if not isinstance(run, dict) or not isinstance(run.get("steps_done"), int) \
            or not isinstance(run.get("total_steps"), int):
        return replace(found, problem="it holds no run record (steps done of how many)")
    stamp = metadata.get(KEPT_KEY)
    written = found.written
    if isinstance(stamp, dict):
        if stamp.get("store") != store_name(store):
            return replace(found, problem=f"it was kept for the store {stamp.get('store')!r}, "
                                        f"not {store_name(store)!r}")
        try:
            written = datetime.fromisoformat(str(stamp.get("written_at")))
        except ValueError:  # a stamp without its time: the file's
            pass
    return replace(found, written=written, steps_done=int(run["steps_done"]),
                 total_steps=int(run["total_steps"]), ended=str(run.get("ended") or ""),
                 worker=str(run.get("worker") or ""))


def changed_since(kept: KeptWeights) -> bool:
    """Whether the file is gone or was written again since ``kept`` was read."""
    try:
        return Path(kept.path).stat().st_mtime_ns != kept.mtime_ns
    except OSError:
        return True


def move_aside(kept: KeptWeights, why: str) -> Path:
    """Rename the kept file to ``<store>.remote-last.<why>-<when kept>.pt`` (a free name):
    it is never deleted, and no longer offered. OSError when it cannot be renamed."""
    old = Path(kept.path)
    stamp = kept.written.astimezone(timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = old.with_suffix("")  # <store>.remote-last
    new = base.with_name(f"{base.name}.{why}-{stamp}.pt")
    number = 2
    while new.exists():
        new = base.with_name(f"{base.name}.{why}-{stamp}-{number}.pt")
        number += 1
    os.rename(old, new)
    return new


__all__ = ["KeptWeights", "changed_since", "find_kept_job", "move_aside", "read_kept"]
