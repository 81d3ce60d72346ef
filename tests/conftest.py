"""Shared test set-up: deterministic torch on one thread; the CLI tests' store and model."""

import gc
import time

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _seeded_single_threaded_torch():
    """Seed torch and run it on one thread, restoring the thread count after.

    The tiny models of the tests spend their time in thread start-up and
    spinning, not in arithmetic: on a shared 2-core machine one thread was ~7x
    faster (measured 0.46 s vs 3.4 s for the same 3-step run).
    """
    import torch

    torch.manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _no_sample_thread_outlives_a_test(request):
    """Nothing a run starts may keep running after it: a finished, stopped, failed or
    abandoned run (a napari worker quit mid-run) closes its sample feed's thread."""
    import threading
    import time

    def feeds() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "napari-finetune-prefetch"]

    yield
    deadline = time.monotonic() + 10  # a run stopped at its next step may still be ending
    while feeds() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not feeds(), f"a sample feed thread outlived {request.node.nodeid}"


@pytest.fixture
def unfrozen():
    """Nothing frozen when the test begins, as in a user's process (the suite freezes its
    imports: ``pytest_collection_finish``); the suite's freeze is put back after it. A
    test with a viewer asks for it first, so it ends last: after the viewer is closed,
    never freezing a viewer the test leaves."""
    before = gc.get_freeze_count()
    gc.unfreeze()
    yield
    gc.unfreeze()
    if before:
        gc.freeze()


@pytest.fixture
def store(tmp_path):
    """A 16x40x40 NGFF store written by ome-zarr-py, nothing painted."""
    from test_cli import make_store

    return make_store(tmp_path / "vol.zarr")


@pytest.fixture
def checkpoint(tmp_path):
    """A tiny 3D UNet checkpoint with the sample's two channels."""
    from napari_finetune.model.checkpoint import save_checkpoint
    from napari_finetune.model.unet import UNet
    from test_cli import CHANNELS

    model = UNet(dims=3, depth=2, features=4, out_channels=2)
    return save_checkpoint(tmp_path / "model.pt", model, {"channel_names": CHANNELS})


@pytest.fixture
def painted_store(store):
    """``store`` with a few painted corrections of three labels."""
    from napari_finetune.io.omezarr import save_corrections

    corrections = np.zeros((16, 40, 40), np.uint8)
    corrections[4, 5:15, 5:15] = 1
    corrections[4, 20:25, 20:30] = 2
    corrections[6, 20:25, 20:30] = 3
    save_corrections(store, corrections)
    return store


@pytest.fixture
def packages(monkeypatch) -> list[dict]:
    """What bioimage.io's export was called with, instead of writing a package: for the
    tests of what asks for one (the Session, the widget); tests/model/test_bioimageio_out.py
    writes real ones and has bioimage.io test them."""
    from pathlib import Path

    from napari_finetune.bioimageio import export

    calls: list[dict] = []

    def record_call(source, out_path, volume, trust=None, metadata=None):
        calls.append({"source": source, "volume": volume, "trust": trust, "metadata": metadata})
        return Path(out_path)

    monkeypatch.setattr(export, "export_bioimageio", record_call)
    return calls


def pytest_collection_finish(session):
    """Hide what collection imported (napari, torch, pydantic models...) from the cycle collector.

    Those objects live as long as the process. Recovery code and napari's viewer
    teardown call ``gc.collect()`` often, and each full collection walked all of
    them: 0.23 s per call in a trainer test process before this freeze. Objects a
    test creates are still collected as before.
    """
    gc.freeze()
    gc.callbacks.append(_note_slow_full_collections)


# A full collection slower than this walked objects worth hiding again (one of a few
# thousand objects, as after a freeze, takes well under a millisecond).
SLOW_FULL_COLLECTION_S = 0.02
_slow = {"seen": False, "start": 0.0}


def _note_slow_full_collections(phase: str, info: dict[str, int]) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        _slow["start"] = time.perf_counter()
    elif time.perf_counter() - _slow["start"] > SLOW_FULL_COLLECTION_S:
        _slow["seen"] = True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """After a slow full collection, hide again what the earlier tests left alive.

    Tests import more after collection (torch._dynamo with the first optimizer, napari's
    viewer, PEFT and transformers, bioimage.io...): some 450 000 objects that every full
    collection walked again. In the parallel tests, full collections took 40 s of each
    worker's CPU (4 and 8 s with this). Done before the test's fixtures exist and after
    one last collection, so what is hidden is what lives on anyway (modules, caches,
    fixtures of a wider scope), never an object of this test and no garbage.
    """
    if _slow["seen"]:
        _slow["seen"] = False
        gc.collect()
        gc.freeze()
