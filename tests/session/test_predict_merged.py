"""A LoRA model predicts through a merged copy; the training model keeps its adapters."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from tests.session.conftest import tiny_config

from napari_finetune.model.lora import is_lora, wrap_lora
from napari_finetune.model.unet import UNet
from napari_finetune.session import jobs


def _adapted() -> torch.nn.Module:
    """A small LoRA UNet whose adapters change its output (PEFT starts them at zero)."""
    torch.manual_seed(0)
    model = wrap_lora(UNet(dims=3, depth=2, features=4, out_channels=2), rank=2, alpha=4,
                      seed=1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.1)
    return model.eval()


def test_a_lora_model_predicts_merged_as_it_does_unmerged_and_keeps_its_adapters():
    model = _adapted()
    image = np.random.default_rng(0).random((16, 32, 32), dtype=np.float32)
    x = torch.from_numpy(image)[None, None]
    with torch.no_grad():
        unmerged = model(x)

    used, _, channels = jobs.model_to_predict("unused.pt", image, 2, model=model)
    assert not is_lora(used) and used is not model  # a plain, merged copy
    assert not any("lora_" in name for name, _ in used.named_parameters())
    assert used.training is model.training
    with torch.no_grad():
        torch.testing.assert_close(used(x), unmerged, atol=1e-5, rtol=0)
        # The training model: adapters there, unmerged, its output unchanged.
        assert is_lora(model) and any("lora_" in n for n, _ in model.named_parameters())
        torch.testing.assert_close(model(x), unmerged, atol=0, rtol=0)
    assert channels == 2


def test_a_lora_runs_preview_is_the_trainers_prediction_and_leaves_its_adapters(
        session, monkeypatch):
    session.config = dataclasses.replace(tiny_config(), mode="lora")
    assert session.finetune() is True
    trainer = session.trainer
    assert trainer is not None and is_lora(trainer.model)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:  # adapters that change the output
                param.add_(0.1)
    where = (slice(0, 16), slice(0, 32), slice(0, 32))
    import napari_finetune.predict as predict

    models: list[bool] = []  # whether each model the preview ran was a LoRA one
    real = predict.predict_block

    def spy(model, block, device="cpu"):
        models.append(is_lora(model))
        return real(model, block, device=device)

    monkeypatch.setattr(predict, "predict_block", spy)
    probs = jobs.preview_probs(trainer, where)
    monkeypatch.undo()
    assert models == [False]  # the merged copy, not the adapters unmerged
    np.testing.assert_allclose(probs, trainer.predict(where), atol=1e-5, rtol=0)
    assert is_lora(trainer.model)
    assert any("lora_" in name for name, _ in trainer.model.named_parameters())
