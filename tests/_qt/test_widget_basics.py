"""Dock, predict, corrections layer, autosave, bad checkpoint: the widget without training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from napari.utils.notifications import NotificationSeverity, notification_manager
from qtpy.QtCore import Qt
from tests._qt.conftest import CHANNELS, SHAPE, choose_checkpoint, dock_panel, wait_idle

from napari_finetune.session.session import Busy


def _errors() -> list[str]:
    return [
        str(n.message) for n in notification_manager.records
        if n.severity == NotificationSeverity.ERROR
    ]


def test_dock_lists_the_image_and_reads_the_checkpoint(docked):
    viewer, widget, image = docked
    assert widget.image_combo.value is image
    assert widget.state.info.channel_names == CHANNELS
    assert "membrane, mitochondria" in widget.checkpoint_label.text()
    assert widget.predict_button.isEnabled()
    assert not widget.finetune_button.isEnabled()  # nothing to train on yet
    assert not widget.stop_button.isEnabled()
    # The settings start from FinetuneConfig's defaults, with the distillation check on
    # (off in FinetuneConfig so a Finetuner built directly does what its config says).
    from napari_finetune.config import FinetuneConfig

    assert widget.settings.config() == FinetuneConfig(distillation_check=True)
    # The LoRA rank only means something in LoRA mode.
    settings = widget.settings
    assert settings.lora_rank.enabled == (FinetuneConfig().mode == "lora")
    settings.mode.value = "lora"
    assert settings.lora_rank.enabled and settings.config().mode == "lora"
    # The model was read in a worker: picking LoRA on this tiny UNet says it does not suit it.
    assert widget.state.info.lora_share_per_rank > 0
    assert "pick Full" in settings.lora_advice.text()
    settings.mode.value = "full"
    assert not settings.lora_rank.enabled
    assert settings.lora_advice.text() == ""


def test_loss_plot_follows_the_theme_and_marks_recoveries(docked, qtbot):
    from napari.utils.theme import get_theme

    from napari_finetune.trainer.status import Status

    viewer, widget, image = docked
    plot = widget.status_panel.loss_plot
    for theme in ("light", "dark"):
        viewer.theme = theme
        corner = plot.grab().toImage().pixelColor(plot.width() // 2, 3)
        assert corner.name() == get_theme(theme).background.as_hex()
    base = dict(kind="step", dtype="float32", grad_scaler=False, batch_size=4, accumulation=1,
                distillation="on", hold_other_channels="on", total_steps=10, epoch=0,
                message="", distillation_weight=0.5, elapsed_s=1.0)
    for step, batch in ((1, 4), (2, 4), (3, 2), (4, 2)):
        widget.status_panel.show_status(Status(**{**base, "step": step, "batch_size": batch,
                                                  "loss": 1.0 / step}))
    assert plot.marks == [(3, "batch halved")] and len(plot.losses) == 4


def test_choosing_lora_warms_up_peft(docked, monkeypatch):
    """The dock's warm-up leaves PEFT out (a full fine-tune is the default): choosing LoRA
    warms it up; choosing a full fine-tune again starts nothing."""
    viewer, widget, image = docked
    asked: list[bool] = []
    monkeypatch.setattr(widget.controller, "warm_up", lambda lora: asked.append(lora))
    widget.settings.mode.value = "lora"
    widget.settings.mode.value = "full"
    assert asked == [True]


def test_long_texts_read_in_full_or_elide_from_the_left(docked, qtbot):
    viewer, widget, image = docked
    qtbot.waitExposed(widget)
    edit, mode = widget.checkpoint_edit, widget.settings.mode.native
    path = widget.state.info.path
    assert edit.toolTip() == path  # the whole path, whatever the field shows
    metrics = edit.fontMetrics()
    shown = metrics.elidedText(path, Qt.ElideLeft, edit.width())
    assert shown.endswith(Path(path).name)  # the file name stays readable
    mode.setCurrentText("Full fine-tune")
    assert mode.width() >= mode.fontMetrics().horizontalAdvance("Full fine-tune") + 20


def test_predict_button_adds_one_layer_per_channel(docked, qtbot):
    viewer, widget, image = docked
    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    assert widget.state.busy is Busy.PREDICT  # the click returned while the worker runs
    wait_idle(qtbot, widget)
    names = [f"{c} prediction" for c in CHANNELS]
    assert all(n in viewer.layers for n in names)

    # Same masks as predict_volume called directly with the checkpoint.
    from napari_finetune.config import PredictConfig
    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.model.checkpoint import load_checkpoint
    from napari_finetune.predict import predict_volume

    ckpt = load_checkpoint(widget.state.info.path)
    data = np.asarray(image.data)
    probs = predict_volume(ckpt.model, data, intensity_range(data, ckpt.normalization),
                           PredictConfig(device="cpu"))
    for name, channel in zip(names, probs, strict=True):
        layer = viewer.layers[name]
        assert layer.data.shape == SHAPE and layer.data.dtype == np.uint8
        np.testing.assert_array_equal(layer.data, (channel > 0.5).astype(np.uint8))
    assert widget.status_panel.progress.format() == "prediction done"


def test_new_corrections_layer_names_classes_and_autosaves(docked, qtbot):
    viewer, widget, image = docked
    qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    layer = viewer.layers["corrections"]
    assert widget.corrections_combo.value is layer
    assert viewer.layers.selection.active is layer
    assert layer.mode == "paint" and layer.selected_label == 2
    assert list(layer.features["class"]) == ["unpainted", "background", *CHANNELS]
    # Channel colours differ from each other and from background; 0 is transparent.
    colors = [tuple(np.round(layer.colormap.map(v), 3)) for v in (0, 1, 2, 3)]
    assert colors[0][3] == 0 and len(set(colors[1:])) == 3
    assert widget.finetune_button.isEnabled()

    saver = widget.state.autosaver
    saver.timer.setInterval(50)  # the default waits 1.5 s after the last stroke
    layer.paint((8, 30, 30), 3)  # mitochondria
    layer.paint((8, 5, 5), 1)  # background
    assert saver.pending
    qtbot.waitUntil(lambda: saver.saves >= 1 and saver.in_flight == 0, timeout=20_000)

    from napari_finetune.io.omezarr import list_labels, load_corrections

    store = image.metadata["ome_zarr_path"]
    assert "corrections" in list_labels(store)
    np.testing.assert_array_equal(load_corrections(store), layer.data)
    assert "autosaved" in widget.autosave_label.text()


def test_bad_checkpoint_notifies_and_keeps_the_widget_usable(docked, qtbot, tmp_path):
    viewer, widget, image = docked
    good = widget.state.info.path
    bad = tmp_path / "broken.pt"
    bad.write_bytes(b"this is not a checkpoint")
    before = len(_errors())
    choose_checkpoint(qtbot, widget, str(bad))
    qtbot.waitUntil(lambda: len(_errors()) > before, timeout=20_000)
    assert "not a readable PyTorch checkpoint" in _errors()[-1]
    assert widget.state.info is None
    assert not widget.predict_button.isEnabled()
    # Back to a good file: everything works again.
    choose_checkpoint(qtbot, widget, good)
    qtbot.waitUntil(lambda: widget.state.info is not None, timeout=20_000)
    assert widget.predict_button.isEnabled()


def test_corrections_combo_ignores_ground_truth_and_predictions(docked, qtbot):
    viewer, widget, image = docked
    viewer.add_labels(np.zeros(SHAPE, np.uint8), name="ground truth")
    assert widget.corrections_combo.value is None
    viewer.add_labels(np.zeros(SHAPE, np.uint8), name="my corrections")
    assert widget.corrections_combo.value.name == "my corrections"


def test_open_sample_and_dock(make_napari_viewer, qtbot, tmp_path, monkeypatch):
    """File > Open Sample > synthetic-em (a small one) gives a layer the widget can save into."""
    monkeypatch.setenv("NAPARI_FINETUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("NAPARI_FINETUNE_SAMPLE_SHAPE", "16,64,64")
    viewer = make_napari_viewer()
    viewer.open_sample("napari-finetune", "synthetic-em")
    widget = dock_panel(viewer, qtbot)
    image = widget.image_combo.value
    assert image is not None and image.metadata["ome_zarr_path"].startswith(str(tmp_path))
    assert widget.store_hint() is not None
    assert widget.corrections_combo.value is None  # the ground truth is not offered
    wait_idle(qtbot, widget)


def _store_colors(store: Path, name: str) -> dict[int, list[int]]:
    import json

    attrs = json.loads((store / "labels" / name / "zarr.json").read_text())
    return {c["label-value"]: c["rgba"]
            for c in attrs["attributes"]["ome"]["image-label"]["colors"]}


@pytest.mark.parametrize("corrections_first", [False, True], ids=["model-first", "layer-first"])
def test_the_store_gets_the_checkpoints_own_colours(docked, qtbot, tmp_path, corrections_first):
    """A checkpoint that saved its channel colours: the corrections autosave and Save
    predictions (the layers' masks, into the store's labels) carry them into the store
    (other NGFF tools show what napari showed), also when the corrections layer was
    followed before the checkpoint was read."""
    import torch

    from napari_finetune import palette
    from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint

    viewer, widget, image = docked
    mine = ["#102030", "#405060"]
    source = load_checkpoint(widget.state.info.path)
    torch.manual_seed(0)
    path = save_checkpoint(tmp_path / "coloured.pt", source.model,
                           {**source.metadata, "channel_colors": mine})
    if corrections_first:
        qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    choose_checkpoint(qtbot, widget, str(path))
    qtbot.waitUntil(lambda: widget.state.info is not None and widget.state.info.path == str(path),
                    timeout=20_000)
    if not corrections_first:
        qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    layer = viewer.layers["corrections"]
    saver = widget.state.autosaver
    saver.timer.setInterval(50)
    layer.paint((8, 30, 30), 3)
    qtbot.waitUntil(lambda: saver.saves >= 1 and saver.in_flight == 0, timeout=20_000)
    store = Path(image.metadata["ome_zarr_path"])
    assert _store_colors(store, "corrections") == {
        1: palette.rgba(palette.BACKGROUND), 2: palette.rgba(mine[0]), 3: palette.rgba(mine[1])}

    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    qtbot.mouseClick(widget.save_predictions_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    from napari_finetune.io.omezarr import open_volume

    for channel, color in zip(CHANNELS, mine, strict=True):
        assert _store_colors(store, f"prediction-{channel}") == {1: palette.rgba(color)}
        saved = np.asarray(open_volume(f"{store}/labels/prediction-{channel}").data)
        np.testing.assert_array_equal(saved, viewer.layers[f"{channel} prediction"].data)
    assert "prediction-membrane" in widget.output_label.text()
