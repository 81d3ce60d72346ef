"""The widget tests run on the Qt binding asked for (CI runs them on Qt 5 and Qt 6)."""

from __future__ import annotations

import os

import pytest

EXPECTED = {"pyqt5": "PyQt5", "pyqt6": "PyQt6", "pyside2": "PySide2", "pyside6": "PySide6"}


def test_the_binding_in_use_is_the_one_asked_for(make_napari_viewer):
    import qtpy
    from qtpy.QtCore import QCoreApplication

    asked = os.environ.get("QT_API")
    if asked is None:
        pytest.skip("QT_API not set: qtpy's default binding is in use")
    make_napari_viewer()
    assert qtpy.API_NAME == EXPECTED[asked.lower()]
    app = QCoreApplication.instance()
    assert type(app).__module__.split(".")[0] in (EXPECTED[asked.lower()], "napari")
