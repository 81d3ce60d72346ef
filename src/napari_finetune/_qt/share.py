"""Share the model: a bioimage.io package from the widget (ilastik, deepImageJ, Fiji...)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from napari_finetune._qt.events import Progress
from napari_finetune._qt.worker import Job, core_left_for_the_ui


def bioimageio_job(source: Any, out_path: str, volume: Any, trust: Sequence[str] = ()) -> Job[str]:
    """Write (and test, with bioimage.io's own checks) a model package off the main thread.

    ``source`` is the trainer after a run (its current weights) or the
    checkpoint's path; test tensors are cut from ``volume``.
    """
    from napari_finetune.bioimageio.export import export_bioimageio

    yield Progress(0, 1, "bioimage.io package")
    with core_left_for_the_ui():
        path = export_bioimageio(source, out_path, volume, trust=tuple(trust) or None)
    return str(path)
