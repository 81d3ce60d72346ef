"""Sample data: a synthetic EM volume (napari's File > Open Sample) and its pretrained UNet.

The generator and the checkpoint live inside the package because an installed
plugin must carry them; the script that trains the checkpoint is in
``sample_data/`` of the repository.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    import zarr

SHAPE_ENV = "NAPARI_FINETUNE_SAMPLE_SHAPE"


def sample_shape() -> tuple[int, int, int]:
    """Shape of the napari sample: env ``NAPARI_FINETUNE_SAMPLE_SHAPE`` ("z,y,x") or the default."""
    from napari_finetune.samples.synthetic_em import DEFAULT_SHAPE

    text = os.environ.get(SHAPE_ENV, "").strip()
    if not text:
        return DEFAULT_SHAPE
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(","))
    except ValueError:
        raise ValueError(f"{SHAPE_ENV}={text!r}: expected three sizes like '32,128,128'.") from None
    if len(shape) != 3:
        raise ValueError(f"{SHAPE_ENV}={text!r}: expected three sizes like '32,128,128'.")
    return shape


def synthetic_em_layers() -> list[tuple[Any, dict[str, Any], str]]:
    """napari sample ``synthetic-em``: the target-domain volume, ready for prediction.

    The store's path is in ``metadata["ome_zarr_path"]`` (corrections are
    saved there). Cached, the image is a lazy multiscale layer read from it. On
    the first opening the layers come from the volume in memory (the default
    one read from the package, :mod:`~napari_finetune.samples.shipped`, another
    shape drawn) and the store is written by a background thread
    (:func:`~napari_finetune.samples.store.sample_in_memory`): drawing and
    writing it here, on napari's main thread, froze the viewer for seconds. The
    ground truth comes as a hidden labels layer: showing it by default would
    give the answer away in the demo.
    """
    from napari_finetune.samples.store import sample_in_memory

    found = sample_in_memory("target", sample_shape())
    if isinstance(found, tuple):
        path, image, truth = found
        levels: Any = image
    else:
        path = found
        levels, truth = _read_store(path)
    meta = {"ome_zarr_path": str(path)}
    return [
        (
            levels,
            {
                "name": "synthetic-em (target)",
                "multiscale": isinstance(levels, list),
                "contrast_limits": [0, 255],
                "metadata": meta,
            },
            "image",
        ),
        (truth, {"name": "ground truth", "visible": False, "metadata": dict(meta)}, "labels"),
    ]


def _read_store(path: Path) -> tuple[list[Any], Any]:
    """The cached store's levels and ground truth, lazily (dask over zarr)."""
    import dask.array as da
    import zarr

    root = zarr.open_group(str(path), mode="r")
    levels = [da.from_zarr(root[d["path"]]) for d in _datasets(root)]
    truth_group = zarr.open_group(str(path / "labels" / "ground_truth"), mode="r")
    return levels, da.from_zarr(truth_group[_datasets(truth_group)[0]["path"]])


def _datasets(group: zarr.Group) -> list[dict[str, Any]]:
    # Our own sample store (samples.store wrote it): its NGFF attributes have this shape,
    # so the JSON is read as plain dicts rather than checked field by field.
    attrs: dict[str, Any] = group.attrs.asdict()
    multiscales = attrs.get("ome", attrs).get("multiscales")
    return multiscales[0]["datasets"]
