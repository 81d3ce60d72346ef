"""export_bioimageio and ``export --bioimageio``: packages that pass bioimageio.core test_model."""

from __future__ import annotations

import zipfile
from pathlib import Path

import bioimageio.core
import numpy as np
import pytest
import torch
from bioimageio.spec.utils import read_yaml
from bioimageio_helpers import (
    CHANNELS,
    block_network,
    edit_rdf,
    export_package,
    tiny_checkpoint,
    unpack,
    volume,
)

from napari_finetune.model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def _rdf(package: Path) -> dict:
    with zipfile.ZipFile(package) as archive:
        return read_yaml(archive.read("rdf.yaml").decode())


def _statuses(summary) -> dict[str, str]:
    """``{test name: status}`` of a test_model summary, which must have passed."""
    assert summary.status == "passed", [d for d in summary.details if d.status == "failed"]
    return {detail.name: detail.status for detail in summary.details}


def _test_model(package: Path) -> dict[str, str]:
    """``{test name: status}`` of bioimageio.core's test_model, which must pass."""
    return _statuses(bioimageio.core.test_model(package))


def _assert_both_weights_reproduce(statuses: dict[str, str]) -> None:
    reproduced = [name for name in statuses if name.startswith("Reproduce test outputs")]
    assert any("pytorch_state_dict" in n for n in reproduced)
    assert any("torchscript" in n for n in reproduced)


# One full test_model per kind of package: the percentile-normalised 3D package is the
# one ``export --bioimageio`` writes and tests (test_cli_export_writes_a_tested_package
# checks its summary the same way), the 2D one is test_two_dimensional_model's.
@pytest.mark.parametrize(
    "normalization", [{"method": "fixed", "low": 20.0, "high": 220.0}], ids=["fixed"]
)
def test_package_passes_test_model_offline(tmp_path, monkeypatch, normalization):
    attempts = block_network(monkeypatch)
    package = export_package(tmp_path, normalization=normalization)
    _assert_both_weights_reproduce(_test_model(package))
    assert attempts == []


def test_package_content_and_fields(tmp_path):
    image = volume((12, 40, 40))
    package = export_package(
        tmp_path,
        image=image,
        name="membranes v2",
        authors=["Ada Lovelace", "Alan Turing"],
        license="MIT",
        cite=[("Doe et al. 2026", "10.1234/abc.5"), ("Lab page", "https://example.org/lab")],
        tile_shape=(8, 16, 16),
    )
    rdf = _rdf(package)
    assert rdf["name"] == "membranes v2" and rdf["license"] == "MIT"
    assert [a["name"] for a in rdf["authors"]] == ["Ada Lovelace", "Alan Turing"]
    assert rdf["cite"] == [
        {"text": "Doe et al. 2026", "doi": "10.1234/abc.5"},
        {"text": "Lab page", "url": "https://example.org/lab"},
    ]
    assert set(rdf["weights"]) == {"pytorch_state_dict", "torchscript"}
    assert rdf["outputs"][0]["axes"][1]["channel_names"] == CHANNELS
    assert [p["id"] for p in rdf["outputs"][0]["postprocessing"]] == ["sigmoid", "ensure_dtype"]
    scale_range = rdf["inputs"][0]["preprocessing"][1]
    assert scale_range["id"] == "scale_range"
    assert scale_range["kwargs"]["min_percentile"] == 1.0
    with zipfile.ZipFile(package) as archive:
        readme = archive.read("README.md").decode()
        test_input = np.load(archive.open("input.npy"))
    assert "- steps: 3" in readme and "- painted_voxels: 1234" in readme
    # The test tensor is the centre of the user's volume, as stored (uint8).
    assert test_input.dtype == np.uint8
    np.testing.assert_array_equal(test_input[0, 0], image[2:10, 12:28, 12:28])


def test_a_package_whose_outputs_differ_fails_the_check_in_one_line(tmp_path):
    from napari_finetune.bioimageio.export import BioimageioExportError, check_package

    folder = unpack(export_package(tmp_path), tmp_path / "unpacked")
    expected = np.load(folder / "output.npy")
    np.save(folder / "output.npy", 1.0 - expected)  # not what the model predicts
    with pytest.raises(BioimageioExportError, match="Reproduce test outputs") as info:
        check_package(folder / "rdf.yaml")
    assert "\n" not in str(info.value)


def test_defaults_cite_the_unet_and_name_the_file(tmp_path):
    rdf = _rdf(export_package(tmp_path))
    assert rdf["name"] == "tiny (napari-finetune)" and rdf["license"] == "CC-BY-4.0"
    assert rdf["cite"][0]["doi"] == "10.1007/978-3-319-46723-8_49"
    assert len(rdf["authors"]) == 1


