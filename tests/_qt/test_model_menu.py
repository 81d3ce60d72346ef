"""The model field's menu: the models that ship with the package, chosen by name."""

from __future__ import annotations

from napari_finetune.samples.models import SHIPPED


def test_the_starter_is_chosen_from_the_menu_and_read(docked, qtbot):
    viewer, widget, image = docked
    menu = widget.model_button.menu()
    entries = {action.data(): action for action in menu.actions()}
    assert list(entries) == list(SHIPPED)  # sample, starter: each with what it is for
    assert "any microscope" in entries["starter"].text()
    entries["starter"].trigger()
    assert widget.checkpoint_path() == str(SHIPPED["starter"].path)
    qtbot.waitUntil(lambda: widget.state.info is not None
                    and widget.state.info.channel_names == ["boundaries", "objects"],
                    timeout=60_000)
    assert "boundaries" in widget.checkpoint_label.text()
