"""The npe2 reader: what get_reader accepts, the layer data, a real napari viewer opening it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from napari_finetune import palette
from napari_finetune._reader import decline_reason, get_reader, read_ome_zarr
from napari_finetune.io.omezarr import VolumeError, save_corrections

SHAPE = (16, 64, 64)


def _store(path: Path, version: str, scale_factors: tuple[int, ...] = (2, 4)) -> Path:
    """A 16x64x64 OME-Zarr image with labels/ground_truth, written by ome-zarr-py."""
    from ome_zarr.format import FormatV04, FormatV05
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image, write_labels

    fmt = FormatV04() if version == "0.4" else FormatV05()
    image = np.zeros(SHAPE, np.uint16)
    image[:, 16:48, 16:48] = 1000
    image[0, 0, 0] = 7  # the smallest level is strided: contrast comes from it
    root = zarr.group(store=parse_url(str(path), mode="w", fmt=fmt).store,
                      zarr_format=fmt.zarr_format)
    scale = {"z": 2.0, "y": 0.5, "x": 0.5}
    write_image(image, root, axes="zyx", fmt=fmt, scale_factors=list(scale_factors), scale=scale)
    gt = (image > 0).astype(np.uint8)
    write_labels(gt, root, name="ground_truth", axes="zyx", fmt=fmt, scaler=None,
                 scale_factors=list(scale_factors), scale=scale)  # the image's levels (NGFF)
    return path


@pytest.fixture(params=["0.4", "0.5"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = _store(tmp_path / f"em{request.param}.zarr", request.param)
    corrections = np.zeros(SHAPE, np.uint8)
    corrections[2, 20:30, 20:30] = 2
    save_corrections(path, corrections, channel_names=["membrane"])
    return path


def test_get_reader_declines_what_is_not_ome_zarr(tmp_path: Path, store: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "folder").mkdir()
    zarr.open_group(str(tmp_path / "plain.zarr"), mode="w").create_array(
        "0", shape=(4, 4), dtype="uint8")
    for path in (tmp_path / "notes.txt", tmp_path / "folder", tmp_path / "plain.zarr",
                 tmp_path / "missing.zarr", store / "s0", [str(store), str(store)]):
        assert get_reader(path) is None, path
    assert get_reader(str(store)) is read_ome_zarr
    assert get_reader([str(store)]) is read_ome_zarr


def test_the_reader_given_several_paths_says_so_in_one_line(store: Path) -> None:
    # napari asks get_reader first (which declines several paths); called directly, the
    # reader names the problem instead of failing inside open_volume on no path at all.
    with pytest.raises(VolumeError, match="open one OME-Zarr directory at a time"):
        read_ome_zarr([str(store), str(store)])


def test_layer_data(store: Path) -> None:
    layers = read_ome_zarr(str(store))
    assert [(kw["name"], kind) for _, kw, kind in layers] == [
        (store.name.removesuffix(".zarr"), "image"), ("ground_truth", "labels"),
        ("corrections", "labels")]
    data, kwargs, _ = layers[0]
    assert kwargs["multiscale"] and [d.shape for d in data] == [
        (16, 64, 64), (16, 32, 32), (16, 16, 16)]
    assert list(kwargs["scale"]) == [2.0, 0.5, 0.5]
    assert kwargs["metadata"] == {"ome_zarr_path": str(store)}
    assert kwargs["contrast_limits"] == [0.0, 1000.0]
    for data, kwargs, _ in layers[1:]:
        assert isinstance(data, np.ndarray) and data.shape == SHAPE  # paintable
        assert kwargs["metadata"] == {"ome_zarr_path": str(store),
                                      "labels_name": kwargs["name"]}
    # From the NGFF colours: the palette's, as napari's corrections layer has them.
    assert layers[2][1]["colormap"][2] == [c / 255 for c in palette.rgba(palette.CHANNELS[0])]
    assert int(layers[2][0][2, 25, 25]) == 2


def test_reader_reports_unusable_ome_zarr(tmp_path: Path) -> None:
    from ome_zarr.format import FormatV05
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    path = tmp_path / "two_channels.zarr"
    root = zarr.group(store=parse_url(str(path), mode="w", fmt=FormatV05()).store)
    write_image(np.zeros((2, 4, 8, 8), np.uint8), root, axes="czyx", scale_factors=[],
                scale={"c": 1.0, "z": 1.0, "y": 1.0, "x": 1.0})
    reader = get_reader(str(path))  # it is OME-Zarr, so ours to explain
    assert reader is not None
    with pytest.raises(VolumeError, match="2 channels"):
        reader(str(path))


def test_napari_opens_store(make_napari_viewer, store: Path) -> None:
    viewer = make_napari_viewer()
    viewer.open(str(store), plugin="napari-finetune")
    names = [layer.name for layer in viewer.layers]
    assert names == [store.name.removesuffix(".zarr"), "ground_truth", "corrections"]
    image = viewer.layers[0]
    assert image.multiscale and len(image.data) == 3
    assert list(image.scale) == [2.0, 0.5, 0.5]
    assert image.metadata["ome_zarr_path"] == str(store)
    assert tuple(image.contrast_limits) == (0.0, 1000.0)
    for layer in viewer.layers[1:]:
        assert type(layer).__name__ == "Labels"
        assert layer.metadata["ome_zarr_path"] == str(store)
        assert layer.metadata["labels_name"] == layer.name
        assert list(layer.scale) == [2.0, 0.5, 0.5]
    corrections = viewer.layers["corrections"]
    corrections.data[3, 0, 0] = 1  # an editable array, as the brush needs
    assert int(corrections.data[2, 25, 25]) == 2


def test_big_labels_stay_lazy_and_broken_ones_are_skipped(store: Path, monkeypatch) -> None:
    import dask.array as da

    import napari_finetune._reader as reader

    monkeypatch.setattr(reader, "EDITABLE_LABELS_BYTES", 0)
    broken = zarr.open_group(str(store), mode="r+")["labels"].create_group("broken")
    del broken  # a group without NGFF metadata, listed below as if it were labels
    attrs = zarr.open_group(str(store / "labels"), mode="r+").attrs
    if "ome" in attrs:
        attrs["ome"] = {**attrs["ome"], "labels": [*attrs["ome"]["labels"], "broken"]}
    else:
        attrs["labels"] = [*attrs["labels"], "broken"]
    with pytest.warns(UserWarning, match=r"labels/broken skipped: .*without OME-NGFF"):
        layers = read_ome_zarr(str(store))
    assert [kw["name"] for _, kw, _ in layers[1:]] == ["ground_truth", "corrections"]
    for data, kwargs, _ in layers[1:]:  # every level, lazy: a multiscale Labels layer
        assert kwargs["multiscale"] and len(data) == 3
        assert all(isinstance(level, da.Array) for level in data)


# -- living beside napari-ome-zarr and napari's own readers ------------------------------------


def _readers_for(path: Path) -> set[str]:
    """Plugins napari offers for ``path`` (npe2's matching: patterns for files, any
    directory reader for a folder)."""
    import npe2

    manager = npe2.PluginManager.instance()
    manager.discover()
    return {r.plugin_name for r in manager.iter_compatible_readers([str(path)])}


def test_reader_claims_zarr_directories_not_every_file(tmp_path: Path, store: Path) -> None:
    """The manifest said "*": every .tif or .npy had two readers, and viewer.open raised."""
    np.save(tmp_path / "image.npy", np.zeros((4, 4)))
    (tmp_path / "image.tif").write_bytes(b"II*\x00")
    for path in (tmp_path / "image.npy", tmp_path / "image.tif"):
        assert "napari-finetune" not in _readers_for(path), path
    assert "napari-finetune" in _readers_for(store)


def test_napari_opens_other_files_without_asking(make_napari_viewer, tmp_path: Path) -> None:
    np.save(tmp_path / "image.npy", np.arange(16.0).reshape(4, 4))
    viewer = make_napari_viewer()
    # plugin=None: what the GUI does on File > Open; it raised MultipleReaderError before.
    layers = viewer.open(str(tmp_path / "image.npy"), plugin=None)
    assert [layer.name for layer in layers] == ["image"]


def test_two_readers_for_a_store_are_a_choice(make_napari_viewer, store: Path) -> None:
    """napari offers every directory reader for a folder: it asks (GUI) or says which (script)."""
    from napari.errors import MultipleReaderError

    assert {"napari-finetune", "napari-ome-zarr"} <= _readers_for(store)
    viewer = make_napari_viewer()
    with pytest.raises(MultipleReaderError, match="napari-finetune"):
        viewer.open(str(store), plugin=None)
    assert len(viewer.open(str(store), plugin="napari-finetune")) == 3


def test_layers_opened_by_napari_ome_zarr_lead_to_their_store(make_napari_viewer,
                                                              store: Path) -> None:
    """napari-ome-zarr records no store path of ours; napari's source.path is enough."""
    from napari_finetune.io.layer_store import store_of_layer
    from ngff_validation import assert_valid_ngff

    assert_valid_ngff(store)  # what save_corrections left is valid, with the image's levels
    viewer = make_napari_viewer()
    for opened in (store, store / "labels" / "corrections"):
        layers = viewer.open(str(opened), plugin="napari-ome-zarr")
        assert "ome_zarr_path" not in layers[0].metadata
        kinds = {type(layer).__name__ for layer in layers}
        assert "Labels" in kinds, kinds
        for layer in layers:
            assert store_of_layer(layer.metadata, layer.source.path) == store, opened
    labels = [layer for layer in viewer.layers if layer.name.endswith("corrections")
              and type(layer).__name__ == "Labels"]
    assert labels and all(len(layer.data) == 3 for layer in labels)  # the image's levels


