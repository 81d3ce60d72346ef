"""Session.add_structure: one more output channel for a new structure, as a new checkpoint
the session then works with (painted with the next label, trained, predicted)."""

from __future__ import annotations

from pathlib import Path

from tests.session.conftest import CHANNELS

from napari_finetune.session.session import Busy, Outcome


def test_a_structure_is_added_and_the_session_trains_and_predicts_with_it(
    session, record, tmp_path
):
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.objects import roles_from_metadata

    before = session.checkpoint
    out = tmp_path / "with-nuclei.pt"
    assert session.add_structure("nuclei", "object", out=str(out)) is True
    end = record["ended"][-1]
    assert end.action is Busy.STRUCTURE and end.outcome is Outcome.DONE, end
    assert "nuclei (object): paint it with label 4" in end.reason
    assert session.checkpoint == str(out) != before
    assert session.channel_names == [*CHANNELS, "nuclei"]
    added = load_checkpoint(out)
    assert list(added.channel_names) == [*CHANNELS, "nuclei"]
    assert roles_from_metadata(added.metadata, added.channel_names)["nuclei"].role == "object"
    # The new channel is painted with label 2 + 2 and trained on, then predicted.
    assert session.corrections is not None
    session.corrections[8, 2:6, 2:6] = 4
    assert session.finetune() is True
    assert record["ended"][-1].outcome is Outcome.DONE, record["ended"][-1]
    assert session.predict() is True
    assert session.prediction is not None and len(session.prediction.masks) == 3


def test_a_taken_name_fails_in_one_line_and_keeps_the_checkpoint(session, record):
    before = session.checkpoint
    assert session.add_structure(CHANNELS[0], "object") is True
    end = record["ended"][-1]
    assert end.outcome is Outcome.FAILED and "\n" not in end.reason, end
    assert session.checkpoint == before and session.added is None
    assert session.add_structure("  ", "object") is False
    assert record["refused"][-1] == "Cannot add a structure: give it a name."


def _sample_model() -> Path:
    import napari_finetune.samples

    return Path(napari_finetune.samples.__file__).with_name("synthetic_em_unet.pt")


def test_the_shipped_model_is_widened_beside_the_store_not_in_the_package(session, record):
    shipped = _sample_model()
    session.checkpoint = str(shipped)
    assert session.add_structure("vesicles", "object") is True
    end = record["ended"][-1]
    assert end.outcome is Outcome.DONE, end
    written = Path(session.checkpoint)
    assert written == Path(str(session.store)).parent / "synthetic_em_unet+vesicles.pt"
    assert written.is_file()
    assert not shipped.with_name("synthetic_em_unet+vesicles.pt").exists()
    assert str(written) in end.reason  # the panel's log names where it went


def test_the_shipped_model_without_a_store_goes_to_the_user_data_folder(
    session, record, tmp_path, monkeypatch
):
    monkeypatch.setenv("NAPARI_FINETUNE_CACHE", str(tmp_path / "data"))
    session.checkpoint, session.store = str(_sample_model()), None
    assert session.add_structure("vesicles", "object") is True
    assert record["ended"][-1].outcome is Outcome.DONE, record["ended"][-1]
    assert Path(session.checkpoint) == tmp_path / "data" / "synthetic_em_unet+vesicles.pt"
    assert not _sample_model().with_name("synthetic_em_unet+vesicles.pt").exists()
