"""One palette: napari's layers, the store's labels, the demo figure and the checkpoint agree."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from napari_finetune import palette
from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint
from napari_finetune.model.unet import UNet


def test_saved_colours_are_used_only_when_they_fit():
    names = ["membrane", "mitochondria"]
    assert palette.channel_colors(names) == list(palette.CHANNELS[:2])
    saved = {"channel_colors": ["#112233", "#445566ff"]}
    assert palette.channel_colors(names, saved) == ["#112233", "#445566ff"]
    # Another count, or not a colour: the palette, never an error.
    assert palette.channel_colors(names, {"channel_colors": ["#112233"]}) == list(
        palette.CHANNELS[:2])
    assert palette.channel_colors(names, {"channel_colors": ["red", "blue"]}) == list(
        palette.CHANNELS[:2])
    assert palette.default_colors(len(palette.CHANNELS) + 1)[-1] == palette.CHANNELS[0]


def test_rgba():
    assert palette.rgba("#ff3fd2") == [255, 63, 210, 255]
    assert palette.rgba("#01020304") == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="not a colour; use '#rrggbb'"):
        palette.rgba("magenta")


def test_checkpoint_saves_the_colours_and_reads_them_back(tmp_path):
    model = UNet(dims=3, depth=1, features=2, out_channels=2)
    path = save_checkpoint(tmp_path / "m.pt", model, {"channel_names": ["a", "b"]})
    payload = torch.load(path, weights_only=True)
    assert payload["metadata"]["channel_colors"] == list(palette.CHANNELS[:2])
    # A checkpoint with colours of its own keeps them through a load and a save.
    mine = ["#102030", "#405060"]
    path = save_checkpoint(tmp_path / "c.pt", model, {"channel_names": ["a", "b"],
                                                     "channel_colors": mine})
    loaded = load_checkpoint(path)
    assert loaded.channel_colors == mine
    again = save_checkpoint(tmp_path / "d.pt", loaded.model, loaded.metadata)
    assert load_checkpoint(again).channel_colors == mine


def test_corrections_in_the_store_have_the_palette_colours(tmp_path: Path):
    import zarr
    from ome_zarr.format import FormatV05
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    from napari_finetune.io.omezarr import save_corrections

    store = tmp_path / "s.ome.zarr"
    root = zarr.group(store=parse_url(str(store), mode="w", fmt=FormatV05()).store)
    write_image(np.zeros((4, 16, 16), np.uint8), root, axes="zyx", scaler=None)
    corrections = np.zeros((4, 16, 16), np.uint8)
    corrections[0, 0, :3] = [1, 2, 3]
    save_corrections(store, corrections, channel_names=["membrane", "mitochondria"])
    attrs = json.loads((store / "labels" / "corrections" / "zarr.json").read_text())
    colors = {c["label-value"]: c["rgba"] for c in attrs["attributes"]["ome"]["image-label"][
        "colors"]}
    assert colors == {1: palette.rgba(palette.BACKGROUND), 2: palette.rgba(palette.CHANNELS[0]),
                      3: palette.rgba(palette.CHANNELS[1])}
    save_corrections(store, corrections, channel_names=["membrane", "mitochondria"],
                     channel_colors=["#000001", "#000002"])
    attrs = json.loads((store / "labels" / "corrections" / "zarr.json").read_text())
    assert attrs["attributes"]["ome"]["image-label"]["colors"][1]["rgba"] == [0, 0, 1, 255]
