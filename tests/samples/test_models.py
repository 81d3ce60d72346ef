"""The shipped models by name: what ``-c starter`` and the panel's model menu resolve."""

from __future__ import annotations

from napari_finetune.loading import load_checkpoint
from napari_finetune.samples.models import SHIPPED, shipped_model
from napari_finetune.samples.starter import starter_checkpoint_path
from napari_finetune.samples.synthetic_em import sample_checkpoint_path


def test_each_name_is_a_file_of_the_package_that_loads_with_its_channels():
    assert shipped_model("starter") == starter_checkpoint_path()
    assert shipped_model(" Sample ") == sample_checkpoint_path()
    channels = {name: load_checkpoint(model.path).channel_names
                for name, model in SHIPPED.items()}
    assert channels == {"sample": ["membrane", "mitochondria"],
                        "starter": ["boundaries", "objects"]}
    for name, model in SHIPPED.items():  # what it is for names its channels
        assert all(c in model.about for c in channels[name])


def test_a_file_of_that_name_is_what_the_user_means(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "starter").write_bytes(b"mine")
    assert shipped_model("starter") is None
    assert shipped_model("my_model.pt") is None
