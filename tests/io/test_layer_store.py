"""Finding a layer's store from napari's ``layer.source.path`` (napari-ome-zarr), without Qt."""

from __future__ import annotations

from pathlib import Path

import zarr
from store_helpers import painted_corrections

from napari_finetune.io.layer_store import store_from_source, store_of_layer
from napari_finetune.io.omezarr import save_corrections


def test_our_metadata_wins(store: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere.zarr"
    assert store_of_layer({"ome_zarr_path": str(other)}, str(store)) == other
    assert store_of_layer({}, str(store)) == store
    assert store_of_layer(None, None) is None
    assert store_of_layer({"ome_zarr_path": ""}, None) is None


def test_store_root_and_every_node_inside_it(store: Path) -> None:
    """napari-ome-zarr gives the path it was asked to open: the root or a node in it."""
    save_corrections(store, painted_corrections())
    for inside in (store, store / "s0", store / "s2", store / "labels",
                   store / "labels" / "corrections", store / "labels" / "corrections" / "s1",
                   f"{store}/", f"file://{store}"):
        assert store_from_source(inside) == store, inside


def test_bioformats2raw_root_and_series(tmp_path: Path, make_store) -> None:
    root = tmp_path / "b2r.zarr"
    group = zarr.open_group(str(root), mode="w", zarr_format=3)
    group.attrs["ome"] = {"version": "0.5", "bioformats2raw.layout": 3}
    make_store(root / "0", "0.5")
    assert store_from_source(root) == root  # open_volume picks series 0 itself
    assert store_from_source(root / "0" / "s1") == root / "0"


def test_what_is_not_a_writable_image_gives_none(tmp_path: Path) -> None:
    (tmp_path / "image.tif").write_bytes(b"II*\x00")
    plain = zarr.open_group(str(tmp_path / "plain.zarr"), mode="w")
    plain.create_array("a", shape=(4, 4), dtype="uint8")
    plate = zarr.open_group(str(tmp_path / "plate.zarr"), mode="w", zarr_format=2)
    plate.attrs["plate"] = {"version": "0.4", "rows": [], "columns": [], "wells": []}
    plate.create_array("x", shape=(2, 2), dtype="uint8")
    (tmp_path / "broken.zarr").mkdir()
    (tmp_path / "broken.zarr" / "zarr.json").write_text("{not json")
    for source in (tmp_path / "image.tif", tmp_path / "plain.zarr", tmp_path / "plain.zarr/a",
                   tmp_path / "plate.zarr", tmp_path / "plate.zarr/x", tmp_path / "missing.zarr",
                   tmp_path / "broken.zarr", "https://example.org/data.zarr", "", None):
        assert store_from_source(source) is None, source


def test_labels_only_written_by_others_still_lead_to_the_image(store: Path) -> None:
    """A labels image's own multiscales must not be taken for the image."""
    labels = store / "labels" / "ground_truth"
    assert (labels / "s0").exists() or (labels / "0").exists()
    assert store_from_source(labels) == store
