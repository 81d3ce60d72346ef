"""Share the model: a bioimage.io package from the widget (ilastik, deepImageJ, Fiji...)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from napari_finetune.objects.roles import ChannelRole
from napari_finetune.session.events import Progress
from napari_finetune.session.work import Job, core_left_for_the_ui


def bioimageio_job(source: Any, out_path: str, volume: Any, trust: Sequence[str] = (),
                   roles: dict[str, ChannelRole] | None = None) -> Job[str]:
    """Write (and test, with bioimage.io's own checks) a model package off the main thread.

    ``source`` is the trainer after a run (its current weights) or the
    checkpoint's path; test tensors are cut from ``volume``. ``roles``, the
    role editor's, replace the source's instance roles in the package.
    """
    from napari_finetune.bioimageio.export import export_bioimageio
    from napari_finetune.objects import roles_to_metadata

    yield Progress(0, 1, "bioimage.io package")
    metadata = None if roles is None else roles_to_metadata(roles, {})
    with core_left_for_the_ui():
        path = export_bioimageio(source, out_path, volume, trust=tuple(trust) or None,
                                 metadata=metadata)
    return str(path)