def test_a_store_we_do_not_read_says_why_in_the_debug_log(tmp_path, caplog):
    import logging

    broken = tmp_path / "broken.zarr"
    broken.mkdir()
    (broken / "zarr.json").write_text('{"node_type": "group", "zarr_format": 3, "attributes": 1}')
    caplog.set_level(logging.DEBUG, logger="napari_finetune._reader")
    assert get_reader(str(broken)) is None
    assert any("does not read" in r.getMessage() for r in caplog.records)


# --- why a folder is declined, and the units the layers carry -----------------------------


def test_a_declined_zarr_folder_says_why(tmp_path: Path) -> None:
    """napari's own words for a plugin that declines are only "refused the file": the
    reason comes as a warning, which napari shows as a notification."""
    empty = tmp_path / "empty.ome.zarr"
    empty.mkdir()
    plain = tmp_path / "plain.zarr"
    zarr.open_group(str(plain), mode="w").create_array("0", shape=(4, 4), dtype="uint8")
    files = tmp_path / "tiffs.zarr"
    files.mkdir()
    (files / "a.tif").write_bytes(b"x")
    expected = {
        empty: "the folder is empty",
        plain: "the zarr group has no NGFF 'multiscales' metadata",
        files: "the folder has no zarr metadata",
    }
    for path, reason in expected.items():
        with pytest.warns(UserWarning, match=f"napari-finetune cannot open {path.name}: {reason}"):
            assert get_reader(str(path)) is None
    assert decline_reason(plain / "0").startswith("it is a bare zarr array")
    other = tmp_path / "other"  # not ours by name: declined without a word
    other.mkdir()
    (other / "a.tif").write_bytes(b"x")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_reader(str(other)) is None


