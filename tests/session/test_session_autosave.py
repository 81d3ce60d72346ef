"""The autosave through the Session: a painting is never saved nowhere.

A writable store takes its corrections; a read-only one (chmod) has them saved
beside it, in ``<name>.corrections.ome.zarr``, where reopening the store finds
them again. Real stores, run inline.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from napari_finetune.session.runner import InlineRunner
from napari_finetune.session.saving import CorrectionsFailed, CorrectionsSaved, next_snapshot
from napari_finetune.session.session import Session

CHANNELS = ["membrane", "mitochondria"]


@contextmanager
def read_only(store: Path) -> Iterator[None]:
    """``store``'s folders without any write bit (the labels writer honours that even as
    root), given back after."""
    folders = [store, *(p for p in store.rglob("*") if p.is_dir())]
    modes = {p: p.stat().st_mode for p in folders}
    for p in folders:
        os.chmod(p, modes[p] & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        yield
    finally:
        for p, mode in modes.items():
            os.chmod(p, mode)


def _painting() -> np.ndarray:
    labels = np.zeros((16, 40, 40), np.uint8)
    labels[3, 4:12, 4:12] = 1
    labels[8, 20:30, 10:20] = 3
    return labels


def _recorded(session: Session) -> dict[str, list]:
    got: dict[str, list] = {"saved": [], "failed": [], "ends": []}
    session.events.corrections_saved.connect(got["saved"].append)
    session.events.corrections_failed.connect(got["failed"].append)
    return got


def test_a_writable_store_takes_its_corrections(store):
    from napari_finetune.io.omezarr import load_corrections

    session = Session(InlineRunner(), store=str(store), channel_names=list(CHANNELS))
    got = _recorded(session)
    labels = _painting()
    assert session.save_corrections(labels, next_snapshot(), on_end=got["ends"].append)
    assert got["saved"] == [CorrectionsSaved(str(store), str(store))] and got["ends"] == [True]
    np.testing.assert_array_equal(load_corrections(store), labels)
    assert not (store.parent / "vol.corrections.ome.zarr").exists()


def test_a_read_only_store_autosaves_beside_it_and_reopening_finds_them(store):
    from napari_finetune._reader import read_ome_zarr
    from napari_finetune.io.omezarr import load_corrections
    from ngff_validation import assert_valid_ngff

    session = Session(InlineRunner(), store=str(store), channel_names=list(CHANNELS))
    got = _recorded(session)
    labels = _painting()
    sibling = store.parent / "vol.corrections.ome.zarr"
    with read_only(store):
        assert session.save_corrections(labels, next_snapshot(), on_end=got["ends"].append)
        assert got["saved"] == [CorrectionsSaved(str(store), str(sibling))]
        assert not (store / "labels").exists()  # nothing written into the store
        # Reopened: the loader and the reader find the painting beside the store.
        np.testing.assert_array_equal(load_corrections(store), labels)
        layers = {kwargs["name"]: (data, kwargs) for data, kwargs, _ in read_ome_zarr(str(store))}
        data, kwargs = layers["corrections"]
        np.testing.assert_array_equal(np.asarray(data), labels)
        # Its next save follows the store's rule, wherever the layer was read from.
        assert kwargs["metadata"]["ome_zarr_path"] == str(store)
        # A second save replaces the sibling's corrections.
        labels[10, 0:5, 0:5] = 2
        assert session.save_corrections(labels, next_snapshot())
        np.testing.assert_array_equal(load_corrections(store), labels)
    assert_valid_ngff(sibling)
    assert got["ends"] == [True] and not got["failed"]


def test_a_failed_save_says_why_and_where_the_next_one_goes(store):
    session = Session(InlineRunner(), store=str(store), channel_names=list(CHANNELS))
    got = _recorded(session)
    assert session.save_corrections(np.zeros((3, 4, 5), np.uint8), next_snapshot(),
                                    on_end=got["ends"].append)
    [failed] = got["failed"]
    assert isinstance(failed, CorrectionsFailed) and failed.next == str(store)
    assert failed.line.startswith("Autosave of the corrections failed: ") and "shape" in failed.line
    assert got["ends"] == [False] and not got["saved"]


def test_no_store_is_refused_in_one_line():
    session = Session(InlineRunner())
    refused: list[str] = []
    session.events.refused.connect(refused.append)
    assert not session.save_corrections(_painting())
    assert refused and "OME-Zarr" in refused[0]
