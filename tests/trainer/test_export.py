"""Export: merged adapters, the run's record, the degraded state resumed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_setup import make_trainer

from napari_finetune import testing as faults
from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint
from napari_finetune.model.lora import is_lora
from napari_finetune.model.unet import UNet
from napari_finetune.predict import predict_block


def _outputs(model, x):
    model.eval()
    with torch.no_grad():
        return model(x)


def test_lora_export_merges_and_reloads_with_the_same_outputs(tmp_path):
    # Large learning rate so the adapters really move the outputs.
    trainer = make_trainer(steps=3, batch_size=2, mode="lora", learning_rate=5e-2)
    list(trainer.run())
    assert is_lora(trainer.model)
    x = torch.rand(2, 1, 8, 16, 16)
    unmerged = _outputs(trainer.model, x)
    with trainer.model.disable_adapter():
        start = _outputs(trainer.model, x)
    assert (unmerged - start).abs().max() > 1e-3  # the adapters changed something
    trainer.model.train()
    path = trainer.export(tmp_path / "tuned.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuned.pt"]  # no temp file left
    raw = torch.load(path, map_location="cpu", weights_only=True)
    assert not any("lora" in key for key in raw["state_dict"])
    ckpt = load_checkpoint(path)
    assert type(ckpt.model) is UNet
    torch.testing.assert_close(_outputs(ckpt.model, x), unmerged, rtol=1e-4, atol=1e-5)
    # Exporting did not touch the training state: adapters still there, training goes on.
    assert is_lora(trainer.model) and trainer.model.training
    torch.testing.assert_close(_outputs(trainer.model, x), unmerged, rtol=0, atol=0)


def test_full_export_record_and_metadata(tmp_path):
    source = tmp_path / "source.pt"
    metadata = {"channel_names": ["membrane", "mitochondria"],
                "normalization": {"method": "percentile", "low": 2.0, "high": 98.0}}
    save_checkpoint(source, UNet(dims=3, depth=2, features=4), metadata)
    start = load_checkpoint(source)
    trainer = make_trainer(model=start.model, metadata=start.metadata, steps=2, batch_size=2)
    trainer.source_sha256 = start.sha256
    list(trainer.run())
    ckpt = load_checkpoint(trainer.export(tmp_path / "out.pt"))
    assert ckpt.channel_names == ["membrane", "mitochondria"]
    assert ckpt.normalization["low"] == 2.0
    run = ckpt.metadata["run"]
    assert run["steps_done"] == 2 and run["final_dtype"] == "float32"
    assert run["source_sha256"] == start.sha256
    assert run["painted_voxels"] == 200
    assert run["config"]["mode"] == "full" and run["batch_size"] == 2
    x = torch.rand(1, 1, 8, 16, 16)
    torch.testing.assert_close(_outputs(ckpt.model, x), _outputs(trainer.model, x))


def test_degraded_state_is_saved_and_resumed(tmp_path):
    trainer = make_trainer(steps=1, batch_size=4)
    trainer.build()
    faults.oom_above_batch(trainer.model, 1)
    faults.oom_in_teacher(trainer)
    events = list(trainer.run())
    assert events[-1].distillation == "dropped" and trainer.batch_size == 1
    ckpt = load_checkpoint(trainer.export(tmp_path / "degraded.pt"))
    run = ckpt.metadata["run"]
    assert (run["batch_size"], run["accumulation"]) == (1, 4)
    assert run["distillation"] == "dropped" and run["dropped_at_step"] == 1
    assert len(run["recovery_log"]) == 3

    resumed = make_trainer(model=ckpt.model, metadata=ckpt.metadata, steps=1, batch_size=4)
    assert (resumed.batch_size, resumed.accumulation) == (1, 4)
    assert resumed.distillation == 0.0 and not resumed.hold_other_channels
    first = next(resumed.run())
    assert first.kind == "recovery" and first.message.startswith("resumed")
    assert first.distillation == "dropped"


def test_predict_uses_the_current_weights():
    trainer = make_trainer(steps=1, batch_size=2)
    list(trainer.run())
    region = (slice(0, 8), slice(0, 16), slice(4, 20))
    probs = trainer.predict(region)
    low, high = trainer.normalization_range
    block = (trainer.image[region] - low) / (high - low)
    expected = predict_block(trainer.model, block.astype(np.float32))
    np.testing.assert_allclose(probs, expected, rtol=1e-6)
    assert trainer.model.training  # predict restored the training mode


def test_release_frees_training_state_but_keeps_export_and_predict(tmp_path):
    trainer = make_trainer(steps=2)
    for _ in trainer.run():
        pass
    assert trainer.optimizer is not None and trainer.teacher is not None
    region = (slice(0, 8), slice(0, 16), slice(0, 16))
    before = trainer.predict(region)
    trainer.release()
    assert trainer.optimizer is None and trainer.teacher is None
    np.testing.assert_array_equal(trainer.predict(region), before)
    reloaded = load_checkpoint(trainer.export(tmp_path / "m.pt"))
    assert reloaded.metadata["run"]["steps_done"] == 2
    with pytest.raises(RuntimeError, match="released"):
        next(trainer.run())


def test_export_metadata_replaces_those_entries_in_the_file_only(tmp_path):
    """The widget's edited instance roles go into the file; the run's metadata is kept."""
    stored = {"membrane": {"role": "boundary", "threshold": 0.5}}
    edited = {"mitochondria": {"role": "object", "threshold": 0.4, "min_size": 7}}
    metadata = {"channel_names": ["membrane", "mitochondria"], "instance_roles": stored}
    trainer = make_trainer(steps=1, batch_size=1, metadata=metadata)
    list(trainer.run())
    ckpt = load_checkpoint(trainer.export(tmp_path / "out.pt",
                                          metadata={"instance_roles": edited}))
    assert ckpt.metadata["instance_roles"] == edited
    assert ckpt.channel_names == ["membrane", "mitochondria"] and ckpt.metadata["run"]
    assert trainer.metadata["instance_roles"] == stored
    plain = load_checkpoint(trainer.export(tmp_path / "plain.pt"))
    assert plain.metadata["instance_roles"] == stored
