"""A store both machines see: the worker reads the image itself and no tiles travel; a
path the worker cannot open (or opens as another image) gets the tiles as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_remote_run import config

from napari_finetune.io.volume import open_volume
from napari_finetune.loading import load_checkpoint
from napari_finetune.remote.finetuner import RemoteFinetuner

pytestmark = pytest.mark.resource  # the LocalCluster


def painting_of(shape: tuple[int, ...]) -> np.ndarray:
    corrections = np.zeros(shape, np.uint8)
    corrections[2:6, 2:6, 2:6] = 1
    corrections[8:12, 20:25, 20:25] = 2
    return corrections


def run(remote: RemoteFinetuner) -> tuple[str, list[float]]:
    statuses = list(remote.run())
    return statuses[0].message, [s.loss for s in statuses if s.kind == "step"]


def test_a_store_the_worker_opens_is_read_there_and_trains_as_the_tiles_do(
    client, store, checkpoint
):
    image = open_volume(store).data
    corrections = painting_of(tuple(image.shape))
    by_store = RemoteFinetuner.remote(load_checkpoint(checkpoint), image, corrections,
                                      config(steps=3), client, store_path=store)
    line, losses = run(by_store)
    assert by_store.store_used and f"reads it from {store}" in line
    by_tiles = RemoteFinetuner.remote(load_checkpoint(checkpoint), image, corrections,
                                      config(steps=3), client)
    _, tile_losses = run(by_tiles)
    assert not by_tiles.store_used
    # Only the checkpoint and the painting travelled: the tiles' bytes less.
    assert by_tiles.bytes_sent - by_store.bytes_sent >= 0.5 * by_tiles.volume_bytes / 4
    assert by_store.bytes_sent == len(by_store.checkpoint) + by_store.inputs().painting.nbytes
    # The same pixels, the same seeded run.
    np.testing.assert_allclose(losses, tile_losses, rtol=0, atol=1e-6)
    for name, value in by_store.model.state_dict().items():
        torch.testing.assert_close(value, by_tiles.model.state_dict()[name])


@pytest.mark.parametrize("where", ["missing", "another image"])
def test_a_store_the_worker_cannot_open_as_the_image_gets_the_tiles(
    client, store, checkpoint, tmp_path, where
):
    image = open_volume(store).data
    corrections = painting_of(tuple(image.shape))
    path = tmp_path / "nowhere.zarr"
    if where == "another image":
        image = np.asarray(image)[:, :32]  # the client's image is not what the path holds
        corrections = corrections[:, :32]
        path = store
    remote = RemoteFinetuner.remote(load_checkpoint(checkpoint), image, corrections,
                                    config(steps=2), client, store_path=path)
    line, losses = run(remote)
    assert not remote.store_used
    assert f"{path} is not readable on the workers" in line and "tiles" in line
    assert remote.bytes_sent > len(remote.checkpoint) + remote.inputs().painting.nbytes
    assert len(losses) == 2


def test_a_relative_store_path_is_resolved_on_the_laptop(
    client, store, checkpoint, monkeypatch
):
    # The workers started in another directory: 'v.ome.zarr' given from the store's own
    # folder (the CLI's volume argument) names nothing there, or another store. Resolved
    # here it names the store (before: the tiles were sent, 'not readable on the workers').
    image = open_volume(store).data
    corrections = painting_of(tuple(image.shape))
    monkeypatch.chdir(store.parent)
    remote = RemoteFinetuner.remote(load_checkpoint(checkpoint), image, corrections,
                                    config(steps=1), client, store_path=store.name)
    line, _ = run(remote)
    assert remote.store_path == str(store.resolve())
    assert remote.store_used and f"reads it from {store.resolve()}" in line
