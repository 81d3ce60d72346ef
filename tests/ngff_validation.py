"""NGFF checks for the stores the project writes, by third-party readers (imported by tests).

``assert_valid_ngff`` runs ome-zarr-models (the NGFF 0.4 or 0.5 model, by the
store's zarr format) and then checks what its 0.4 model leaves out but the
NGFF labels section requires of both versions: every labels image has the
image's levels, with the image's per-level shapes and coordinate transforms,
and the ``labels`` group names its ``version``. ``napari_ome_zarr_layers``
reads the store with napari-ome-zarr's own reader (no viewer needed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def _attrs(group: Path) -> dict[str, Any]:
    """The NGFF attributes of a group: inside ``ome`` (0.5, zarr v3) or top level (0.4)."""
    if (group / "zarr.json").is_file():
        attrs = json.loads((group / "zarr.json").read_text()).get("attributes", {})
        return attrs.get("ome", attrs)
    zattrs = group / ".zattrs"
    return json.loads(zattrs.read_text()) if zattrs.is_file() else {}


def validate_with_ome_zarr_models(path: Path) -> None:
    """Raise whatever ome-zarr-models raises for the image at ``path`` and its labels."""
    import zarr

    v3 = (Path(path) / "zarr.json").is_file()
    if v3:
        from ome_zarr_models.v05.image import Image
        from ome_zarr_models.v05.image_label import ImageLabel
        from ome_zarr_models.v05.labels import Labels
    else:
        from ome_zarr_models.v04.image import Image
        from ome_zarr_models.v04.image_label import ImageLabel
        from ome_zarr_models.v04.labels import Labels
    root = zarr.open_group(str(path), mode="r")
    Image.from_zarr(root)
    if "labels" in root:
        Labels.from_zarr(root["labels"])
        for name in _attrs(Path(path) / "labels").get("labels", []):
            ImageLabel.from_zarr(root[f"labels/{name}"])


def level_geometry(group: Path) -> list[tuple[tuple[int, ...], list[float], list[float]]]:
    """Per level of a multiscale group: spatial shape, composed scale and translation."""
    from napari_finetune.io.omezarr import open_volume

    volume = open_volume(group, keep_axes=True)  # a time series: labels keep the t axis
    return [
        (tuple(int(s) for s in level.shape), list(scale), list(translation))
        for level, scale, translation in zip(
            volume.levels, volume.scale, volume.translation, strict=True
        )
    ]


def assert_valid_ngff(path: Path) -> None:
    """The store at ``path`` is valid NGFF, its labels carry the image's pyramid."""
    path = Path(path)
    validate_with_ome_zarr_models(path)
    labels_dir = path / "labels"
    if not labels_dir.is_dir():
        return
    labels_attrs = _attrs(labels_dir)
    image_attrs = _attrs(path)
    # 0.5 has one version for the group; 0.4 puts it in the multiscales entry.
    image_version = image_attrs.get("version") or image_attrs["multiscales"][0]["version"]
    assert labels_attrs.get("version") == image_version, labels_attrs
    image = level_geometry(path)
    for name in labels_attrs["labels"]:
        labels = level_geometry(labels_dir / name)
        assert len(labels) == len(image), (name, len(labels), len(image))
        for level, (got, want) in enumerate(zip(labels, image, strict=True)):
            assert got[0] == want[0], (name, level, got[0], want[0])
            np.testing.assert_allclose(got[1], want[1], err_msg=f"{name} scale, level {level}")
            np.testing.assert_allclose(got[2], want[2], err_msg=f"{name} translation, {level}")


def napari_ome_zarr_layers(path: Path) -> list[tuple[Any, dict[str, Any], str]]:
    """The layer data napari-ome-zarr's reader makes of ``path`` (as napari would get it)."""
    from napari_ome_zarr._reader import napari_get_reader

    reader = napari_get_reader(str(path))
    assert reader is not None, f"napari-ome-zarr declined {path}"
    return reader(str(path))


def assert_napari_ome_zarr_reads_labels(path: Path, names: list[str]) -> None:
    """napari-ome-zarr gives one labels layer per name, with as many levels as the image."""
    layers = napari_ome_zarr_layers(path)
    images = [data for data, _, kind in layers if kind == "image"]
    assert images, [kind for _, _, kind in layers]
    n_levels = len(images[0]) if isinstance(images[0], list) else 1
    # napari-ome-zarr names a layer after its multiscales name, or its path in the store.
    labels = {
        str(kw.get("name")).rsplit("/", 1)[-1]: data
        for data, kw, kind in layers
        if kind == "labels"
    }
    for name in names:
        assert name in labels, (name, list(labels))
        data = labels[name]
        assert (len(data) if isinstance(data, list) else 1) == n_levels, name
