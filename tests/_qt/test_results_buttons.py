"""'Paint here next' and 'Export as bioimage.io model…', clicked in a docked widget."""

from __future__ import annotations

import numpy as np
from qtpy.QtCore import Qt
from qtpy.QtWidgets import QFileDialog
from tests._qt.conftest import dock_panel, wait_idle
from tests._qt.test_roles_editor import choose_role, type_value

from napari_finetune._qt.layers import camera_of
from napari_finetune.model.checkpoint import load_checkpoint
from napari_finetune.objects import ChannelRole, roles_from_metadata


def test_paint_here_next_shows_uncertainty_and_goes_to_an_unpainted_region(docked, qtbot):
    viewer, widget, image = docked
    qtbot.mouseClick(widget.new_corrections_button, Qt.LeftButton)
    painted = viewer.layers["corrections"]
    painted.data[:, :32, :] = 1  # the top half is painted: no suggestion may land there
    qtbot.mouseClick(widget.paint_next_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    qtbot.waitUntil(lambda: len(widget.state.suggested) == 1, timeout=30_000)
    unsure = viewer.layers["uncertainty"].data
    assert unsure.shape == image.data.shape and unsure.dtype == np.float32
    assert 0.0 <= unsure.min() and unsure.max() <= 1.0 and unsure.max() > 0
    first = widget.state.suggested[0]
    assert first[1].start >= 32  # below the painting
    assert "paint here next:" in widget.status_panel.log.toPlainText()
    centre_y = (first[1].start + first[1].stop - 1) // 2
    camera = camera_of(viewer)
    np.testing.assert_allclose(camera.center[-2], centre_y * image.scale[-2], atol=1e-6)
    # asked again: the next region, without predicting again
    layer_before = viewer.layers["uncertainty"]
    qtbot.mouseClick(widget.paint_next_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: len(widget.state.suggested) == 2, timeout=30_000)
    wait_idle(qtbot, widget)
    assert widget.state.suggested[1] != first
    assert viewer.layers["uncertainty"] is layer_before


def test_export_as_bioimageio_asks_where_and_packages_the_roles_of_the_editor(
        docked, qtbot, monkeypatch, tmp_path, packages):
    """The button asks where, then the Session packages the checkpoint with the roles edited
    in the widget, not the checkpoint's (the package and bioimage.io's test of it: the
    export's own tests)."""
    viewer, widget, image = docked
    choose_role(qtbot, widget, "membrane", "none")
    type_value(qtbot, widget, "mitochondria", "min_size", "9")
    edited = dict(widget.state.roles)
    assert edited["mitochondria"].min_size == 9 and edited["membrane"].role is None
    assert roles_from_metadata(load_checkpoint(widget.state.info.path).metadata,
                               widget.state.info.channel_names) != edited
    out = tmp_path / "model.zip"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), ""))
    qtbot.mouseClick(widget.bioimageio_button, Qt.LeftButton)
    wait_idle(qtbot, widget)
    assert not widget.state.errors, widget.state.errors
    [package] = packages
    assert package["source"] == widget.state.info.path  # no run yet: the checkpoint's weights
    np.testing.assert_array_equal(package["volume"], np.asarray(image.data))
    assert widget.output_label.text() == f"bioimage.io package written to {out}"
    # A channel without a role is stored as none (its other values mean nothing).
    assert roles_from_metadata(package["metadata"], widget.state.info.channel_names) == {
        "membrane": ChannelRole(), "mitochondria": edited["mitochondria"]}


def test_paint_here_next_on_a_time_series_names_the_time_point(make_napari_viewer, qtbot,
                                                               tmp_path):
    """A TYX store (napari-ome-zarr's layer) with a 2D model: the suggestion's centre is
    (t, y, x) and the log says t=, not z= as for a volume."""
    import re

    import torch
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image
    from tests._qt.conftest import CHANNELS, choose_checkpoint, make_volume

    from napari_finetune.model.checkpoint import save_checkpoint
    from napari_finetune.model.unet import UNet

    path = tmp_path / "tyx.ome.zarr"
    series = make_volume()[4:7]  # three planes as three time points
    write_image(series, zarr.group(store=parse_url(str(path), mode="w").store), axes="tyx",
                scale_factors=[])
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "unet2d.pt", UNet(dims=2, out_channels=2, depth=2,
                                                        features=4), {"channel_names": CHANNELS})
    viewer = make_napari_viewer()
    (image,) = viewer.open(str(path), plugin="napari-ome-zarr")
    assert tuple(image.level_shapes[0]) == (3, 64, 64)
    widget = dock_panel(viewer, qtbot)
    choose_checkpoint(qtbot, widget, str(ckpt))
    qtbot.waitUntil(lambda: widget.state.info is not None and widget.state.warming == 0,
                    timeout=60_000)
    try:
        qtbot.mouseClick(widget.paint_next_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: len(widget.state.suggested) == 1, timeout=60_000)
        wait_idle(qtbot, widget)
        assert not widget.state.errors, widget.state.errors
        assert viewer.layers["uncertainty"].data.shape == (3, 64, 64)
        line = [text for text in widget.status_panel.log.toPlainText().splitlines()
                if "paint here next:" in text][-1]
        where = re.search(r"paint here next: (\S+) (\S+) (\S+) \(", line)
        assert where is not None, line
        assert [w.split("=")[0] for w in where.groups()] == ["t", "y", "x"], line
        t = int(where.group(1).split("=")[1])
        assert 0 <= t < 3
    finally:
        wait_idle(qtbot, widget)
