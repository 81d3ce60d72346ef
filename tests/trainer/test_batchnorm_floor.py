"""BatchNorm with a 1x1x1 bottleneck: checked before step 1, never a raw torch error."""

from __future__ import annotations

import pytest
import torch
from engine_setup import make_trainer

from napari_finetune.model.unet import UNet
from napari_finetune.testing import oom_above_batch
from napari_finetune.trainer.batchnorm_floor import batchnorm_floor, split_respects

PATCH = (8, 8, 8)  # a depth-3 UNet pools it down to 1x1x1


def bn_unet(norm: str = "batch") -> UNet:
    torch.manual_seed(0)
    return UNet(dims=3, in_channels=1, out_channels=2, depth=3, features=4, norm=norm)


def test_floor_finds_the_bottleneck_without_touching_the_model():
    model = bn_unet()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    floor = batchnorm_floor(model, PATCH)
    assert floor is not None and floor.values_per_sample == 1 and floor.min_batch == 2
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert batchnorm_floor(model, (16, 16, 16)).min_batch == 1  # 2x2x2 = 8 values
    assert batchnorm_floor(bn_unet("group"), PATCH) is None


def test_split_keeps_every_micro_batch_above_the_floor():
    floor = batchnorm_floor(bn_unet(), PATCH)
    assert split_respects(floor, 8, 2)
    assert not split_respects(floor, 3, 2)  # 2 + 1
    assert not split_respects(floor, 8, 1)
    assert split_respects(None, 8, 1)


def test_batch_1_at_a_1x1x1_bottleneck_is_refused_with_a_patch_that_works():
    trainer = make_trainer(model=bn_unet(), batch_size=1, patch_shape=PATCH, steps=2)
    with pytest.raises(ValueError) as info:
        list(trainer.run())
    message = str(info.value)
    assert "\n" not in message
    assert "needs more than 1 value per channel" in message
    assert "--batch-size 2" in message and "--patch-shape 16 16 16" in message


def test_ladder_stops_halving_at_the_batch_batchnorm_needs():
    trainer = make_trainer(
        model=bn_unet(), batch_size=8, patch_shape=PATCH, steps=3, distillation=0.5
    )
    trainer.build()
    fault = oom_above_batch(trainer.model, max_batch=1)  # nothing above 1 fits ...
    events = []
    with pytest.raises(Exception) as info:
        for status in trainer.run():
            events.append(status)
    # ... so the ladder halves to 2, drops the teacher, and gives up: never batch 1.
    assert fault.count > 0
    assert "Expected more than 1 value" not in str(info.value)
    assert "out of memory" in str(info.value).lower()
    assert min(s.batch_size for s in events) == 2
    assert any("BatchNorm layer" in s.message and "stays at 2" in s.message for s in events)


def test_ladder_reaching_the_floor_still_trains_when_it_fits():
    trainer = make_trainer(model=bn_unet(), batch_size=8, patch_shape=PATCH, steps=3)
    trainer.build()
    oom_above_batch(trainer.model, max_batch=2)
    events = list(trainer.run())
    assert events[-1].kind == "finished" and events[-1].batch_size == 2
    assert trainer.steps_done == 3