def test_imported_file_architecture_goes_back_into_a_new_package(tmp_path):
    from napari_finetune.bioimageio.export import export_bioimageio

    folder = unpack(export_package(tmp_path), tmp_path / "unpacked")
    (folder / "tiny_net.py").write_text(
        "from napari_finetune.model.unet import UNet\n\ndef build(**kw):\n    return UNet(**kw)\n"
    )

    def from_file(rdf):
        arch = rdf["weights"]["pytorch_state_dict"]["architecture"]
        arch.pop("import_from")
        arch.update(source="tiny_net.py", callable="build")
        rdf["cite"] = [{"text": "Their paper", "doi": "10.5555/their.1"}]

    edit_rdf(folder, from_file)
    trust = ["tiny_net.py:build"]
    ckpt = load_checkpoint(folder, trust=trust)
    # A fine-tuned .pt keeps the file in its metadata: it loads again, under the same trust.
    pt = save_checkpoint(tmp_path / "ft.pt", ckpt.model, ckpt.metadata, ckpt.architecture)
    with pytest.raises(CheckpointError, match="--trust-factory tiny_net.py:build"):
        load_checkpoint(pt)
    ckpt = load_checkpoint(pt, trust=trust)
    again = export_bioimageio(ckpt, tmp_path / "again.zip", volume(), check=False)
    rdf = _rdf(again)
    assert rdf["weights"]["pytorch_state_dict"]["architecture"]["source"] == "tiny_net.py"
    assert rdf["cite"] == [{"text": "Their paper", "doi": "10.5555/their.1"}]  # carried on
    reloaded = load_checkpoint(again, trust=trust)
    x = torch.rand(1, 1, 8, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(reloaded.model(x), ckpt.model(x), rtol=0, atol=0)


def test_a_running_finetuner_exports_its_current_weights(tmp_path):
    from napari_finetune.bioimageio.export import export_bioimageio
    from napari_finetune.config import FinetuneConfig
    from napari_finetune.model.unet import UNet
    from napari_finetune.trainer.loop import Finetuner

    image = volume((8, 24, 24))
    corrections = np.zeros(image.shape, np.uint8)
    corrections[2:6, 4:10, 4:10] = 1
    corrections[2:6, 14:20, 14:20] = 2
    config = FinetuneConfig(
        steps=2, batch_size=2, patch_shape=(4, 8, 8), mode="full", mixed_precision=False,
        device="cpu", seed=0,
    )
    trainer = Finetuner(
        UNet(dims=3, depth=1, features=4, out_channels=2), image, corrections, config,
        metadata={"channel_names": CHANNELS},
    )
    for _ in trainer.run():
        pass
    package = export_bioimageio(trainer, tmp_path / "run.zip", image, check=False)
    with zipfile.ZipFile(package) as archive:
        readme = archive.read("README.md").decode()
    assert "- steps_done: 2" in readme and "- final_dtype: float32" in readme
    x = torch.rand(1, 1, 8, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(
            load_checkpoint(package).model(x), trainer.model.eval()(x), rtol=0, atol=1e-6
        )


def test_two_dimensional_model(tmp_path):
    from napari_finetune.bioimageio.export import export_bioimageio

    ckpt = tiny_checkpoint(tmp_path / "flat.pt", dims=2)
    package = export_bioimageio(ckpt, tmp_path / "flat.zip", volume((40, 48)), check=False)
    assert [a["id"] for a in _rdf(package)["inputs"][0]["axes"][2:]] == ["y", "x"]
    assert load_checkpoint(package).model.dims == 2
    _test_model(package)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"out": "model.bioimageio"}, "is a .zip"),
        ({"image": np.zeros((1, 40, 40), np.uint8)}, "smaller than the model's multiple"),
        ({"image": np.zeros((40, 40), np.uint8)}, "the model is 3D"),
        ({"name": "bad/name"}, "remove '/'"),
        ({"normalization": {"method": "percentile", "low": 0.1, "high": 0.9}}, "scale_range"),
        ({"image": np.full((12, 40, 40), np.nan, np.float32)}, "NaN/inf voxels"),
    ],
)
def test_bad_input_is_one_line(tmp_path, kwargs, expected):
    from napari_finetune.bioimageio.export import export_bioimageio

    normalization = kwargs.pop("normalization", None)
    ckpt = tiny_checkpoint(tmp_path / "m.pt", normalization)
    out = tmp_path / kwargs.pop("out", "m.zip")
    image = kwargs.pop("image", volume())
    with pytest.raises(ValueError) as info:
        export_bioimageio(ckpt, out, image, check=False, **kwargs)
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert not out.exists()


