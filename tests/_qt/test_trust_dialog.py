"""A checkpoint whose model factory is not on the allow-list: the widget asks before importing it.

Real checkpoint files on disk; the one fake is the user's answer to the
dialog (``QMessageBox.question`` returns Yes or No instead of waiting for a click).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from napari.utils.notifications import NotificationSeverity, notification_manager
from qtpy.QtCore import Qt
from qtpy.QtWidgets import QMessageBox
from tests._qt.conftest import CHANNELS, choose_checkpoint, wait_idle

from napari_finetune.model.bring_your_own import checkpoint_from_factory
from napari_finetune.model.checkpoint import FORMAT, FORMAT_VERSION


def _answer(monkeypatch, button) -> list[str]:
    """Make the dialog answer ``button``; returns the texts it was shown with."""
    asked: list[str] = []

    def question(parent, title, text, *args, **kwargs):
        asked.append(f"{title}\n{text}")
        return button

    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    return asked


def _hostile_checkpoint(path, factory: str, kwargs: dict) -> str:
    """A file laid out as a napari-finetune checkpoint that names ``factory``."""
    torch.save({"format": FORMAT, "format_version": FORMAT_VERSION,
                "architecture": {"factory": factory, "kwargs": kwargs},
                "state_dict": {}, "metadata": {"channel_names": CHANNELS}}, path)
    return str(path)


def _choose(qtbot, widget, path) -> None:
    choose_checkpoint(qtbot, widget, str(path))


def _warnings() -> list[str]:
    return [str(n.message) for n in notification_manager.records
            if n.severity == NotificationSeverity.WARNING]


@pytest.mark.parametrize("factory", ["subprocess:run", "evil_models_for_test:build"])
def test_no_leaves_nothing_loaded_and_nothing_run(docked, qtbot, monkeypatch, tmp_path, factory):
    viewer, widget, image = docked
    ran = tmp_path / "ran"  # subprocess:run would touch it
    imported = tmp_path / "imported"  # importing the module would touch it
    (tmp_path / "evil_models_for_test.py").write_text(
        f"open({str(imported)!r}, 'w').close()\n"
        f"def build(**kwargs):\n    open({str(ran)!r}, 'w').close()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    kwargs = {"args": ["touch", str(ran)]} if factory == "subprocess:run" else {}
    path = _hostile_checkpoint(tmp_path / "hostile.pt", factory, kwargs)
    asked = _answer(monkeypatch, QMessageBox.No)
    before = len(_warnings())

    _choose(qtbot, widget, path)
    qtbot.waitUntil(lambda: len(_warnings()) > before, timeout=20_000)
    wait_idle(qtbot, widget)

    module, _, name = factory.partition(":")
    assert len(asked) == 1 and module in asked[0] and name in asked[0]
    assert f"package '{module.split('.')[0]}'" in asked[0]
    assert not ran.exists() and not imported.exists()
    assert "evil_models_for_test" not in sys.modules
    assert widget.state.info is None and not widget.predict_button.isEnabled()
    assert "not trusted" in widget.checkpoint_label.text()
    assert factory in _warnings()[-1] and "Nothing from it was imported or run" in _warnings()[-1]


def test_yes_loads_the_trusted_factory_and_predicts(docked, qtbot, monkeypatch, tmp_path):
    viewer, widget, image = docked
    (tmp_path / "my_lab_models.py").write_text(
        "from napari_finetune.model.unet import UNet\n\n"
        "def tiny_unet(**kwargs):\n    return UNet(**kwargs)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_lab_models

    kwargs = {"dims": 3, "in_channels": 1, "out_channels": 2, "depth": 2, "features": 4}
    path = checkpoint_from_factory(tmp_path / "lab.pt", "my_lab_models:tiny_unet", kwargs,
                                   my_lab_models.tiny_unet(**kwargs).state_dict(),
                                   {"channel_names": CHANNELS})
    asked = _answer(monkeypatch, QMessageBox.Yes)

    _choose(qtbot, widget, path)
    qtbot.waitUntil(lambda: widget.state.info is not None, timeout=20_000)
    assert len(asked) == 1 and "tiny_unet" in asked[0] and "my_lab_models" in asked[0]
    assert widget.state.info.trust == ("my_lab_models:tiny_unet",)
    assert widget.state.info.channel_names == CHANNELS
    # Predict reads the file again in its worker: the trust travels with it.
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert not widget.state.errors, widget.state.errors
    assert viewer.layers["membrane prediction"].data.shape == np.asarray(image.data).shape
