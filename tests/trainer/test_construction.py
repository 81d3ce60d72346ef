"""Construction is cheap (the widget builds a Finetuner on the Qt main thread)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from engine_setup import make_trainer

from napari_finetune.trainer.record import apply_previous_run


def test_construction_builds_nothing_heavy():
    trainer = make_trainer(mode="lora")
    assert trainer.optimizer is None and trainer.sampler is None and trainer.teacher is None
    assert type(trainer.model).__name__ == "UNet"  # PEFT wraps it only in build()
    assert trainer.device == torch.device("cpu")


def test_importing_and_constructing_does_not_import_peft():
    code = (
        "import sys, numpy as np\n"
        "from napari_finetune.config import FinetuneConfig\n"
        "from napari_finetune.model.unet import UNet\n"
        "from napari_finetune.trainer.loop import Finetuner\n"
        "from napari_finetune import testing\n"
        "from napari_finetune.trainer import recovery\n"
        "z = np.zeros((8, 16, 16), np.float32)\n"
        "Finetuner(UNet(depth=1, features=2), z, z.astype(np.uint8),\n"
        "          FinetuneConfig(device='cpu', patch_shape=(4, 8, 8)))\n"
        "assert 'peft' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_previous_run_is_resumed_only_on_the_same_device_type():
    run = {"degraded": {"device_type": "cuda", "batch_size": 1, "fell_back_to_fp32": True,
                        "distillation_dropped": True}}
    trainer = make_trainer(batch_size=4)
    assert apply_previous_run(trainer.state, trainer.precision, trainer.config, run) == ""
    assert trainer.batch_size == 4 and trainer.distillation == 0.5
    run["degraded"]["device_type"] = "cpu"
    message = apply_previous_run(trainer.state, trainer.precision, trainer.config, run)
    assert message.startswith("resumed the previous run's degraded state: batch 1")
    assert (trainer.batch_size, trainer.accumulation) == (1, 4)
    assert trainer.distillation == 0.0 and trainer.dropped_at_step == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_run_with_mixed_precision_and_an_injected_oom():
    from napari_finetune import testing as faults

    trainer = make_trainer(steps=3, batch_size=4, device="cuda", mixed_precision=True,
                           mode="lora")
    trainer.build()
    expected = "bfloat16" if torch.cuda.get_device_capability()[0] >= 8 else "float16"
    assert trainer.precision.dtype_name == expected
    faults.oom_above_batch(trainer.model, 2)
    events = list(trainer.run())
    assert events[-1].kind == "finished" and trainer.steps_done == 3
    assert (trainer.batch_size, trainer.accumulation) == (2, 2)
    assert events[-1].dtype in (expected, "float32")


def test_with_autobatch_a_previous_batch_is_not_resumed():
    run = {"degraded": {"device_type": "cpu", "batch_size": 1, "fell_back_to_fp32": False,
                        "distillation_dropped": False}}
    trainer = make_trainer(batch_size=4, autobatch=True)
    assert apply_previous_run(trainer.state, trainer.precision, trainer.config, run) == ""
    assert (trainer.batch_size, trainer.accumulation) == (4, 1)
