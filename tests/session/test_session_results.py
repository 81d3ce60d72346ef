"""The Session's result actions, headless: Save predictions, Paint here next, bioimage.io.

What the widget's result buttons do, without a viewer: each action done,
refused with its one-line reason before any job, and failed (its job raises)
with a one-line reason, the session free again.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tests.session.conftest import CHANNELS

from napari_finetune.session.session import ActionEnd, Busy, Outcome


def _labels(store: str) -> set[str]:
    import zarr

    return set(zarr.open_group(f"{store}/labels", mode="r").group_keys())


def _colors(store: str, name: str) -> dict[int, list[int]]:
    attrs = json.loads((Path(store) / "labels" / name / "zarr.json").read_text())
    return {c["label-value"]: c["rgba"]
            for c in attrs["attributes"]["ome"]["image-label"]["colors"]}


# -- Save predictions --------------------------------------------------------------------------
def test_save_writes_the_masks_given_in_their_channels_colour_and_skips_other_shapes(
        session, record):
    """As the widget: the layers' masks as the user left them (a deleted layer is not
    written), each in its channel's colour, and objects of another shape (an earlier
    prediction's) left out."""
    from napari_finetune import palette
    from napari_finetune.io.omezarr import open_volume

    session.channel_colors = ["#102030", "#405060"]
    shape = session.image.shape
    edited = np.zeros(shape, np.uint8)
    edited[2, 3:9, 4:7] = 1
    ids = np.zeros(shape, np.uint32)
    ids[5, 10:20, 10:20] = 7
    earlier = np.ones((4, 4, 4), np.uint32)
    assert session.save_predictions({"mitochondria": edited},
                                    {"mitochondria": ids, "membrane": earlier}) is True
    assert record["ended"] == [ActionEnd(Busy.SAVE, Outcome.DONE, "")]
    assert record["busy"] == [Busy.SAVE, None]
    assert session.saved == ["prediction-mitochondria", "objects-mitochondria"]
    assert _labels(session.store) >= set(session.saved)
    assert not {"prediction-membrane", "objects-membrane"} & _labels(session.store)
    saved = np.asarray(open_volume(f"{session.store}/labels/prediction-mitochondria").data)
    np.testing.assert_array_equal(saved, edited)
    objects = np.asarray(open_volume(f"{session.store}/labels/objects-mitochondria").data)
    np.testing.assert_array_equal(objects, ids)
    # mitochondria is the checkpoint's second channel: its colour, not the first one's
    assert _colors(session.store, "prediction-mitochondria") == {1: palette.rgba("#405060")}


def test_save_leaves_out_the_objects_of_an_earlier_prediction(session, record):
    from napari_finetune.objects import ChannelRole

    session.roles = {"mitochondria": ChannelRole("object", threshold=0.5)}
    assert session.predict() is True and session.objects() is True
    assert session.found_objects
    assert session.predict() is True  # new masks: the objects found before do not match
    assert session.save_predictions() is True
    assert record["ended"][-1] == ActionEnd(Busy.SAVE, Outcome.DONE, "")
    assert session.saved == [f"prediction-{c}" for c in CHANNELS]
    assert not any(name.startswith("objects-") for name in _labels(session.store))


def test_save_is_refused_without_a_store_or_a_mask(session, record):
    session.store = None
    assert session.save_predictions({"membrane": np.zeros(session.image.shape, np.uint8)}) \
        is False
    session.store = "somewhere.zarr"
    assert session.save_predictions({}) is False
    assert session.save_predictions() is False  # nothing predicted yet
    assert record["refused"] == [
        "Cannot save predictions: the image has no OME-Zarr store; open the image from a "
        ".zarr folder.",
        "Cannot save predictions: no mask to write; press Predict first.",
        "No prediction yet: press Predict first.",
    ]
    assert record["busy"] == [] and record["ended"] == []


def test_a_failed_save_ends_failed_with_one_line(session, record, monkeypatch):
    from napari_finetune.io import pyramid

    def full(group) -> None:
        raise OSError("disk full\nwhile writing level 1")

    monkeypatch.setattr(pyramid, "fill_pyramid", full)
    assert session.save_predictions({"membrane": np.zeros(session.image.shape, np.uint8)})
    assert record["ended"] == [
        ActionEnd(Busy.SAVE, Outcome.FAILED, "save predictions failed: disk full")]
    assert session.busy is None and session.saved == []


def test_a_save_failing_part_way_leaves_every_image_as_the_last_save_left_it(
        session, record, monkeypatch):
    """Never half written and never a mixed save: the fourth image of a save fails after
    three were written (in their staging folders); none of them is swapped in."""
    import zarr

    from napari_finetune.io import pyramid

    def levels(name: str) -> list[np.ndarray]:
        group = zarr.open_group(f"{session.store}/labels/{name}", mode="r")
        paths = [d["path"] for d in group.attrs["ome"]["multiscales"][0]["datasets"]]
        return [np.asarray(group[p]) for p in paths]

    shape = session.image.shape
    ids = np.zeros(shape, np.uint32)
    ids[5, 10:20, 10:20], ids[9, 2:6, 2:6] = 1, 2
    masks = {c: (ids > 0).astype(np.uint8) for c in CHANNELS}
    assert session.save_predictions(masks, {c: ids for c in CHANNELS}) is True
    before = {name: levels(name) for name in session.saved}
    assert len(before) == 4 and record["ended"][-1].outcome is Outcome.DONE

    real, filled = pyramid.fill_pyramid, []

    def fill_then_fail(group) -> None:
        real(group)
        filled.append(group)
        if len(filled) == 4:  # both masks, the membrane objects, then the last one fails
            raise OSError("disk full")

    monkeypatch.setattr(pyramid, "fill_pyramid", fill_then_fail)
    edited = {c: np.zeros(shape, np.uint8) for c in CHANNELS}
    assert session.save_predictions(edited, {c: ids + 1 for c in CHANNELS}) is True
    assert record["ended"][-1] == ActionEnd(
        Busy.SAVE, Outcome.FAILED, "save predictions failed: disk full")
    assert len(filled) == 4 and _labels(session.store) == {"corrections", *before}
    for name, old in before.items():  # every level as the first save left it
        for level, was in zip(levels(name), old, strict=True):
            np.testing.assert_array_equal(level, was)
    assert not [p.name for p in Path(session.store).iterdir() if "staging" in p.name]


