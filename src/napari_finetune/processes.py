"""Whether a process is still running: the question of every crash-safe write.

A killed writer cannot clean up after itself, so the checkpoint writer
(:mod:`napari_finetune.model.atomic_write`) and the labels swap
(:mod:`napari_finetune.io.staging`) both tell a leftover of a dead process
from the work in progress of a live one by the process id it carries.
"""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (this process counts; so does another user's).

    On Windows ``os.kill`` would terminate the process, so every pid counts as
    alive there and the callers' age rules decide instead.
    """
    if pid == os.getpid():
        return True
    if os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError included: it exists, owned by someone else
        return True
    return True
