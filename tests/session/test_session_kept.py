"""Weights a remote run kept beside a store, offered when the store is opened again:
what the Session says of them, using them as the checkpoint, setting them aside."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kept_files import WHEN, write_kept

from napari_finetune.remote.kept import kept_path
from napari_finetune.session.kept import KeptWeights
from napari_finetune.session.runner import InlineRunner
from napari_finetune.session.session import Busy, Session


@pytest.fixture
def bare() -> tuple[Session, dict[str, list]]:
    """A session with nothing chosen yet (a front end just started), and what it signals."""
    session = Session(InlineRunner())
    got: dict[str, list] = {"kept_weights": [], "refused": [], "checkpoint_read": []}
    for name, items in got.items():
        getattr(session.events, name).connect(items.append)
    return session, got


def test_kept_weights_are_offered_with_one_line_and_used_as_the_checkpoint(
        bare, painted_store, checkpoint):
    from napari_finetune.loading import load_checkpoint

    session, got = bare
    path, weights = write_kept(painted_store, checkpoint, steps_done=3, total_steps=10)

    session.open_store(str(painted_store))

    kept = session.kept
    assert got["kept_weights"] == [kept] and isinstance(kept, KeptWeights) and kept.usable
    assert (kept.steps_done, kept.total_steps, kept.written) == (3, 10, WHEN)
    assert kept.worker == "tcp://10.0.0.7:4000" and kept.path == str(path)
    line = kept.line
    assert "\n" not in line and path.name in line and "step 3 of 10" in line
    assert WHEN.astimezone().strftime("%Y-%m-%d %H:%M") in line  # from when, local time
    assert "stopped after step 3" in line  # how the run ended, as its record says

    used = session.use_kept_weights()

    assert used is not None and Path(used).is_file() and not path.exists()
    assert Path(used).name == f"{path.stem}.used-20260304-050607.pt"
    assert got["kept_weights"] == [kept, None] and session.kept is None
    assert session.checkpoint == used and session.info is not None and session.info.path == used
    loaded = load_checkpoint(used).model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())
    assert got["refused"] == []
    # Opened again: nothing is offered (the file was taken, under another name).
    session.open_store(str(painted_store))
    assert session.kept is None and got["kept_weights"] == [kept, None]


def test_discard_sets_the_file_aside_never_deletes_it_and_ends_the_offer(
        bare, painted_store, checkpoint):
    session, got = bare
    path, _ = write_kept(painted_store, checkpoint)
    before = path.read_bytes()
    session.open_store(str(painted_store))
    assert session.kept is not None

    aside = session.discard_kept_weights()

    assert aside is not None and Path(aside).read_bytes() == before and not path.exists()
    assert Path(aside).name == f"{path.stem}.discarded-20260304-050607.pt"
    assert session.kept is None and got["kept_weights"][-1] is None
    assert session.checkpoint is None  # nothing was loaded
    # A second one of the same time does not overwrite the first.
    write_kept(painted_store, checkpoint)
    session.open_store(str(painted_store))
    again = session.discard_kept_weights()
    assert again is not None and again != aside and Path(aside).read_bytes() == before


def test_nothing_kept_offers_nothing(bare, painted_store):
    session, got = bare
    session.open_store(str(painted_store))
    assert session.kept is None and got["kept_weights"] == []
    assert session.use_kept_weights() is None
    assert got["refused"] == ["No kept weights to be used: none were found beside the store."]


def test_weights_kept_for_another_store_are_not_offered_for_use_but_can_be_set_aside(
        bare, painted_store, checkpoint):
    session, got = bare
    path, _ = write_kept(painted_store, checkpoint, for_store="/data/other.zarr")
    session.open_store(str(painted_store))

    kept = session.kept
    assert kept is not None and not kept.usable
    assert kept.problem == (f"it was kept for the store 'other.zarr', not "
                            f"'{Path(painted_store).name}'")
    assert "\n" not in kept.line and "cannot be used as a checkpoint" in kept.line
    assert session.use_kept_weights() is None and path.exists()
    assert got["refused"][-1].startswith("Cannot use the kept weights: it was kept for the "
                                         "store 'other.zarr'")
    assert session.checkpoint is None and got["checkpoint_read"] == []
    assert session.discard_kept_weights() is not None and not path.exists()


def test_a_file_that_is_no_checkpoint_is_named_in_one_line(bare, painted_store):
    session, _ = bare
    kept_path(painted_store).write_bytes(b"not a checkpoint")
    session.open_store(str(painted_store))
    kept = session.kept
    assert kept is not None and kept.problem.startswith("it is not a readable PyTorch checkpoint")
    assert "\n" not in kept.line


def test_kept_weights_are_not_used_while_busy_nor_after_the_file_changed(
        bare, painted_store, checkpoint):
    import os

    session, got = bare
    path, _ = write_kept(painted_store, checkpoint, steps_done=3)
    session.open_store(str(painted_store))
    assert session.hold(Busy.SHOW)
    assert session.use_kept_weights() is None and session.discard_kept_weights() is None
    assert got["refused"][-1].startswith("Cannot have the kept weights set aside now: busy")
    session.release(Busy.SHOW)
    # A run cut short since kept newer weights under the same name: they are offered anew.
    write_kept(painted_store, checkpoint, steps_done=7)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert session.use_kept_weights() is None and path.exists()
    assert "changed since it was offered" in got["refused"][-1]
    assert session.kept is not None and session.kept.steps_done == 7
    assert session.checkpoint is None


def test_another_store_withdraws_the_offer(bare, painted_store, checkpoint, tmp_path):
    session, got = bare
    write_kept(painted_store, checkpoint)
    session.open_store(str(painted_store))
    assert session.kept is not None
    session.open_store(str(tmp_path / "other.zarr"))
    assert session.kept is None and got["kept_weights"][-1] is None
