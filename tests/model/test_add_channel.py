"""add_output_channel: one more output channel, the old ones bit for bit, a file that reloads."""

from __future__ import annotations

import pytest
import torch

from napari_finetune.model.add_channel import (
    NEW_CHANNEL_BIAS,
    ROLES,
    ROLES_KEY,
    STARTING_CHANNELS_KEY,
    AddChannelError,
    add_output_channel,
    added_parameters,
    channel_rows,
    output_channel_count,
    parse_add_channel,
)
from napari_finetune.model.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from napari_finetune.model.unet import UNet
from third_party import monai_nets, torch_em_model


def _trained_like(model: torch.nn.Module) -> torch.nn.Module:
    # Non-zero everywhere (a freshly initialised bias of 0 would hide a wrong copy).
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def _same_old_channels(old: torch.nn.Module, new: torch.nn.Module, shape) -> torch.Tensor:
    x = torch.randn(2, 1, *shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before, after = old.eval()(x), new.eval()(x)
    assert after.shape[1] == before.shape[1] + 1
    torch.testing.assert_close(after[:, : before.shape[1]], before, rtol=0, atol=0)
    return after


@pytest.mark.parametrize("dims", [2, 3])
def test_unet_keeps_its_channels_exactly_and_the_new_one_starts_absent(dims):
    model = _trained_like(UNet(dims=dims, out_channels=2, depth=2, features=4))
    wide = add_output_channel(model, "nuclei", "object")
    after = _same_old_channels(model, wide, (16,) * dims)
    new = torch.sigmoid(after[:, 2])
    assert torch.allclose(new, torch.sigmoid(torch.tensor(NEW_CHANNEL_BIAS)))
    assert wide.init_kwargs["out_channels"] == 3
    # The starting model is left as it was: the run's teacher may still be it.
    assert model.head.out_channels == 2 and model.init_kwargs["out_channels"] == 2


def test_a_checkpoint_gets_the_name_role_and_reloads_with_weights_only(tmp_path):
    model = _trained_like(UNet(dims=3, out_channels=2, depth=2, features=4))
    path = save_checkpoint(tmp_path / "m.pt", model, {"channel_names": ["membrane", "mito"]})
    ckpt = load_checkpoint(path)
    wide = add_output_channel(ckpt, "nuclei", "object",
                              roles_before={"membrane": {"role": "boundary"}})
    assert isinstance(wide, Checkpoint)
    assert wide.channel_names == ["membrane", "mito", "nuclei"]
    assert wide.architecture["kwargs"]["out_channels"] == 3
    assert wide.metadata[ROLES_KEY] == {"membrane": {"role": "boundary"},
                                        "nuclei": {"role": "object"}}
    assert wide.metadata[STARTING_CHANNELS_KEY] == 2
    assert ckpt.channel_names == ["membrane", "mito"]  # not changed
    saved = save_checkpoint(tmp_path / "wide.pt", wide.model, wide.metadata)
    raw = torch.load(saved, weights_only=True)  # plain data: the loader's own reading
    assert raw["architecture"]["kwargs"]["out_channels"] == 3
    back = load_checkpoint(saved)
    assert back.channel_names == ["membrane", "mito", "nuclei"]
    assert len(back.channel_colors) == 3
    _same_old_channels(model, back.model, (16, 16, 16))
    # A second structure keeps the first count: the teacher is the model as loaded.
    twice = add_output_channel(wide, "golgi", "boundary")
    assert twice.metadata[STARTING_CHANNELS_KEY] == 2 and len(twice.channel_names) == 4


def test_roles_key_and_names_are_the_objects_packages():
    from napari_finetune.objects import roles

    assert ROLES_KEY == roles.METADATA_KEY and set(ROLES) == set(roles.ROLES)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("nuclei", "NAME:ROLE"), ("nuclei:blob", "object, boundary"), (":object", "NAME:ROLE"),
     ("a/b:object", "a channel name")],
)
def test_bad_name_or_role_is_one_line(text, expected):
    with pytest.raises(AddChannelError) as info:
        parse_add_channel(text)
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert parse_add_channel("Nuclei 2:Object") == ("Nuclei 2", "object")


def test_a_name_the_model_has_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "m.pt", UNet(dims=2, out_channels=2, depth=1, features=4),
                           {"channel_names": ["membrane", "mito"]})
    with pytest.raises(AddChannelError, match="already has a channel named 'mito'"):
        add_output_channel(load_checkpoint(path), "mito", "object")


@pytest.mark.parametrize("kind", ["UNet", "BasicUNet"])
def test_monai_models_get_a_channel_and_rebuild_from_the_file(tmp_path, kind):
    nets = monai_nets()
    if kind == "UNet":  # without residual units its last layer is a transposed convolution
        model = nets.UNet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2))
    else:
        model = nets.BasicUNet(3, 1, 2, features=(4, 4, 8, 8, 16, 4))
    model = _trained_like(model)
    wide = add_output_channel(model, "nuclei", "object")
    _same_old_channels(model, wide, (32, 32, 32))
    path = save_checkpoint(tmp_path / "m.pt", wide, {"channel_names": ["a", "b", "nuclei"]})
    back = load_checkpoint(path)
    assert back.architecture["kwargs"]["out_channels"] == 3
    _same_old_channels(model, back.model, (32, 32, 32))


