"""OME-Zarr volumes and their NGFF labels: the public IO API of napari-finetune.

``open_volume`` reads NGFF 0.4 (zarr v2) and 0.5 (zarr v3) multiscale images
lazily (see :mod:`napari_finetune.io.volume`); corrections, predictions and
other labels are written into the store's ``labels/`` group in the same format,
with the image's levels (see :mod:`napari_finetune.io.labels` and
:mod:`napari_finetune.io.pyramid`). The raw image is never written.
"""

from napari_finetune.io.labels import (
    correction_metadata,
    create_labels_array,
    load_corrections,
    save_corrections,
    write_labels,
)
from napari_finetune.io.pyramid import fill_pyramid
from napari_finetune.io.staging import check_writable
from napari_finetune.io.volume import (
    Volume,
    VolumeError,
    check_store,
    list_labels,
    open_volume,
    require_ndim,
)

__all__ = [
    "Volume",
    "VolumeError",
    "check_store",
    "check_writable",
    "correction_metadata",
    "create_labels_array",
    "fill_pyramid",
    "list_labels",
    "load_corrections",
    "open_volume",
    "require_ndim",
    "save_corrections",
    "write_labels",
]
