"""Where the fine-tune runs: this machine, or a worker of a dask scheduler (with optional TLS).

The choice, the address and the TLS files are kept in :class:`QSettings`
(organisation and application "napari-finetune", an INI file in the user's
configuration folder), so the next napari start offers them again. napari has
no per-plugin settings store for npe2 plugins (its settings model only holds
napari's own sections), and QSettings stays inside ``_qt``, the one place
that imports Qt.
"""

from __future__ import annotations

import re
from pathlib import Path

from magicgui.widgets import ComboBox, LineEdit
from qtpy.QtCore import QSettings
from qtpy.QtWidgets import QMessageBox, QWidget

ORGANISATION = APPLICATION = "napari-finetune"
LOCAL, SCHEDULER = "local", "scheduler"
RUN_ON_CHOICES = [("this machine", LOCAL), ("a dask scheduler", SCHEDULER)]
ADDRESS_EXAMPLE = "tcp://gpu-server:8786"
# (key, label, tooltip) of dask's three TLS files, in distributed.Security's order.
TLS_FILES = (
    ("tls_ca_file", "TLS CA file", "the cluster's CA certificate (PEM); with a certificate and "
     "a key. Left empty, dask's configuration (distributed.comm.tls.*) decides"),
    ("tls_cert", "certificate", "this client's certificate (PEM)"),
    ("tls_key", "key", "this client's private key (PEM)"),
)
# HOST is a name, an IPv4 address or a bracketed IPv6 address, as dask writes them.
_ADDRESS = re.compile(r"(tcp|tls)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})")


def default_store() -> QSettings:
    """The user's napari-finetune settings (an INI file, the same on every platform)."""
    return QSettings(
        QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANISATION, APPLICATION)


def check_address(text: str) -> str:
    """``text`` stripped, if it is ``tcp://HOST:PORT`` or ``tls://HOST:PORT`` (else ValueError)."""
    address = text.strip()
    match = _ADDRESS.fullmatch(address)
    if match is None or not 0 < int(match[3]) < 65536:
        raise ValueError(
            f"Scheduler address {address!r} is not tcp://HOST:PORT or tls://HOST:PORT; type "
            f"the address `dask scheduler` printed (e.g. {ADDRESS_EXAMPLE}).")
    return address


class RunOnChoice:
    """The "Run on" inputs: the choice, the scheduler's address and the TLS files.

    The settings form places them (``where`` and ``address`` in one row, the
    TLS files under Advanced). Each change is written to ``store`` at once;
    Qt writes the file from the event loop and when napari quits.

    Parameters
    ----------
    store
        Where the choice is remembered; :func:`default_store` when None
        (tests pass one on a temporary file).
    """

    def __init__(self, store: QSettings | None = None) -> None:
        self.store = default_store() if store is None else store
        saved = self._saved("run_on", LOCAL)
        self.where = ComboBox(
            value=saved if saved in (LOCAL, SCHEDULER) else LOCAL, choices=RUN_ON_CHOICES,
            label="Run on",
            tooltip="Train here, or on a worker of a dask scheduler (a GPU server). dask runs "
                    "the code it is sent: only use a scheduler you or your lab administer.")
        self.address = LineEdit(
            value=self._saved("scheduler", ""), label="Scheduler",
            tooltip="The address `dask scheduler` printed, tcp://HOST:PORT or tls://HOST:PORT")
        self.address.native.setPlaceholderText(ADDRESS_EXAMPLE)
        self.tls = {key: LineEdit(value=self._saved(key, ""), label=label, tooltip=tip)
                    for key, label, tip in TLS_FILES}
        for box in self.tls.values():
            box.native.setPlaceholderText("PEM file (optional)")
        self.where.changed.connect(self._where_changed)
        for key, box in (("scheduler", self.address), *self.tls.items()):
            box.changed.connect(lambda text, key=key: self.store.setValue(key, text.strip()))
        self._show(self.where.value)

    def _saved(self, key: str, default: str) -> str:
        # PyQt and PySide differ in what a missing or odd INI value comes back as.
        value = self.store.value(key, default)
        return value if isinstance(value, str) else default

    def _where_changed(self, where: str) -> None:
        self.store.setValue("run_on", where)
        self._show(where)

    def _show(self, where: str) -> None:
        # The address and TLS files only mean something for a scheduler.
        for box in (self.address, *self.tls.values()):
            box.enabled = where == SCHEDULER

    def scheduler(self) -> str | None:
        """The scheduler's address, or None for "this machine" (ValueError if not an address)."""
        if self.where.value != SCHEDULER:
            return None
        return check_address(self.address.value)

    def security_files(self) -> tuple[str, str, str] | None:
        """(CA file, certificate, key) for ``distributed.Security``, or None.

        None for "this machine" and when all three are empty (dask's
        configuration decides). ValueError when only some are given, a file
        does not exist, or the address is ``tcp://`` (TLS needs ``tls://``).
        """
        address = self.scheduler()
        paths = [box.value.strip() for box in self.tls.values()]
        if address is None or not any(paths):
            return None
        if not all(paths):
            raise ValueError("The TLS CA file, certificate and key go together; give all three "
                             "(or none, and dask's configuration decides).")
        files = tuple(str(Path(path).expanduser()) for path in paths)
        for (_, label, _), path in zip(TLS_FILES, files, strict=True):
            if not Path(path).is_file():
                raise ValueError(f"The {label} {path!r} is not a file; pick the PEM file your "
                                 "cluster's administrator gave you.")
        if address.startswith("tcp://"):
            raise ValueError(f"TLS files are set but the scheduler is {address}; use its "
                             "tls:// address, or clear the TLS files.")
        return files[0], files[1], files[2]


def confirm_unencrypted(parent: QWidget, address: str, line: str) -> bool:
    """Ask before a run on a plain ``tcp://`` scheduler of another machine (modal Yes/No,
    No the default); True on Yes. The Session asks once per address."""
    answer = QMessageBox.question(
        parent, "Send the run unencrypted?",
        f"{line}\n\nTrain on {address} anyway (asked once per address until napari closes)?",
        QMessageBox.Yes | QMessageBox.No, QMessageBox.No)
    return answer == QMessageBox.Yes
