"""ome-zarr-py's notices during our reads go to our debug log; nobody's logger level changes."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from napari_finetune.io.ome_zarr_log import quiet_ome_zarr
from napari_finetune.io.omezarr import open_volume

OME_READER = logging.getLogger("ome_zarr.reader")


def _ome_zarr_records(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("ome_zarr")]


def test_notices_inside_the_block_go_to_the_debug_log_only(caplog):
    caplog.set_level(logging.DEBUG)
    with quiet_ome_zarr():
        OME_READER.warning("labels without a source")
        OME_READER.error("a real error still shows")
    OME_READER.warning("after the block: shown")
    assert _ome_zarr_records(caplog) == ["a real error still shows", "after the block: shown"]
    ours = [r for r in caplog.records if r.name == "napari_finetune.io.ome_zarr_log"]
    assert [r.levelno for r in ours] == [logging.DEBUG]
    assert "labels without a source" in ours[0].getMessage()


def test_another_thread_is_not_silenced_and_levels_stay(caplog):
    caplog.set_level(logging.INFO)
    levels = [logging.getLogger(n).level for n in ("ome_zarr", "ome_zarr.reader")]
    inside, done = threading.Event(), threading.Event()

    def reader() -> None:
        with quiet_ome_zarr():
            inside.set()
            done.wait(10)

    worker = threading.Thread(target=reader)
    worker.start()
    inside.wait(10)
    OME_READER.warning("the user's own ome-zarr call, meanwhile")
    done.set()
    worker.join()
    assert _ome_zarr_records(caplog) == ["the user's own ome-zarr call, meanwhile"]
    assert [logging.getLogger(n).level for n in ("ome_zarr", "ome_zarr.reader")] == levels


def test_open_volume_leaves_the_ome_zarr_level_alone(store: Path):
    logger = logging.getLogger("ome_zarr")
    logger.setLevel(logging.INFO)  # the user's setting
    try:
        open_volume(store)
        assert logger.level == logging.INFO
    finally:
        logger.setLevel(logging.NOTSET)
