"""Channel roles: validated, stored in a checkpoint's metadata as plain types."""

import pytest

from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.objects import (
    METADATA_KEY,
    ChannelRole,
    roles_from_metadata,
    roles_to_metadata,
)
from napari_finetune.objects.roles import SAMPLE_CHANNELS, SAMPLE_ROLES
from napari_finetune.samples.synthetic_em import CHANNEL_NAMES


def test_roles_round_trip_through_a_checkpoint(tmp_path):
    names = ["nuclei", "walls", "background"]
    roles = {
        "nuclei": ChannelRole(
            "object", threshold=0.4, min_size=30, seed_distance=3.5, split=True,
            seed_threshold=0.8,
        ),
        "walls": ChannelRole("boundary", threshold=0.6, min_size=500, seed_distance=2),
        "background": ChannelRole(None),
    }
    metadata = roles_to_metadata(roles, {"channel_names": names})
    model = UNet(dims=3, depth=2, features=4, out_channels=3)
    path = save_checkpoint(tmp_path / "m.pt", model, metadata)
    loaded = load_checkpoint(path)  # weights_only=True: plain types only
    assert loaded.metadata[METADATA_KEY] == {
        "nuclei": roles["nuclei"].to_dict(),
        "walls": roles["walls"].to_dict(),
    }
    assert roles_from_metadata(loaded.metadata, loaded.channel_names) == roles


def test_sample_defaults_without_metadata_and_none_for_other_models():
    assert SAMPLE_CHANNELS == tuple(CHANNEL_NAMES)
    roles = roles_from_metadata({}, CHANNEL_NAMES)
    assert roles == SAMPLE_ROLES
    assert roles["membrane"].role == "boundary" and roles["mitochondria"].role == "object"
    other = roles_from_metadata({}, ["nuclei", "membrane"])
    assert all(r.role is None for r in other.values()) and list(other) == ["nuclei", "membrane"]
    # Stored roles win over the sample's defaults, and unmentioned channels have none.
    only_mito = {METADATA_KEY: {"mitochondria": {"role": "object"}}}
    stored = roles_from_metadata(only_mito, CHANNEL_NAMES)
    assert stored["membrane"].role is None and stored["mitochondria"] == ChannelRole("object")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"role": "cells"}, "unknown role 'cells'"),
        ({"role": "object", "threshold": 1.0}, "threshold must be in (0, 1)"),
        ({"role": "object", "threshold": 0}, "threshold must be in (0, 1)"),
        ({"role": "object", "min_size": -1}, "min_size must be a whole number of voxels >= 0"),
        ({"role": "object", "min_size": 2.5}, "min_size must be a whole number"),
        ({"role": "boundary", "seed_distance": 0.5}, "every voxel is a seed"),
        ({"role": "object", "sed_distance": 3}, "unknown keys ['sed_distance']"),
        ({"role": "object", "seed_threshold": 0.5}, "seed_threshold must be None or in"),
        ({"role": "object", "threshold": 0.4, "seed_threshold": 1}, "in (threshold, 1)"),
        ({"role": "object", "seed_threshold": "0.9"}, "seed_threshold must be None or in"),
        ("object", "must be a dict"),
    ],
)
def test_bad_values_give_one_line_naming_the_channel_and_fix(entry, message):
    with pytest.raises(ValueError) as err:
        roles_from_metadata({METADATA_KEY: {"mitochondria": entry}}, CHANNEL_NAMES)
    text = str(err.value)
    assert message in text and "'mitochondria'" in text and "\n" not in text


def test_bad_values_refused_at_construction_and_unknown_channels_named():
    with pytest.raises(ValueError, match="threshold must be in"):
        ChannelRole("object", threshold=1.5)
    with pytest.raises(ValueError, match=r"names channels \['nucleus'\]"):
        roles_from_metadata({METADATA_KEY: {"nucleus": {"role": "object"}}}, CHANNEL_NAMES)
