"""The Model field takes a bioimage.io package: the widget reads it and predicts with it."""

from __future__ import annotations

import bioimageio.spec  # noqa: F401  (a dev dependency: a broken install fails, not skips)
import numpy as np
from qtpy.QtCore import Qt
from tests._qt.conftest import CHANNELS, choose_checkpoint, make_volume, wait_idle


def test_model_field_reads_a_package_and_predicts_like_the_checkpoint(docked, qtbot, tmp_path):
    from napari_finetune.bioimageio.export import export_bioimageio

    viewer, widget, image = docked
    checkpoint = widget.state.info.path
    package = export_bioimageio(checkpoint, tmp_path / "tiny.zip", make_volume(), check=False)
    choose_checkpoint(qtbot, widget, str(package))
    qtbot.waitUntil(lambda: widget.state.info is not None, timeout=20_000)
    assert widget.state.info.channel_names == CHANNELS
    assert "membrane, mitochondria" in widget.checkpoint_label.text()

    qtbot.mouseClick(widget.predict_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    from napari_finetune.config import PredictConfig
    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.model.checkpoint import load_checkpoint
    from napari_finetune.predict import predict_volume

    ckpt = load_checkpoint(checkpoint)  # the .pt the package was made from
    data = np.asarray(image.data)
    probs = predict_volume(ckpt.model, data, intensity_range(data, ckpt.normalization),
                           PredictConfig(device="cpu"))
    for name, channel in zip(CHANNELS, probs, strict=True):
        layer = viewer.layers[f"{name} prediction"]
        np.testing.assert_array_equal(layer.data, (channel > 0.5).astype(np.uint8))
