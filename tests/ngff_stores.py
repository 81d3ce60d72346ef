"""An NGFF image written by ome-zarr-py itself, for the tests that predict into stores.

Written by the reference writer rather than the package's own, so a store the package
reads and writes into is one it did not make (the prediction tests and the CLI's
instance tests share it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SHAPE = (16, 48, 48)


def ngff_store(path: Path, version: str, scale_factors: tuple[int, ...]) -> Path:
    """A uint8 image of ``SHAPE`` in NGFF 0.4 (zarr v2) or 0.5 (zarr v3), by ome-zarr-py.

    Parameters
    ----------
    path : Path
        Where the store goes.
    version : str
        ``"0.4"`` or ``"0.5"``.
    scale_factors : tuple of int
        The smaller levels' factors (empty: one level).

    Returns
    -------
    Path
        ``path``.
    """
    import zarr
    from ome_zarr.format import FormatV04, FormatV05
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    fmt = FormatV04() if version == "0.4" else FormatV05()
    rng = np.random.default_rng(0)
    image = (rng.random(SHAPE) * 200 + 20).astype(np.uint8)
    root = zarr.group(store=parse_url(str(path), mode="w", fmt=fmt).store,
                      zarr_format=fmt.zarr_format)
    write_image(image, root, axes="zyx", fmt=fmt, scale_factors=list(scale_factors),
                scale={"z": 1.0, "y": 0.5, "x": 0.5})
    return path


def omero_metadata(labels: list[str]) -> dict[str, list[dict[str, object]]]:
    """NGFF ``omero`` metadata naming channels ``labels`` (what bioformats2raw writes;
    colour and window are required by ome-zarr-models)."""
    window = {"min": 0.0, "max": 255.0, "start": 0.0, "end": 255.0}
    return {"channels": [{"label": label, "color": "FFFFFF", "window": window,
                          "active": True} for label in labels]}
