"""A Session shown in napari: its layers come one per event-loop turn, placed by the image."""

from __future__ import annotations

import numpy as np
from qtpy.QtWidgets import QApplication
from tests._qt.conftest import CHANNELS, SHAPE, make_volume

from napari_finetune._qt.runner import ThreadRunner
from napari_finetune._qt.viewer_port import NapariViewerPort
from napari_finetune.session.session import Outcome, Session
from napari_finetune.session.viewer import LayerKind


def test_layers_come_one_per_turn_below_the_strokes_with_the_image_geometry(
        make_napari_viewer, qtbot):
    viewer = make_napari_viewer()
    image = viewer.add_image(make_volume(), name="raw", scale=(2.0, 1.0, 1.0),
                             translate=(4.0, 0.0, 0.0))
    strokes = viewer.add_labels(np.zeros(SHAPE, np.uint8), name="strokes")
    region = (slice(0, 8), slice(0, 32), slice(0, 32))
    port = NapariViewerPort(viewer, lambda: region, image=lambda: image, below=lambda: strokes)
    assert port.shown_region() == region

    masks = [np.full(SHAPE, i + 1, np.uint8) for i in range(3)]
    for i, mask in enumerate(masks):
        port.show_layer(f"layer-{i}", mask, LayerKind.LABELS)
    assert [layer.name for layer in viewer.layers] == ["raw", "strokes"]  # none in this call
    QApplication.processEvents()  # one turn of the event loop: one layer, not three
    assert len(viewer.layers) == 3 and port.pending == 2
    qtbot.waitUntil(lambda: port.pending == 0, timeout=5_000)
    assert [layer.name for layer in viewer.layers] == [
        "raw", "layer-0", "layer-1", "layer-2", "strokes"]
    assert tuple(viewer.layers["layer-1"].scale) == (2.0, 1.0, 1.0)
    assert tuple(viewer.layers["layer-1"].translate) == (4.0, 0.0, 0.0)

    port.show_layer("layer-1", masks[0], LayerKind.LABELS)  # shown again: the same layer
    qtbot.waitUntil(lambda: port.pending == 0, timeout=5_000)
    assert len(viewer.layers) == 5 and viewer.layers["layer-1"].data is masks[0]
    port.show_layer("unsure", np.zeros(SHAPE, np.float32), LayerKind.IMAGE)
    qtbot.waitUntil(lambda: "unsure" in viewer.layers, timeout=5_000)
    assert viewer.layers["unsure"]._type_string == "image"


def test_a_session_on_threads_shows_its_prediction_in_the_viewer(
        make_napari_viewer, qtbot, tiny_checkpoint):
    viewer = make_napari_viewer()
    image = viewer.add_image(make_volume(), name="raw")
    port = NapariViewerPort(viewer, lambda: None, image=lambda: image)
    session = Session(ThreadRunner(), viewer=port, image=image.data,
                      checkpoint=str(tiny_checkpoint), channel_names=list(CHANNELS))
    ended = []
    session.events.ended.connect(ended.append)
    assert session.predict() is True
    qtbot.waitUntil(lambda: bool(ended), timeout=60_000)
    assert ended[0].outcome is Outcome.DONE, ended[0]
    qtbot.waitUntil(lambda: port.pending == 0 and len(viewer.layers) == 3, timeout=5_000)
    for channel, mask in zip(CHANNELS, session.prediction.masks, strict=True):
        assert viewer.layers[f"prediction-{channel}"].data is mask


def test_a_region_is_written_into_the_layer_not_the_whole_data_replaced(
        make_napari_viewer, qtbot):
    viewer = make_napari_viewer()
    port = NapariViewerPort(viewer, lambda: None)
    shown = np.zeros(SHAPE, np.uint8)
    port.show_layer("prediction", shown, LayerKind.LABELS)
    qtbot.waitUntil(lambda: port.pending == 0, timeout=5_000)
    layer = viewer.layers["prediction"]
    replaced = []
    layer.events.data.connect(replaced.append)

    newer = np.ones(SHAPE, np.uint8)  # another array: only its region may reach the layer
    region = (slice(2, 3), slice(0, 16), slice(0, 16))
    port.show_region("prediction", newer, region, LayerKind.LABELS)
    assert replaced == [] and layer.data is shown
    assert layer.data[region].all() and layer.data.sum() == newer[region].sum()


def test_a_port_without_whole_results_writes_tiles_only_into_its_named_layers(
        make_napari_viewer, qtbot):
    """The dock's port: tiles into the layers it names, whole results left to the widget."""
    viewer = make_napari_viewer()
    layer = viewer.add_labels(np.zeros(SHAPE, np.uint8), name="membrane prediction")
    port = NapariViewerPort(viewer, lambda: None, layer_name=lambda n: n.replace("-", " "),
                            whole=False)
    mask = np.ones(SHAPE, np.uint8)
    tile = (slice(0, 4), slice(0, 8), slice(0, 8))
    port.show_region("membrane-prediction", mask, tile, LayerKind.LABELS)
    assert layer.data[tile].all() and layer.data.sum() == mask[tile].sum()
    port.show_region("mitochondria-prediction", mask, tile, LayerKind.LABELS)  # not there
    port.show_layer("membrane-prediction", mask, LayerKind.LABELS)  # the widget's to show
    QApplication.processEvents()
    assert port.pending == 0 and [lyr.name for lyr in viewer.layers] == ["membrane prediction"]
    assert layer.data is not mask
