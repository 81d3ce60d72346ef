"""Write a file atomically: a temporary name in the same folder, fsync, rename.

A crash leaves either the old file or the new one, never half of one. What a
crash cannot clean up (a SIGKILL between creating the temporary and renaming
it) the next write of the same target does: temporaries carry the writer's
process id, and those whose process is gone are removed. A full disk is
reported before anything is written when the size is known, and as one
``OSError(ENOSPC)`` naming the folder and the space needed when the write
itself fails (torch reports it as a ``RuntimeError`` from ``inline_container.cc``).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from napari_finetune.processes import process_alive

logger = logging.getLogger(__name__)

# Temporaries of an older layout carry no process id; one this old is not in progress.
LEGACY_TEMPORARY_AGE_S = 600.0
# torch's messages when the zip writer cannot write (a full disk, a quota).
_TORCH_WRITE_FAILURES = ("inline_container", "PytorchStreamWriter failed", "file write failed")


def temporary_name(path: Path) -> Path:
    """``.<name>.<pid>-<random>.tmp`` next to ``path``."""
    return path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(6)}.tmp"


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove temporaries of ``path`` left by writers that no longer run.

    Returns
    -------
    list of pathlib.Path
        The files removed.
    """
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(?:(\d+)-)?[0-9a-f]+\.tmp$")
    removed: list[Path] = []
    try:
        candidates = list(path.parent.iterdir())
    except OSError:
        return removed
    for candidate in candidates:
        match = pattern.match(candidate.name)
        if match is None:
            continue
        pid = match.group(1)
        if pid is not None and process_alive(int(pid)) and os.name != "nt":
            continue
        if os.name == "nt" and not _older_than(candidate, LEGACY_TEMPORARY_AGE_S):
            continue  # a save in progress (this process's other threads included)
        if pid is None and not _older_than(candidate, LEGACY_TEMPORARY_AGE_S):
            continue
        try:
            candidate.unlink()
        except OSError:
            continue
        removed.append(candidate)
    return removed


def check_free_space(folder: Path, needed_bytes: int, name: str) -> None:
    """Raise ``OSError(ENOSPC)`` when ``folder`` has less than ``needed_bytes`` free."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # unknown: the write itself will tell
    if free < needed_bytes:
        raise no_space_error(folder, needed_bytes, name, free)


def no_space_error(folder: Path, needed_bytes: int, name: str, free: int | None = None) -> OSError:
    """The one-line ``OSError`` for a full disk: folder, space needed, space free."""
    have = "" if free is None else f", {_mb(free)} free"
    needs = f"needs about {_mb(needed_bytes)}" if needed_bytes else "the disk is full"
    return OSError(
        errno.ENOSPC,
        f"not enough space to write {name} ({needs}{have}); "
        "free some space or write to another folder",
        str(folder),
    )


def write_atomically(path: Path, write: Callable[[BinaryIO], object], size_hint: int = 0) -> Path:
    """Call ``write(handle)`` on a temporary next to ``path``, then rename it over ``path``.

    Parameters
    ----------
    path : pathlib.Path
        Destination.
    write : callable
        Writes the whole content to the binary handle it is given.
    size_hint : int
        Expected size in bytes, checked against the free space first (0: no check).
    """
    remove_stale_temporaries(path)
    if size_hint:
        check_free_space(path.parent, size_hint, path.name)
    # Not tempfile.mkstemp: it makes the file private (0600); this gets the mode a
    # plain open() would (0666 minus the umask), applied without touching the umask.
    tmp = temporary_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if _is_disk_full(exc):
            raise no_space_error(path.parent, size_hint, path.name) from None
        raise
    _fsync_dir(path.parent)
    return path


def _is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
    return isinstance(exc, RuntimeError) and any(k in str(exc) for k in _TORCH_WRITE_FAILURES)


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return False


def _mb(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.1f} MB"


def _fsync_dir(folder: Path) -> None:
    # Makes the rename itself durable; not possible on every OS (Windows).
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError as exc:
        logger.debug("cannot open %s to make the rename durable: %s", folder, exc)
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        logger.debug("fsync of the folder %s failed: %s", folder, exc)
    finally:
        os.close(fd)
