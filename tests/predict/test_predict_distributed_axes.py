"""``predict --workers/--scheduler`` on stores with channels (CZYX) and time points (TZYX),
written by ome-zarr-py, on a real LocalCluster of 2 worker processes: the cluster writes
what the in-process prediction writes (the model's channels, one task per time point and
region, objects numbered per time point)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from distributed import Client

from napari_finetune.config import PredictConfig
from napari_finetune.io.omezarr import list_labels, open_volume
from napari_finetune.model.checkpoint import save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.objects import ChannelRole
from napari_finetune.predict.distributed import predict_on_cluster
from napari_finetune.predict.job import job_dir
from napari_finetune.predict.store import predict_to_omezarr
from ngff_validation import assert_napari_ome_zarr_reads_labels, assert_valid_ngff
from test_cli import assert_one_line_error, run_cli
from test_cli_axes import image_of, write_store
from test_cli_instances import same_up_to_relabelling

pytestmark = pytest.mark.resource  # a LocalCluster of worker processes

NAMES = ["a", "b"]
MASKS = [f"prediction-{n}" for n in NAMES]
SPATIAL = (8, 32, 32)
# Four regions per time point, so each time point is several tasks.
CONFIG = PredictConfig(block_shape=(8, 16, 16), halo=(4, 8, 8), device="cpu")
CLI_BLOCK = ["--block-shape", "8", "16", "16", "--halo", "4", "8", "8", "--device", "cpu", "-q"]


@pytest.fixture(scope="module")
def client():
    from napari_finetune.predict.distributed import local_cluster

    cluster, _ = local_cluster(2, dashboard_address=":0")
    with Client(cluster) as c:
        yield c
    cluster.close()


def model(path: Path, in_channels: int = 1) -> Path:
    net = UNet(dims=3, in_channels=in_channels, depth=2, features=4, out_channels=2)
    return save_checkpoint(path, net, {"channel_names": NAMES})


def labels(store: Path, name: str) -> tuple[list[str], np.ndarray]:
    volume = open_volume(store / "labels" / name, keep_axes=True)
    return list(volume.axes), np.asarray(volume.data)


def median_roles(checkpoint: Path, frame: np.ndarray) -> dict[str, ChannelRole]:
    """Roles whose thresholds sit at the medians of the untrained model's output on
    ``frame``: many objects to compare."""
    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.model.checkpoint import load_checkpoint
    from napari_finetune.predict import predict_volume

    ckpt = load_checkpoint(checkpoint)
    probs = np.asarray(predict_volume(ckpt.model, frame,
                                      intensity_range(frame, ckpt.normalization), CONFIG))
    return {"a": ChannelRole("object", threshold=float(np.median(probs[0])), min_size=3),
            "b": ChannelRole("boundary", threshold=float(np.median(probs[1])),
                             seed_distance=1.0)}


def assert_same_masks(store: Path, reference: Path) -> None:
    for name in MASKS:
        got, want = labels(store, name), labels(reference, name)
        assert got[0] == want[0], name
        np.testing.assert_array_equal(got[1], want[1], err_msg=name)
    assert_valid_ngff(store)
    assert not job_dir(store, "prediction").exists()


def test_a_two_channel_model_predicts_both_channels_of_a_czyx_store(tmp_path, client):
    image = np.stack([image_of(SPATIAL, 0), image_of(SPATIAL, 1)])
    checkpoint = model(tmp_path / "m.pt", in_channels=2)
    reference = write_store(tmp_path / "ref.zarr", image, "czyx")
    predict_to_omezarr(checkpoint, reference, config=CONFIG)
    store = write_store(tmp_path / "czyx.zarr", image, "czyx")
    run = predict_on_cluster(checkpoint, store, client, config=CONFIG)
    assert run.total == 4 and len(run.computed) == 4
    assert labels(store, MASKS[0])[0] == ["z", "y", "x"]
    assert_same_masks(store, reference)
    # The second channel reaches the workers' model: another one, another prediction.
    other = write_store(tmp_path / "other.zarr", np.stack([image_of(SPATIAL, 0),
                                                           image_of(SPATIAL, 2)]), "czyx")
    predict_on_cluster(checkpoint, other, client, config=CONFIG)
    assert not np.array_equal(np.stack([labels(store, n)[1] for n in MASKS]),
                              np.stack([labels(other, n)[1] for n in MASKS]))


def test_a_one_channel_model_predicts_the_channel_asked_for(tmp_path, client):
    image = np.stack([image_of(SPATIAL, 0), image_of(SPATIAL, 1)])
    checkpoint = model(tmp_path / "m.pt")
    store = write_store(tmp_path / "czyx.zarr", image, "czyx")
    predict_on_cluster(checkpoint, store, client, config=CONFIG, channel=1)
    alone = write_store(tmp_path / "alone.zarr", image[1], "zyx")
    predict_to_omezarr(checkpoint, alone, config=CONFIG)
    assert_same_masks(store, alone)


def test_a_time_series_is_a_task_per_time_point_and_region_with_objects_per_time_point(
    tmp_path, client
):
    frames = np.stack([image_of(SPATIAL, seed) for seed in range(3)])
    checkpoint = model(tmp_path / "m.pt")
    roles = median_roles(checkpoint, frames[0])
    reference = write_store(tmp_path / "ref.zarr", frames, "tzyx")
    predict_to_omezarr(checkpoint, reference, config=CONFIG, instances=roles)
    store = write_store(tmp_path / "tzyx.zarr", frames, "tzyx")
    run = predict_on_cluster(checkpoint, store, client, config=CONFIG, instances=roles)
    assert run.total == 3 * 4 and sorted(i for i, _ in run.computed) == list(range(12))
    assert run.blocks == {"objects-a": (12, 12), "objects-b": (12, 12)}
    assert_same_masks(store, reference)
    objects = ["objects-a", "objects-b"]
    assert sorted(list_labels(store)) == sorted(MASKS + objects)
    assert_napari_ome_zarr_reads_labels(store, MASKS + objects)
    for name in MASKS + objects:
        axes, data = labels(store, name)
        assert axes == ["t", "z", "y", "x"] and data.shape == (3, *SPATIAL), name
    for name in objects:
        got, want = labels(store, name)[1], labels(reference, name)[1]
        assert run.objects[name] == sum(int(want[t].max()) for t in range(3)), name
        for t in range(3):  # each time point numbers its own objects 1..N
            assert want[t].max() > 1, (name, t)
            assert same_up_to_relabelling(got[t], want[t]), (name, t)
            ids = np.unique(got[t][got[t] > 0])
            assert ids.tolist() == list(range(1, ids.size + 1)), (name, t)


def test_cli_workers_predict_a_time_series_and_check_the_channel_first(capsys, tmp_path):
    frames = np.stack([image_of(SPATIAL, seed) for seed in range(2)])
    checkpoint = model(tmp_path / "m.pt")
    store = write_store(tmp_path / "tzyx.zarr", frames, "tzyx")
    code, out, err = run_cli(capsys, "predict", checkpoint, store, "--workers", "2", *CLI_BLOCK)
    assert code == 0, err
    assert "8 regions computed, 0 already written by an earlier run (of 8)" in out
    reference = write_store(tmp_path / "ref.zarr", frames, "tzyx")
    predict_to_omezarr(checkpoint, reference, config=CONFIG)
    assert_same_masks(store, reference)
    # A channel choice that does not fit is one line, before any cluster starts.
    two = write_store(tmp_path / "czyx.zarr", np.stack([frames[0], frames[1]]), "czyx")
    code, out, err = run_cli(capsys, "predict", checkpoint, two, "--workers", "2", *CLI_BLOCK)
    assert_one_line_error(code, err, expected=2)
    assert "the store has 2 channels and the model takes 1: pass --channel 0 or --channel 1." \
        in err
    assert "local dask cluster" not in out


def test_an_interrupted_time_series_resumes_with_the_same_masks_and_objects(tmp_path, client):
    """Ctrl-C in the client after about half the region tasks of a TZYX store; the same call
    again computes only the tasks without a done marker (numbered time point after time
    point) and writes what the in-process prediction writes."""
    from test_predict_distributed import _wait_idle

    from napari_finetune.predict.job import done_regions

    frames = np.stack([image_of(SPATIAL, seed) for seed in range(2)])
    checkpoint = model(tmp_path / "m.pt")
    roles = median_roles(checkpoint, frames[0])
    reference = write_store(tmp_path / "ref.zarr", frames, "tzyx")
    predict_to_omezarr(checkpoint, reference, config=CONFIG, instances=roles)
    store = write_store(tmp_path / "tzyx.zarr", frames, "tzyx")

    def interrupt_at_half(done: int, total: int) -> None:
        if done >= 4:  # of 8 region tasks (and the objects' blocks)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        predict_on_cluster(checkpoint, store, client, config=CONFIG, instances=roles,
                           progress=interrupt_at_half)
    _wait_idle(client)
    assert list_labels(store) == []  # nothing listed: no reader sees a half result
    before = done_regions(job_dir(store, "prediction"))
    assert 4 <= len(before) < 8
    lines: list[str] = []
    run = predict_on_cluster(checkpoint, store, client, config=CONFIG, instances=roles,
                             log=lines.append)
    assert f"{len(before)} of 8 regions already written" in lines[0]
    assert set(run.skipped) == before
    assert sorted(i for i, _ in run.computed) == sorted(set(range(8)) - before)
    assert_same_masks(store, reference)
    for name in ("objects-a", "objects-b"):
        got, want = labels(store, name)[1], labels(reference, name)[1]
        for t in range(2):
            assert want[t].max() > 1, (name, t)
            assert same_up_to_relabelling(got[t], want[t]), (name, t)