def test_the_layers_carry_the_store_units(tmp_path: Path) -> None:
    path = _store(tmp_path / "units.zarr", "0.5")
    # ome-zarr-py writes no units unless asked: add them as another tool would.
    root = zarr.open_group(str(path), mode="r+")
    ome = dict(root.attrs["ome"])
    ome["multiscales"][0]["axes"] = [
        {"name": a, "type": "space", "unit": "micrometer"} for a in "zyx"
    ]
    root.attrs["ome"] = ome
    layers = read_ome_zarr(str(path))
    assert [kw.get("units") for _, kw, _ in layers] == [("micrometer",) * 3] * 2


def test_a_store_without_units_gives_layers_without(store: Path) -> None:
    assert all("units" not in kw for _, kw, _ in read_ome_zarr(str(store)))


def test_the_layers_carry_the_store_axis_labels(make_napari_viewer, store: Path) -> None:
    assert [kw.get("axis_labels") for _, kw, _ in read_ome_zarr(str(store))] == [
        ("z", "y", "x")] * 3
    viewer = make_napari_viewer()
    viewer.open(str(store), plugin="napari-finetune")
    assert all(tuple(layer.axis_labels) == ("z", "y", "x") for layer in viewer.layers)
    # The slice slider says "z", not "-3" (napari's name for an unnamed first axis).
    assert tuple(viewer.dims.axis_labels) == ("z", "y", "x")
