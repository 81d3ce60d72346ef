"""Reading a checkpoint through the Session, and the trust its model code asks for.

Real checkpoint files, run inline; the one stand-in is the user, who answers
``trust_asked`` by calling ``Session.answer_trust``.
"""

from __future__ import annotations

import sys

import pytest
import torch

from napari_finetune.model.bring_your_own import checkpoint_from_factory
from napari_finetune.model.checkpoint import FORMAT, FORMAT_VERSION
from napari_finetune.session.checkpoint import CheckpointInfo, CheckpointUnusable, Untrusted
from napari_finetune.session.runner import InlineRunner
from napari_finetune.session.session import Session

CHANNELS = ["membrane", "mitochondria"]
KWARGS = {"dims": 3, "in_channels": 1, "out_channels": 2, "depth": 2, "features": 4}


def _recorded(session: Session, answer: bool | None = None) -> dict[str, list]:
    """What the session's checkpoint events said; ``answer`` given to each trust request."""
    got: dict[str, list] = {"read": [], "asked": [], "unusable": []}
    session.events.checkpoint_read.connect(got["read"].append)
    session.events.checkpoint_unusable.connect(got["unusable"].append)

    def asked(request: Untrusted) -> None:
        got["asked"].append(request)
        if answer is not None:
            session.answer_trust(request, answer)

    session.events.trust_asked.connect(asked)
    return got


def test_an_allowed_checkpoint_is_read_without_asking(checkpoint):
    session = Session(InlineRunner())
    got = _recorded(session)
    session.read_checkpoint(str(checkpoint))
    assert not got["asked"] and not got["unusable"]
    [info] = got["read"]
    assert isinstance(info, CheckpointInfo) and session.info is info
    assert session.checkpoint == str(checkpoint) and session.channel_names == CHANNELS
    assert info.dims == 3 and info.trust == ()


def test_yes_reads_it_again_with_its_factory_trusted(tmp_path, monkeypatch):
    (tmp_path / "lab_models_yes.py").write_text(
        "from napari_finetune.model.unet import UNet\n\n"
        "def tiny_unet(**kwargs):\n    return UNet(**kwargs)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lab_models_yes

    path = checkpoint_from_factory(tmp_path / "lab.pt", "lab_models_yes:tiny_unet", KWARGS,
                                   lab_models_yes.tiny_unet(**KWARGS).state_dict(),
                                   {"channel_names": CHANNELS})
    session = Session(InlineRunner())
    got = _recorded(session, answer=True)
    session.read_checkpoint(str(path))
    [request] = got["asked"]
    assert request.factory == "lab_models_yes:tiny_unet" and request.path == str(path)
    [info] = got["read"]
    assert info.trust == ("lab_models_yes:tiny_unet",) and info.channel_names == CHANNELS
    # The trust travels with the session's later jobs (its predict reads the file again).
    assert session.trust == info.trust and not got["unusable"]


def test_no_imports_nothing_and_says_what_was_refused(tmp_path, monkeypatch):
    imported, ran = tmp_path / "imported", tmp_path / "ran"
    (tmp_path / "lab_models_no.py").write_text(
        f"open({str(imported)!r}, 'w').close()\n"
        f"def build(**kwargs):\n    open({str(ran)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "hostile.pt"
    torch.save({"format": FORMAT, "format_version": FORMAT_VERSION,
                "architecture": {"factory": "lab_models_no:build", "kwargs": {}},
                "state_dict": {}, "metadata": {"channel_names": CHANNELS}}, path)
    session = Session(InlineRunner())
    got = _recorded(session, answer=False)
    session.read_checkpoint(str(path))
    assert len(got["asked"]) == 1 and not got["read"]
    [end] = got["unusable"]
    assert isinstance(end, CheckpointUnusable) and end.untrusted
    assert "lab_models_no:build" in end.line and "Nothing from it was imported" in end.line
    assert not imported.exists() and not ran.exists() and "lab_models_no" not in sys.modules
    assert session.info is None


def test_an_unreadable_file_says_why_in_one_line(tmp_path):
    path = tmp_path / "broken.pt"
    path.write_bytes(b"not a checkpoint")
    session = Session(InlineRunner())
    got = _recorded(session)
    session.read_checkpoint(str(path))
    [end] = got["unusable"]
    assert not end.untrusted and end.line.startswith("Cannot use this checkpoint: ")
    assert "\n" not in end.line and session.info is None


@pytest.mark.parametrize("trusted", [True, False])
def test_an_answer_for_a_file_no_longer_read_is_ignored(checkpoint, trusted):
    session = Session(InlineRunner())
    got = _recorded(session)
    session.read_checkpoint(str(checkpoint))
    session.answer_trust(Untrusted("elsewhere.pt", "x:y"), trusted)
    assert len(got["read"]) == 1 and not got["unusable"]
