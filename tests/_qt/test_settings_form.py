"""The settings form: what the user changes wins over a checkpoint's degraded state."""

from __future__ import annotations

import numpy as np
import pytest

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
    form.batch_size.value = 8
    assert not form.resume_degraded.value
    config = form.config(device="cpu")
    assert config.explicit_settings == ("batch_size",) and not config.resume_degraded
    assert _trainer(config).batch_size == 8
    # ticked again: the rest of the degraded state comes back, the batch stays as set
    form.resume_degraded.value = True
    trainer = _trainer(form.config(device="cpu"))
    assert trainer.batch_size == 8 and trainer.distillation == 0.0
    assert "kept batch_size=8 as set" in trainer.recovery_log[-1]


def test_held_out_share_reaches_the_config(qtbot):
    form = SettingsForm()
    qtbot.addWidget(form)
    assert form.config().validation_fraction == FinetuneConfig().validation_fraction
    form.validation.value = 0
    assert form.config().validation_fraction == 0.0


def test_each_input_accepts_exactly_what_the_cli_accepts(qtbot):
    """One source of ranges: the widget's limits are the CLI's, field by field."""
    import argparse

    from napari_finetune._qt.settings import PERCENT_FIELDS, PLAIN_TIPS
    from napari_finetune.cli.options import add_config_options, config_from_args
    from napari_finetune.config_fields import FIELDS

    form = SettingsForm()
    qtbot.addWidget(form)
    parser = argparse.ArgumentParser()
    add_config_options(parser, FinetuneConfig)
    help_text = " ".join(parser.format_help().split())
    ranged = [name for name, spec in FIELDS.items() if spec.low is not None]
    assert {"steps", "learning_rate", "batch_size", "memory_fraction", "seed"} <= set(ranged)
    for name in ranged:
        spec, flag = FIELDS[name], "--" + name.replace("_", "-")
        if name == "patch_shape":  # a text of sizes: each checked against the same range
            form.patch_shape.value = f"{spec.high + 1} 64 64"
            with pytest.raises(ValueError, match="between 1 and 1024"):
                form.config()
            form.patch_shape.value = "32 64 64"
        else:
            scale = 100 if name in PERCENT_FIELDS else 1
            widget = form.inputs[name]
            assert (widget.min, widget.max) == pytest.approx(
                (spec.low * scale, spec.high * scale)), name
            # The same words, or the widget's plain ones where the CLI's are the engine's.
            assert widget.tooltip and (widget.tooltip in help_text
                                       or name in PLAIN_TIPS), name
        kind = int if isinstance(spec.low, int) and name != "max_grad_norm" else float
        for inside in (spec.low, spec.high):
            args = parser.parse_args([flag, str(kind(inside))])
            try:
                config_from_args(FinetuneConfig, args)
            except ValueError as exc:  # the config's own rules may be stricter, not the range
                assert "must be between" not in str(exc), (name, inside)
        for outside in (spec.low - spec.step, spec.high + spec.step):
            args = parser.parse_args([flag, str(kind(outside))])
            with pytest.raises(ValueError, match=f"{name} must be between"):
                config_from_args(FinetuneConfig, args)


def test_advanced_settings_start_collapsed_and_reach_the_config(qtbot):
    form = SettingsForm()
    qtbot.addWidget(form)
    form.show()
    qtbot.waitExposed(form)
    advanced = form.advanced.native
    assert not form.advanced_box.isExpanded() and advanced.visibleRegion().isEmpty()
    form.advanced_box.expand(animate=False)
    qtbot.waitUntil(lambda: not advanced.visibleRegion().isEmpty())
    assert not form.memory_snapshot.enabled  # off until ticked
    form.record_memory.value = True
    form.memory_snapshot.value = "run.pickle"
    form.autobatch.value = False
    form.memory_fraction.value = 0.5
    form.max_grad_norm.value = 1.0
    form.patch_shape.value = "16, 32, 32"
    form.seed.value = 7
    config = form.config()
    assert (config.memory_snapshot, config.autobatch, config.memory_fraction) == (
        "run.pickle", False, 0.5)
    assert (config.max_grad_norm, config.patch_shape, config.seed) == (1.0, (16, 32, 32), 7)
    form.max_grad_norm.value = 0  # shown as "off"
    assert form.config().max_grad_norm is None
    with pytest.raises(ValueError, match="whole numbers"):
        form.patch_shape.value = "32 x"
        form.config()


def test_lora_on_a_network_it_does_not_suit_says_so_and_follows_the_rank(qtbot):
    form = SettingsForm()
    qtbot.addWidget(form)
    form.set_lora_share(0.03)  # rank 8 adds 24 % to the adapted weights
    assert form.lora_advice.text() == ""  # Full fine-tune is picked
    form.mode.value = "lora"
    form.lora_rank.value = 8
    assert "LoRA rank 8 adds 24%" in form.lora_advice.text()
    assert "pick Full" in form.lora_advice.text()
    form.lora_rank.value = 4  # 12 %: small enough, nothing to say
    assert form.lora_advice.text() == ""
    form.lora_rank.value = 16
    form.mode.value = "full"
    assert form.lora_advice.text() == ""


def test_a_voxel_size_given_for_a_file_without_one_reaches_the_config(qtbot):
    form = SettingsForm()
    qtbot.addWidget(form)
    assert form.config().voxel_size is None  # empty: the file's scale, read at the run
    form.voxel_size.native.setText("1, 0.2 0.2")
    assert form.config().voxel_size == (1.0, 0.2, 0.2)
    for bad in ("1 0 0.2", "one two", "-1 1 1"):
        form.voxel_size.native.setText(bad)
        with pytest.raises(ValueError, match="Voxel size must be positive numbers") as info:
            form.config()
        assert "\n" not in str(info.value)