def test_torch_em_unet_gets_a_channel(tmp_path):
    model = _trained_like(torch_em_model().UNet3d(1, 2, depth=2, initial_features=4))
    wide = add_output_channel(model, "nuclei", "object")
    _same_old_channels(model, wide, (16, 16, 16))
    back = load_checkpoint(save_checkpoint(tmp_path / "m.pt", wide))
    _same_old_channels(model, back.model, (16, 16, 16))


def test_a_model_whose_output_is_made_after_its_last_convolution_is_one_line():
    # MONAI UNet with residual units adds a skip path to its last convolution's output.
    model = monai_nets().UNet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2), num_res_units=1)
    with pytest.raises(AddChannelError) as info:
        add_output_channel(model, "nuclei", "object")
    message = str(info.value)
    assert "\n" not in message and "cannot add a channel to UNet" in message
    assert "made after its last layer" in message


def test_a_final_activation_is_one_line():
    class Softmaxed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = UNet(dims=2, out_channels=2, depth=1, features=4)
            self.shape_multiple = 2
            self.init_kwargs = {"out_channels": 2}

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.softmax(self.net(x), dim=1)

    with pytest.raises(AddChannelError, match="made after its last layer"):
        add_output_channel(Softmaxed(), "nuclei", "object")


def test_unet_channel_has_weights_of_its_own_that_no_old_channel_reads():
    model = _trained_like(UNet(dims=3, out_channels=2, depth=2, features=4))
    wide = add_output_channel(model, "nuclei", "object")
    assert wide.head.out_channels == 2 and len(wide.added) == 1
    assert wide.init_kwargs == {**model.init_kwargs, "out_channels": 3, "added_channels": 1}
    own = wide.added[0]
    # Its own copy of the starting layers; its output row zero.
    for name, value in model.state_dict().items():
        if not name.startswith("head."):
            torch.testing.assert_close(own.state_dict()[name], value, rtol=0, atol=0)
    assert not own.head.weight.any()
    with torch.no_grad():  # own weights changed: the old channels cannot tell
        for p in wide.added.parameters():
            p.add_(0.1)
    after = _same_old_channels(model, wide, (16, 16, 16))
    assert not torch.allclose(after[:, 2], torch.tensor(NEW_CHANNEL_BIAS))
    assert added_parameters(wide, 2) == ["added.0"]
    assert added_parameters(model, 2) is None  # nothing added: every weight trains
    rows = channel_rows(wide, range(3))
    assert [(name, row) for name, _, row in rows] == [("head", 0), ("head", 1),
                                                      ("added.0.head", 0)]
    # The global random state is the caller's: a run seeded before draws the same after.
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    add_output_channel(model, "nuclei", "object")
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=0)


def test_a_second_added_channel_gets_weights_of_its_own_too(tmp_path):
    model = _trained_like(UNet(dims=2, out_channels=2, depth=2, features=4))
    once = add_output_channel(model, "nuclei", "object")
    twice = add_output_channel(once, "golgi", "object")
    assert len(twice.added) == 2 and twice.init_kwargs["added_channels"] == 2
    assert output_channel_count(twice) == 4
    _same_old_channels(once, twice, (16, 16))
    # Trained from the first added channel on: both own blocks; from the second: its own.
    assert added_parameters(twice, 2) == ["added.0", "added.1"]
    assert added_parameters(twice, 3) == ["added.1"]
    # An output row alone is not offered once channels have their own weights.
    assert len(add_output_channel(once, "golgi", "object", own_weights=False).added) == 2
    # The second one copies the starting layers, not the first added channel's.
    with torch.no_grad():
        once.added[0].encoders[0][0].weight.add_(1.0)
    again = add_output_channel(once, "golgi", "object")
    torch.testing.assert_close(again.added[1].encoders[0][0].weight,
                               model.encoders[0][0].weight, rtol=0, atol=0)
    path = save_checkpoint(tmp_path / "two.pt", twice, {"channel_names": ["a", "b", "n", "g"]})
    assert torch.load(path, weights_only=True)["architecture"]["kwargs"]["added_channels"] == 2
    x = torch.randn(1, 1, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(load_checkpoint(path).model.eval()(x), twice.eval()(x),
                                   rtol=0, atol=0)


def test_an_output_row_alone_when_asked(dims=3):
    model = _trained_like(UNet(dims=dims, out_channels=2, depth=2, features=4))
    wide = add_output_channel(model, "nuclei", "object", own_weights=False)
    assert wide.head.out_channels == 3 and not len(wide.added)
    assert "added_channels" not in wide.init_kwargs
    assert added_parameters(wide, 2) is None  # a shared row: every weight trains
    _same_old_channels(model, wide, (16, 16, 16))


def test_a_checkpoint_with_an_own_channel_exports_a_package_that_passes(tmp_path):
    import bioimageio.core
    from bioimageio_helpers import tiny_checkpoint, volume

    from napari_finetune.bioimageio.export import export_bioimageio

    ckpt = load_checkpoint(tiny_checkpoint(tmp_path / "tiny.pt"))
    wide = add_output_channel(ckpt, "nuclei", "object")
    with torch.no_grad():
        for p in wide.model.added.parameters():  # a trained channel, not the zero row
            p.add_(0.1)
    path = save_checkpoint(tmp_path / "wide.pt", wide.model, wide.metadata)
    package = export_bioimageio(load_checkpoint(path), tmp_path / "wide.zip", volume(),
                                check=False)
    summary = bioimageio.core.test_model(package)
    assert summary.status == "passed", [d for d in summary.details if d.status == "failed"]
    back = load_checkpoint(package)
    assert back.channel_names[-1] == "nuclei" and len(back.model.added) == 1
