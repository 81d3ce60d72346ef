"""The settings form: what the user changes wins over a checkpoint's degraded state."""

from __future__ import annotations

import numpy as np

from napari_finetune._qt.settings import SettingsForm
from napari_finetune.config import FinetuneConfig
from napari_finetune.model.unet import UNet
from napari_finetune.trainer.loop import Finetuner

DEGRADED = {"degraded": {"device_type": "cpu", "batch_size": 1, "fell_back_to_fp32": False,
                         "distillation_dropped": True}}


def _trainer(config: FinetuneConfig) -> Finetuner:
    image = np.zeros((8, 32, 32), np.float32)
    return Finetuner(UNet(depth=1, features=2), image, image.astype(np.uint8), config,
                     metadata={"run": DEGRADED})


def test_untouched_form_resumes_the_degraded_state(qtbot):
    form = SettingsForm()
    qtbot.addWidget(form)
    config = form.config(device="cpu")
    assert config.resume_degraded and config.explicit_settings == ()
    trainer = _trainer(config)
    assert trainer.batch_size == 1 and trainer.distillation == 0.0


def test_a_changed_batch_wins_and_unticks_the_box(qtbot):
    form = SettingsForm()
    qtbot.addWidget(form)
    form.batch_size.setValue(8)
    assert not form.resume_degraded.isChecked()
    config = form.config(device="cpu")
    assert config.explicit_settings == ("batch_size",) and not config.resume_degraded
    assert _trainer(config).batch_size == 8
    # ticked again: the rest of the degraded state comes back, the batch stays as set
    form.resume_degraded.setChecked(True)
    trainer = _trainer(form.config(device="cpu"))
    assert trainer.batch_size == 8 and trainer.distillation == 0.0
    assert "kept batch_size=8 as set" in trainer.recovery_log[-1]


def test_held_out_share_reaches_the_config(qtbot):
    form = SettingsForm()
    qtbot.addWidget(form)
    assert form.config().validation_fraction == FinetuneConfig().validation_fraction
    form.validation.setValue(0)
    assert form.config().validation_fraction == 0.0