# -- Paint here next ---------------------------------------------------------------------------
def test_suggest_by_default_a_region_of_half_a_training_patch(session, record):
    """The widget's region: half the patch of the run's settings, here (8, 16, 16)."""
    assert session.config.patch_shape == (16, 32, 32)
    assert session.uncertainty is None
    assert session.suggest() is True
    assert record["ended"] == [ActionEnd(Busy.SUGGEST, Outcome.DONE, "")]
    box = session.suggestion.box
    assert tuple(b.stop - b.start for b in box) == (8, 16, 16), box
    first = session.uncertainty
    assert first is not None and first.shape == session.image.shape
    assert session.suggest() is True
    assert session.uncertainty is first  # the same weights: the same map, not computed again


def test_suggest_is_refused_without_a_checkpoint(session, record):
    session.checkpoint = None
    assert session.suggest() is False
    assert record["refused"] == ["No model: choose a checkpoint first."]
    assert record["ended"] == [] and session.uncertainty is None


def test_a_failed_suggest_ends_failed_with_one_line(session, record, tmp_path):
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint at all")
    session.checkpoint = str(broken)
    assert session.suggest() is True
    end = record["ended"][-1]
    assert (end.action, end.outcome) == (Busy.SUGGEST, Outcome.FAILED)
    assert end.reason.startswith("suggest where to paint failed: ") and "\n" not in end.reason
    assert session.busy is None and session.suggestion is None and session.uncertainty is None


# -- bioimage.io -------------------------------------------------------------------------------
def test_bioimageio_packages_the_checkpoint_then_the_run_with_the_roles_held(
        session, record, packages, tmp_path):
    from napari_finetune.objects import ChannelRole, roles_to_metadata

    out = str(tmp_path / "model.zip")
    assert session.export_bioimageio(out) is True
    assert record["ended"] == [ActionEnd(Busy.BIOIMAGEIO, Outcome.DONE, "")]
    assert session.package == out
    assert packages[0]["source"] == session.checkpoint and packages[0]["volume"] is session.image
    assert packages[0]["metadata"] is None  # no roles held: the checkpoint's own

    session.roles = {"membrane": ChannelRole(), "mitochondria": ChannelRole("object",
                                                                             min_size=9)}
    session.trust = ("my.factory",)
    assert session.finetune() is True and session.trainer.steps_done == 2
    assert session.export_bioimageio(out) is True
    assert record["ended"][-1] == ActionEnd(Busy.BIOIMAGEIO, Outcome.DONE, "")
    assert packages[1]["source"] is session.trainer  # the run's weights, not the file's
    assert packages[1]["trust"] == ("my.factory",)
    assert packages[1]["metadata"] == roles_to_metadata(session.roles, {})


def test_bioimageio_is_refused_while_the_roles_are_invalid_or_without_an_image(
        session, record, packages):
    session.roles_error = "mitochondria: min_size must be a whole number >= 0; type one."
    assert session.export_bioimageio("model.zip") is False
    session.roles_error, session.image = "", None
    assert session.export_bioimageio("model.zip") is False
    assert record["refused"] == [
        "Cannot export: mitochondria: min_size must be a whole number >= 0; type one.",
        "Nothing to work on: choose an image first.",
    ]
    assert record["ended"] == [] and packages == [] and session.package is None


def test_a_failed_bioimageio_export_ends_failed_with_one_line(session, record, monkeypatch):
    from napari_finetune.bioimageio import export

    def invalid(*args, **kwargs):
        raise ValueError("the package failed bioimage.io's test\ndetails: ...")

    monkeypatch.setattr(export, "export_bioimageio", invalid)
    assert session.export_bioimageio("model.zip") is True
    assert record["ended"] == [ActionEnd(
        Busy.BIOIMAGEIO, Outcome.FAILED,
        "bioimage.io export failed: the package failed bioimage.io's test")]
    assert session.busy is None and session.package is None


def test_export_is_refused_while_the_roles_are_invalid(session, record, tmp_path):
    """The widget refused an export with invalid roles and the Session did not: the rule
    lives once, in the Session."""
    assert session.finetune() is True and session.trainer.steps_done == 2
    session.roles_error = "mitochondria: min_size must be a whole number >= 0; type one."
    target = tmp_path / "finetuned.pt"
    assert session.export(str(target)) is False
    assert record["refused"][-1] == (
        "Cannot export: mitochondria: min_size must be a whole number >= 0; type one.")
    assert not target.exists() and session.exported is None
