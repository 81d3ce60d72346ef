"""What the actions may touch of the dock widget, and what a step needs of the actions.

:class:`~napari_finetune._qt.actions.Controller` and the steps it runs
(:mod:`~napari_finetune._qt.objects_step`) are typed against these protocols, not
against :class:`~napari_finetune._qt.panel.FinetunePanel` or the Controller itself:
the widget imports them, so they must not import it back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from napari import Viewer
    from napari.layers import Image, Labels
    from qtpy.QtWidgets import QLabel, QWidget

    from napari_finetune._qt.roles_editor import RolesEditor
    from napari_finetune._qt.settings import SettingsForm
    from napari_finetune._qt.state import WidgetState
    from napari_finetune._qt.status_panel import StatusPanel
    from napari_finetune.arrays import AxesImage, VolumeArray
    from napari_finetune.session.session import ActionEnd, Session

class WidgetView(Protocol):
    """The dock widget's public members: its labels, panels and chosen layers."""

    viewer: Viewer
    state: WidgetState
    status_panel: StatusPanel
    settings: SettingsForm
    roles_editor: RolesEditor
    checkpoint_label: QLabel
    objects_label: QLabel
    output_label: QLabel
    autosave_label: QLabel

    def image_layer(self) -> Image | None:
        """The chosen image layer."""

    def corrections_layer(self) -> Labels | None:
        """The chosen corrections layer."""

    def checkpoint_path(self) -> str:
        """The checkpoint path as typed."""

    def store_hint(self) -> Path | None:
        """The OME-Zarr store of the chosen image, if it came from one."""

    def dialog_parent(self) -> QWidget:
        """The widget a modal dialog (the trust question) is shown over."""

    def model_image(self) -> VolumeArray | AxesImage | None:
        """What the model runs on: the chosen channel of a store of several, else the
        image layer's array (ChannelChoiceError while no channel is chosen)."""


class JobHost(Protocol):
    """What a step needs of the Controller: the state, the widget and the Session's actions."""

    state: WidgetState
    w: WidgetView
    session: Session
    refusal: str  # the Session's last refusal, one line

    def start_action(
        self, start: Callable[[], bool], done: Callable[[], None] = ...,
        failed: Callable[[], None] = ..., ended: Callable[[ActionEnd], None] | None = None,
    ) -> bool:
        """Start one of the Session's actions; ``done`` or ``failed`` when it ends, ``ended``
        last however it ended. False: refused (or the widget closed)."""
