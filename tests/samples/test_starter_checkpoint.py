"""The shipped starter checkpoint: the sample's architecture, its channels named for what
they are with their instance roles, no voxel size, and bright nuclei seen as objects."""

from napari_finetune.loading import load_checkpoint
from napari_finetune.objects import roles_from_metadata
from napari_finetune.samples.starter import CHANNEL_NAMES, starter_checkpoint_path
from napari_finetune.samples.synthetic_em import sample_checkpoint_path
from napari_finetune.voxel_size import trained_voxel_size


def test_starter_loads_like_the_sample_with_named_channels_and_roles():
    starter = load_checkpoint(starter_checkpoint_path())
    sample = load_checkpoint(sample_checkpoint_path())
    assert starter.architecture == sample.architecture
    assert starter.channel_names == CHANNEL_NAMES == ["boundaries", "objects"]
    roles = roles_from_metadata(starter.metadata, starter.channel_names)
    assert roles["boundaries"].role == "boundary" and roles["objects"].role == "object"
    assert trained_voxel_size(starter.metadata) is None
    assert starter_checkpoint_path().stat().st_size < 4e6


def test_starter_sees_a_bright_nucleus_where_the_sample_sees_none():
    import torch

    from napari_finetune.data.normalization import intensity_range, normalize
    from napari_finetune.samples.synthetic_fluo import generate_fluo_volume

    image, truth = generate_fluo_volume((16, 64, 64), 906, "nuclei", 2)
    x = normalize(image, *intensity_range(image, {"method": "percentile", "low": 1.0,
                                                  "high": 99.0}))
    inside = {}
    models = {"starter": starter_checkpoint_path(), "sample": sample_checkpoint_path()}
    for name, path in models.items():
        model = load_checkpoint(path).model.eval()
        with torch.no_grad():
            prob = torch.sigmoid(model(torch.from_numpy(x)[None, None]))[0, 1].numpy()
        inside[name] = float(prob[truth[1]].mean() - prob[~truth[1]].mean())
    assert inside["starter"] > 0.2 > inside["sample"], inside