def test_cli_export_writes_a_tested_package(tmp_path, capsys, monkeypatch):
    from napari_finetune.cli import main
    from test_cli import make_store

    attempts = block_network(monkeypatch)
    # The export's own check runs bioimageio.core's test_model, unchanged; its summary is
    # kept to check (offline, a percentile-normalised package) which weights it tested.
    summaries = []
    real_test_model = bioimageio.core.test_model

    def test_model_kept(*args, **kwargs):
        summaries.append(real_test_model(*args, **kwargs))
        return summaries[-1]

    monkeypatch.setattr(bioimageio.core, "test_model", test_model_kept)
    store = make_store(tmp_path / "vol.zarr", shape=(12, 32, 32))
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    out = tmp_path / "m.zip"
    code = main([
        "export", str(ckpt), "--bioimageio", str(out), "--volume", str(store),
        "--author", "Ada Lovelace", "--license", "MIT", "--cite", "Doe et al.=10.1234/x.1",
        "--channel-names", "membrane", "mito",
    ])
    printed = capsys.readouterr().out
    assert code == 0 and "test_model: passed" in printed
    assert len(summaries) == 1
    _assert_both_weights_reproduce(_statuses(summaries[0]))
    scale_range = _rdf(out)["inputs"][0]["preprocessing"][1]
    assert scale_range["id"] == "scale_range" and "min_percentile" in scale_range["kwargs"]
    rdf = _rdf(out)
    assert rdf["outputs"][0]["axes"][1]["channel_names"] == ["membrane", "mito"]
    assert rdf["cite"] == [{"text": "Doe et al.", "doi": "10.1234/x.1"}]
    assert load_checkpoint(out).channel_names == ["membrane", "mito"]
    assert attempts == []


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ([], "--bioimageio needs --volume"),
        (["--volume", "VOL", "--cite", "no reference"], "expected TEXT=DOI_OR_URL"),
        (["--volume", "VOL", "--license", "not-a-licence"], "license"),
    ],
)
def test_cli_export_errors_are_one_line(tmp_path, capsys, extra, expected):
    from napari_finetune.cli import main
    from test_cli import assert_one_line_error, make_store

    store = make_store(tmp_path / "vol.zarr", shape=(12, 32, 32))
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    argv = ["export", str(ckpt), "--bioimageio", str(tmp_path / "m.zip"), "--no-check"]
    code = main(argv + [str(store) if a == "VOL" else a for a in extra])
    err = capsys.readouterr().err
    assert_one_line_error(code, err)
    assert expected in err


@pytest.mark.slow
def test_sample_model_on_the_sample_store_round_trip(tmp_path, monkeypatch):
    """The shipped model, test tensors from the sample store: test_model, reload, same output."""
    from napari_finetune.bioimageio.export import export_bioimageio
    from napari_finetune.samples.store import ensure_sample
    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    attempts = block_network(monkeypatch)
    store = ensure_sample("target", (32, 96, 96))
    package = export_bioimageio(sample_checkpoint_path(), tmp_path / "sample.zip", store)
    original, reloaded = load_checkpoint(sample_checkpoint_path()), load_checkpoint(package)
    x = torch.rand(1, 1, 16, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(reloaded.model(x), original.model(x), rtol=0, atol=0)
    assert reloaded.channel_names == original.channel_names
    assert reloaded.normalization == original.normalization
    assert attempts == []


def test_object_roles_survive_a_run_the_package_and_the_reload(tmp_path):
    """Channel roles (objects from probabilities) live in the metadata and go everywhere it goes."""
    from engine_setup_bioimageio import finetune_briefly

    from napari_finetune.bioimageio.export import export_bioimageio
    from napari_finetune.objects.roles import ChannelRole, roles_from_metadata, roles_to_metadata

    roles = {"membrane": ChannelRole("boundary", threshold=0.45, min_size=50, seed_distance=6.0),
             "mitochondria": ChannelRole("object", threshold=0.35, min_size=20)}
    ckpt = load_checkpoint(tiny_checkpoint(tmp_path / "tiny.pt"))
    with_roles = save_checkpoint(tmp_path / "roles.pt", ckpt.model,
                                 roles_to_metadata(roles, ckpt.metadata))
    tuned = finetune_briefly(load_checkpoint(with_roles), volume(), tmp_path / "tuned.pt")
    package = export_bioimageio(load_checkpoint(tuned), tmp_path / "roles.zip", volume(),
                                check=False)
    for path in (with_roles, tuned, package):
        loaded = load_checkpoint(path)
        assert roles_from_metadata(loaded.metadata, CHANNELS) == roles, path


def test_an_array_volume_gives_the_package_the_voxel_size_trained_at(tmp_path):
    from napari_finetune.bioimageio.export import export_bioimageio

    ckpt = load_checkpoint(tiny_checkpoint(tmp_path / "m.pt"))
    trained = save_checkpoint(tmp_path / "trained.pt", ckpt.model, {
        **ckpt.metadata, "run": {"config": {"voxel_size": [40.0, 8.0, 8.0]}}})
    package = export_bioimageio(trained, tmp_path / "aniso.zip", volume(), check=False)
    axes = _rdf(package)["inputs"][0]["axes"][2:]
    assert [a.get("scale") for a in axes] == [40.0, 8.0, 8.0]
