import pytest

from napari_finetune.config import FinetuneConfig, PredictConfig


def test_defaults_are_valid_and_plain():
    config = FinetuneConfig()
    assert config.samples_per_step == config.batch_size * config.accumulation
    d = config.to_dict()
    assert d["patch_shape"] == [32, 64, 64]
    assert FinetuneConfig(**{**d, "patch_shape": tuple(d["patch_shape"])}) == config


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("steps", 0, "steps must be a positive integer"),
        ("batch_size", 2.5, "batch_size must be a positive integer"),
        ("learning_rate", 0, "learning_rate must be > 0"),
        ("mode", "qlora", "mode must be 'lora' or 'full'"),
        ("distillation", -1, "distillation must be >= 0"),
        ("distillation", float("nan"), "distillation must be a finite number"),
        ("learning_rate", float("inf"), "learning_rate must be a finite number"),
        ("device", "tpu", "device must be"),
        ("patch_shape", (0, 64, 64), "patch_shape must be positive"),
        ("prefetch_steps", -1, "prefetch_steps must be an integer >= 0"),
        ("memory_fraction", 0, r"memory_fraction must be a number in \(0, 1\]"),
        ("memory_fraction", 1.01, "memory_fraction must be a number in"),
        ("memory_fraction", float("nan"), "memory_fraction must be a number in"),
        ("memory_fraction", "0.5", "memory_fraction must be a number in"),
        ("autobatch", "yes", "autobatch must be True, False or None"),
        ("memory_snapshot", " ", "memory_snapshot must be a file path or None"),
        ("voxel_size", (40, 0, 8), "voxel_size must be 2 or 3 positive numbers"),
        ("voxel_size", (40, float("nan"), 8), "voxel_size must be 2 or 3 positive numbers"),
        ("voxel_size", (1, 2, 3, 4), "voxel_size must be 2 or 3 positive numbers"),
        ("voxel_size", ("a", 8, 8), "voxel_size must be numbers"),
        ("voxel_size", 40, "voxel_size must be numbers"),
    ],
)
def test_bad_values_name_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        FinetuneConfig(**{field: value})


def test_predict_config_axes_must_agree():
    with pytest.raises(ValueError, match="same number of axes"):
        PredictConfig(block_shape=(64, 64), halo=(4, 4, 4))


def test_memory_fields_defaults_and_autobatch_by_device():
    config = FinetuneConfig()
    assert config.autobatch is None and config.memory_fraction == 0.8
    assert config.memory_snapshot is None
    assert config.autobatch_on("cuda") and config.autobatch_on("mps")
    assert not config.autobatch_on("cpu")
    assert FinetuneConfig(autobatch=True).autobatch_on("cpu")
    assert not FinetuneConfig(autobatch=False).autobatch_on("cuda")
    assert FinetuneConfig(memory_fraction=1).memory_fraction == 1.0
    assert FinetuneConfig(memory_snapshot="m.pickle").to_dict()["memory_snapshot"] == "m.pickle"


def test_unknown_fields_stay_an_error():
    with pytest.raises(TypeError, match="memory_budget"):
        FinetuneConfig(memory_budget=1)


def test_voxel_size_is_plain_and_round_trips():
    assert FinetuneConfig().voxel_size is None and FinetuneConfig().to_dict()["voxel_size"] is None
    config = FinetuneConfig(voxel_size=[40, 8, 8])
    assert config.voxel_size == (40.0, 8.0, 8.0)
    d = config.to_dict()
    assert d["voxel_size"] == [40.0, 8.0, 8.0]
    assert FinetuneConfig(**{**d, "patch_shape": tuple(d["patch_shape"])}) == config
    with pytest.raises(TypeError, match="voxel_sizes"):
        FinetuneConfig(voxel_sizes=(40, 8, 8))
