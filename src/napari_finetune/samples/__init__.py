"""Sample data: a synthetic EM volume (napari's File > Open Sample) and its pretrained UNet.

The generator and the checkpoint live inside the package because an installed
plugin must carry them; the script that trains the checkpoint is in
``sample_data/`` of the repository.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

    The image is a lazy multiscale layer read from the cached OME-Zarr store,
    whose path is in ``metadata["ome_zarr_path"]`` (corrections are saved
    there). The ground truth comes as a hidden labels layer: showing it by
    default would give the answer away in the demo.
    """
    import dask.array as da
    import zarr

    from napari_finetune.samples.store import ensure_sample

    path = ensure_sample("target", sample_shape())
    root = zarr.open_group(str(path), mode="r")
    levels = [da.from_zarr(root[d["path"]]) for d in _datasets(root)]
    truth_group = zarr.open_group(str(path / "labels" / "ground_truth"), mode="r")
    truth = da.from_zarr(truth_group[_datasets(truth_group)[0]["path"]])
    meta = {"ome_zarr_path": str(path)}
    return [
        (
            levels,
            {
                "name": "synthetic-em (target)",
                "multiscale": True,
                "contrast_limits": [0, 255],
                "metadata": meta,
            },
            "image",
        ),
        (truth, {"name": "ground truth", "visible": False, "metadata": dict(meta)}, "labels"),
    ]


def _datasets(group: zarr.Group) -> list[dict[str, Any]]:
    # Our own sample store (samples.store wrote it): its NGFF attributes have this shape,
    # so the JSON is read as plain dicts rather than checked field by field.
    attrs: dict[str, Any] = group.attrs.asdict()
    multiscales = attrs.get("ome", attrs).get("multiscales")
    return multiscales[0]["datasets"]
