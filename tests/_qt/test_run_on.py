"""The settings form's "Run on": this machine or a dask scheduler, remembered across starts.

Every test keeps its settings in a temporary INI file: the user's real
napari-finetune settings are never read or written.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from qtpy.QtCore import QSettings, Qt

from napari_finetune._qt.run_on import APPLICATION, ORGANISATION, default_store
from napari_finetune._qt.settings import SettingsForm


@pytest.fixture
def store(tmp_path: Path) -> QSettings:
    return QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)


@pytest.fixture
def user_settings_in(tmp_path: Path):
    """The default (user-scope INI) settings folder moved to tmp_path for the test."""
    real = Path(default_store().fileName()).parent.parent
    QSettings.setPath(QSettings.IniFormat, QSettings.UserScope, str(tmp_path))
    yield tmp_path
    QSettings.setPath(QSettings.IniFormat, QSettings.UserScope, str(real))


def _form(qtbot, store: QSettings | None) -> SettingsForm:
    form = SettingsForm(store=store)
    qtbot.addWidget(form)
    form.show()
    qtbot.waitExposed(form)
    return form


def _pick_scheduler(qtbot, form: SettingsForm) -> None:
    combo = form.run_on.where.native
    combo.setFocus()
    qtbot.keyClick(combo, Qt.Key_Down)  # "this machine" -> "a dask scheduler"
    assert combo.currentText() == "a dask scheduler"


def _type(qtbot, widget, text: str) -> None:
    widget.native.clear()
    qtbot.keyClicks(widget.native, text)


def _pem_files(folder: Path) -> list[str]:
    paths = [folder / name for name in ("ca.pem", "me.pem", "me.key")]
    for path in paths:
        path.write_text("-----BEGIN CERTIFICATE-----\n")
    return [str(path) for path in paths]


def test_this_machine_is_the_default_and_the_address_waits_for_a_scheduler(qtbot, store):
    form = _form(qtbot, store)
    run_on = form.run_on
    assert form.main.native.isAncestorOf(run_on.where.native)
    assert form.main.native.isAncestorOf(run_on.address.native)
    assert all(form.advanced.native.isAncestorOf(box.native) for box in run_on.tls.values())
    assert form.scheduler() is None and form.security_files() is None
    assert not run_on.address.enabled
    assert not any(box.enabled for box in run_on.tls.values())
    # Training here: the scheduler's rows are not shown at all (the form stays short).
    form.advanced_box.expand(animate=False)
    shown = [run_on.address, *run_on.tls.values()]
    assert not any(box.native.isVisibleTo(form) for box in shown)
    _pick_scheduler(qtbot, form)
    assert run_on.address.enabled and all(box.enabled for box in run_on.tls.values())
    assert all(box.native.isVisibleTo(form) for box in shown)
    _type(qtbot, run_on.address, "tcp://gpu-server:8786")
    assert form.scheduler() == "tcp://gpu-server:8786"
    qtbot.keyClick(run_on.where.native, Qt.Key_Up)  # back to this machine
    assert form.scheduler() is None and not run_on.address.enabled
    assert not run_on.address.native.isVisibleTo(form)


def test_the_choice_address_and_tls_files_come_back_in_a_new_form(qtbot, store, tmp_path):
    ca, cert, key = _pem_files(tmp_path)
    form = _form(qtbot, store)
    _pick_scheduler(qtbot, form)
    _type(qtbot, form.run_on.address, "tls://gpu-server:8786")
    for box, path in zip(form.run_on.tls.values(), (ca, cert, key), strict=True):
        _type(qtbot, box, path)
    form.close()
    store.sync()  # what napari's quit does; the file is what the next start reads
    text = (tmp_path / "settings.ini").read_text()
    assert "run_on=scheduler" in text and "scheduler=tls://gpu-server:8786" in text

    again = _form(qtbot, QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat))
    assert again.run_on.where.native.currentText() == "a dask scheduler"
    assert again.run_on.address.enabled
    assert again.scheduler() == "tls://gpu-server:8786"
    assert again.security_files() == (ca, cert, key)


def test_the_default_store_is_the_users_napari_finetune_ini(qtbot, user_settings_in):
    form = _form(qtbot, None)
    _pick_scheduler(qtbot, form)
    form.run_on.store.sync()
    path = user_settings_in / ORGANISATION / f"{APPLICATION}.ini"
    assert "run_on=scheduler" in path.read_text()
    assert _form(qtbot, None).run_on.where.value == "scheduler"


@pytest.mark.parametrize("address", [
    "gpu-server", "gpu-server:8786", "http://gpu-server:8786", "tcp://gpu-server",
    "tcp://gpu-server:99999", "tcp://gpu server:8786", ""])
def test_a_wrong_address_says_what_to_type(qtbot, store, address):
    form = _form(qtbot, store)
    _pick_scheduler(qtbot, form)
    _type(qtbot, form.run_on.address, address)
    with pytest.raises(ValueError, match=r"^Scheduler address .* is not tcp://HOST:PORT or "
                                         r"tls://HOST:PORT; type the address `dask scheduler`"):
        form.scheduler()


@pytest.mark.parametrize("address", [
    "tcp://gpu-server:8786", "tls://10.0.0.2:8786", "tcp://[::1]:8786",
    "  tcp://node-7.cluster.lab.org:1  "])
def test_a_right_address_is_taken_as_typed(qtbot, store, address):
    form = _form(qtbot, store)
    _pick_scheduler(qtbot, form)
    _type(qtbot, form.run_on.address, address)
    assert form.scheduler() == address.strip()


def test_tls_files_go_together_exist_and_need_a_tls_address(qtbot, store, tmp_path):
    ca, cert, key = _pem_files(tmp_path)
    form = _form(qtbot, store)
    boxes = list(form.run_on.tls.values())
    _type(qtbot, boxes[0], ca)
    assert boxes[0].value == ""  # off for this machine: typing does nothing
    _pick_scheduler(qtbot, form)
    _type(qtbot, form.run_on.address, "tls://gpu-server:8786")
    _type(qtbot, boxes[0], ca)
    with pytest.raises(ValueError, match="go together; give all three"):
        form.security_files()
    _type(qtbot, boxes[1], cert)
    _type(qtbot, boxes[2], os.path.join(str(tmp_path), "missing.key"))
    with pytest.raises(ValueError, match=r"The key '.*missing\.key' is not a file"):
        form.security_files()
    _type(qtbot, boxes[2], key)
    assert form.security_files() == (ca, cert, key)
    qtbot.keyClick(form.run_on.where.native, Qt.Key_Up)
    assert form.security_files() is None  # this machine: no TLS, the files stay for later
    _pick_scheduler(qtbot, form)
    _type(qtbot, form.run_on.address, "tcp://gpu-server:8786")
    with pytest.raises(ValueError, match="use its tls:// address"):
        form.security_files()
    for box in boxes:
        box.native.clear()
    assert form.security_files() is None  # dask's configuration decides
