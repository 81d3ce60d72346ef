"""``napari_finetune.cli.real.real_rows`` from another pretrained model than the sample's
(``benchmarks/bench_real.py --checkpoint``)."""

from __future__ import annotations

import numpy as np

import napari_finetune.loading as loading
from napari_finetune.cli.real import real_rows
from napari_finetune.model.checkpoint import save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.samples.real import CATALOGUE, RealVolume
from napari_finetune.samples.synthetic_em import sample_checkpoint_path


def _nuclei_volume() -> RealVolume:
    """Two bright blobs, one per half in x: a small stand-in for a CHO time point."""
    zz, yy, xx = np.mgrid[:5, :40, :64]
    truth = np.zeros((5, 40, 64), np.uint32)
    truth[(yy - 20) ** 2 + (xx - 16) ** 2 < 64] = 1
    truth[(yy - 20) ** 2 + (xx - 48) ** 2 < 64] = 2
    image = np.where(truth > 0, 120, 8).astype(np.uint8)
    every = slice(0, None)
    return RealVolume(CATALOGUE["cho-t00"], image, truth, np.ones(truth.shape, bool),
                      (every, every, slice(0, 32)), (every, every, slice(32, 64)))


def test_rows_start_from_the_checkpoint_given(tmp_path, monkeypatch):
    model = UNet(dims=3, in_channels=1, out_channels=2, depth=3, features=8, norm="group")
    path = save_checkpoint(tmp_path / "starter.pt", model, {
        "channel_names": ["boundaries", "objects"],
        "instance_roles": {"boundaries": {"role": "boundary"}, "objects": {"role": "object"}},
    })
    opened = []
    real_load = loading.load_checkpoint

    def spy(p, *args, **kwargs):
        opened.append(p)
        return real_load(p, *args, **kwargs)

    monkeypatch.setattr(loading, "load_checkpoint", spy)
    volume = _nuclei_volume()
    rows = real_rows(volume, ("pretrained",), 0, 0.0, tmp_path, progress=False,
                     checkpoint=path)
    assert opened == [path]
    assert [r["run"] for r in rows] == ["pretrained"] and rows[0]["true"] >= 1
    # Without one, the sample model, as the widget preselects it.
    real_rows(volume, ("pretrained",), 0, 0.0, tmp_path, progress=False)
    assert opened[1] == sample_checkpoint_path()
