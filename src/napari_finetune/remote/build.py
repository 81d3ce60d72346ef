"""Which code this process runs: a hash of the package's ``.py`` files, computed once.

``napari_finetune.__version__`` stays the release (bioimage.io packages pin it);
two checkouts of one release differ in their code, and a remote run must train
with the code the client built it with. The hash changes with any edit of the
package and is the same wherever the same files are installed.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.lru_cache(maxsize=1)
def build_id() -> str:
    """This package's :func:`code_hash` (computed once per process)."""
    return code_hash(Path(__file__).resolve().parents[1])


def code_hash(root: Path) -> str:
    """The first 12 hex digits of the SHA-256 of the ``.py`` files under ``root`` (their
    paths and contents, in path order)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


__all__ = ["build_id", "code_hash", "versions"]


def versions() -> dict[str, str]:
    """torch and napari-finetune versions of this process and its build (the hash of its
    code, :func:`~napari_finetune.remote.build.build_id`): the client and the task
    compare them both ways."""
    import torch

    from napari_finetune import __version__

    return {"torch": str(torch.__version__), "napari_finetune": __version__,
            "napari_finetune_build": build_id()}
