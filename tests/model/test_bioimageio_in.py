"""The loader opens bioimage.io model packages (zip, folder, rdf.yaml), offline and safely."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from bioimageio_helpers import (
    CHANNELS,
    RUN,
    block_network,
    edit_rdf,
    export_package,
    tiny_checkpoint,
    unpack,
)

from napari_finetune.bioimageio import is_bioimageio_package
from napari_finetune.loading import load_checkpoint
from napari_finetune.model.checkpoint import CheckpointError


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """One exported package of the tiny checkpoint, shared (tests copy it before editing)."""
    return export_package(tmp_path_factory.mktemp("pkg"))


@pytest.fixture
def folder(package, tmp_path) -> Path:
    return unpack(package, tmp_path / "unpacked")


def _same_predictions(a: torch.nn.Module, b: torch.nn.Module, dims: int = 3) -> None:
    x = torch.rand((1, 1) + (8,) * dims)
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)


def test_zip_folder_and_yaml_all_load_with_metadata(package, folder, tmp_path, monkeypatch):
    attempts = block_network(monkeypatch)
    original = load_checkpoint(tiny_checkpoint(tmp_path / "again.pt"))
    for source in (package, folder, folder / "rdf.yaml"):
        ckpt = load_checkpoint(source)
        assert ckpt.channel_names == CHANNELS
        assert ckpt.normalization == {"method": "percentile", "low": 1.0, "high": 99.0}
        assert ckpt.architecture == original.architecture
        assert ckpt.metadata["run"] == RUN  # napari-finetune's own record comes back
        assert ckpt.metadata["bioimageio"]["cite"][0]["doi"].startswith("10.1007/")
        assert not ckpt.model.training and len(ckpt.sha256) == 64
        _same_predictions(ckpt.model, original.model)
    assert attempts == []


def test_a_checkpoint_zip_is_not_taken_for_a_package(tmp_path, package):
    pt = tiny_checkpoint(tmp_path / "m.pt")  # torch.save writes a zip too
    assert not is_bioimageio_package(pt)
    assert not is_bioimageio_package(tmp_path)  # a folder without a description
    assert is_bioimageio_package(package)


def test_library_architecture_off_the_allow_list_is_refused(folder, tmp_path):
    marker = tmp_path / "ran"

    def hostile(rdf):
        arch = rdf["weights"]["pytorch_state_dict"]["architecture"]
        touch = {"args": ["touch", str(marker)]}
        arch.update(import_from="subprocess", callable="run", kwargs=touch)

    edit_rdf(folder, hostile)
    with pytest.raises(CheckpointError, match="--trust-factory subprocess:run"):
        load_checkpoint(folder)
    assert not marker.exists()


ARCH_FILE = """
from pathlib import Path
from napari_finetune.model.unet import UNet

Path(MARKER).write_text("imported")


def build(**kwargs):
    return UNet(**kwargs)
"""


def _file_architecture(folder: Path, marker: Path) -> Path:
    (folder / "tiny_net.py").write_text(ARCH_FILE.replace("MARKER", repr(str(marker))))

    def from_file(rdf):
        arch = rdf["weights"]["pytorch_state_dict"]["architecture"]
        arch.pop("import_from")
        arch.update(source="tiny_net.py", callable="build")

    return edit_rdf(folder, from_file)


def test_architecture_file_runs_only_when_trusted(folder, package, tmp_path):
    marker = tmp_path / "imported"
    _file_architecture(folder, marker)
    with pytest.raises(CheckpointError, match=r"--trust-factory tiny_net\.py:build") as info:
        load_checkpoint(folder)
    assert "\n" not in str(info.value)
    assert not marker.exists()  # refused before the file was read as code
    ckpt = load_checkpoint(folder, trust=["tiny_net.py:build"])
    assert marker.read_text() == "imported"
    assert ckpt.architecture["factory"] == "tiny_net.py:build"
    _same_predictions(ckpt.model, load_checkpoint(package).model)


@pytest.mark.parametrize("from_file", [False, True], ids=["library", "package file"])
def test_a_package_is_read_whole_before_its_model_is_built(folder, tmp_path, monkeypatch,
                                                           from_file):
    """The model floor comes last: the description, the trust check, the architecture file,
    the provenance and the weights' bytes are all read, then the model is built once."""
    import napari_finetune.bioimageio.architecture as architecture
    import napari_finetune.bioimageio.load as load

    if from_file:
        _file_architecture(folder, tmp_path / "imported")
    calls: list[str] = []

    def spy(module, name: str) -> None:
        real = getattr(module, name)

        def recorded(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)

    for name in ("read_package_file", "build_package_model", "source_record"):
        spy(architecture, name)
    spy(load, "_provenance")
    ckpt = load_checkpoint(folder, trust=["tiny_net.py:build"])
    read = ["source_record", "read_package_file"] if from_file else []
    assert calls == [*read, "_provenance", "read_package_file", "build_package_model"]
    assert ("architecture_file" in ckpt.metadata["bioimageio"]) is from_file


def _edited(folder: Path, change) -> str:
    edit_rdf(folder, change)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(folder)
    message = str(info.value)
    assert "\n" not in message
    return message


def _pre(rdf) -> list:
    return rdf["inputs"][0]["preprocessing"]


def test_fixed_preprocessing_becomes_a_fixed_range(folder):
    def zero_mean(rdf):
        _pre(rdf)[1] = {"id": "fixed_zero_mean_unit_variance", "kwargs": {"mean": 100, "std": 20}}

    edit_rdf(folder, zero_mean)
    assert load_checkpoint(folder).normalization == {"method": "fixed", "low": 100.0, "high": 120.0}

    def linear(rdf):
        _pre(rdf)[1] = {"id": "scale_linear", "kwargs": {"gain": 0.005, "offset": -0.05}}

    edit_rdf(folder, linear)
    assert load_checkpoint(folder).normalization == {"method": "fixed", "low": 10.0, "high": 210.0}

    def nothing(rdf):
        del _pre(rdf)[1]

    edit_rdf(folder, nothing)
    assert load_checkpoint(folder).normalization == {"method": "fixed", "low": 0.0, "high": 1.0}


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        ({"id": "zero_mean_unit_variance"}, "zero_mean_unit_variance"),
        ({"id": "clip", "kwargs": {"min": 0.0, "max": 1.0}}, "clip"),
        ({"id": "scale_linear", "kwargs": {"gain": -1.0}}, "positive gain"),
    ],
)
def test_unsupported_preprocessing_is_one_line(folder, step, expected):
    def change(rdf):
        _pre(rdf)[1] = step

    message = _edited(folder, change)
    assert expected in message and "normalisation" in message


def test_output_without_sigmoid_is_refused(folder):
    def softmax(rdf):
        rdf["outputs"][0]["postprocessing"] = [{"id": "softmax", "kwargs": {"axis": "channel"}}]

    assert "not a sigmoid first" in _edited(folder, softmax)


def test_only_torchscript_weights_are_refused(folder):
    def drop(rdf):
        del rdf["weights"]["pytorch_state_dict"]
        del rdf["weights"]["torchscript"]["parent"]

    assert "no pytorch_state_dict weights (it has torchscript)" in _edited(folder, drop)


def test_weights_at_a_url_are_not_downloaded(folder, monkeypatch):
    attempts = block_network(monkeypatch)

    def remote(rdf):
        rdf["weights"]["pytorch_state_dict"]["source"] = "https://example.org/weights.pt"

    assert "does not download" in _edited(folder, remote)
    assert attempts == []


def test_channels_last_input_is_refused(folder):
    def channels_last(rdf):
        axes = rdf["inputs"][0]["axes"]
        axes.append(axes.pop(1))

    assert "input axes are bzyxc" in _edited(folder, channels_last)


def test_corrupt_package_is_one_line(tmp_path, package):
    import zipfile

    broken = tmp_path / "broken.zip"
    shutil.copy(package, broken)
    with zipfile.ZipFile(broken) as archive:
        entry = archive.getinfo("weights.pt")
    data = bytearray(broken.read_bytes())
    middle = entry.header_offset + 100 + entry.compress_size // 2
    data[middle : middle + 256] = bytes(256)  # inside the weights: the CRC no longer matches
    broken.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(broken)
    assert "\n" not in str(info.value)


RDF_V04 = """
format_version: 0.4.10
type: model
name: tiny v04 model
description: a format 0.4 package, as most of the zoo's models still are
authors: [{name: Ada Lovelace}]
cite: [{text: U-Net, doi: 10.1007/978-3-319-24574-4_28}]
license: MIT
documentation: README.md
timestamp: "2024-01-01T00:00:00"
inputs:
  - name: raw
    axes: bczyx
    data_type: uint8
    shape: {min: [1, 1, 2, 2, 2], step: [0, 0, 2, 2, 2]}
    preprocessing:
      - name: scale_range
        kwargs: {mode: per_sample, axes: zyx, min_percentile: 2, max_percentile: 98}
outputs:
  - name: probs
    axes: bczyx
    data_type: float32
    shape: {reference_tensor: raw, scale: [1, 0, 1, 1, 1], offset: [0, 1, 0, 0, 0]}
    postprocessing: [{name: sigmoid}]
test_inputs: [input.npy]
test_outputs: [output.npy]
weights:
  pytorch_state_dict:
    source: weights.pt
    architecture: napari_finetune.model.unet.UNet
    kwargs: {dims: 3, in_channels: 1, out_channels: 2, depth: 1, features: 4, norm: group}
"""


def test_format_0_4_package_is_converted(folder, package):
    (folder / "rdf.yaml").write_text(RDF_V04)
    ckpt = load_checkpoint(folder)
    assert ckpt.normalization == {"method": "percentile", "low": 2.0, "high": 98.0}
    assert ckpt.channel_names == ["channel0", "channel1"]  # 0.4 has no channel names
    assert ckpt.metadata["bioimageio"]["authors"] == ["Ada Lovelace"]
    _same_predictions(ckpt.model, load_checkpoint(package).model)


def test_cli_info_reads_a_package(package, capsys):
    from napari_finetune.cli import main

    assert main(["info", str(package)]) == 0
    out = capsys.readouterr().out
    assert "membrane (boundary), mitochondria (object)" in out and "steps: 3" in out


def test_missing_folder_is_still_not_found(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nowhere")


def test_blockwise_predictions_match_through_a_package(package):
    from napari_finetune.config import PredictConfig
    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.predict import predict_volume

    image = np.random.default_rng(2).integers(0, 255, (8, 24, 24)).astype(np.uint8)
    config = PredictConfig(block_shape=(8, 12, 12), halo=(2, 4, 4), device="cpu")
    results = []
    for source in (package, package.parent / "tiny.pt"):
        ckpt = load_checkpoint(source)
        span = intensity_range(image, ckpt.normalization)
        results.append(predict_volume(ckpt.model, image, span, config))
    np.testing.assert_allclose(results[0], results[1], atol=1e-6)


def test_without_bioimageio_installed_the_cli_says_what_to_install(package):
    """A real process in which bioimageio cannot be imported (as where the extra is missing)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['bioimageio'] = None\n"
        "from napari_finetune.cli import main\n"
        f"sys.exit(main(['info', {str(package)!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'napari-finetune[bioimageio]'" in lines[0]


def test_the_public_path_opens_a_package_with_nothing_else_imported(package):
    # The documented call of outside checks, in a fresh interpreter: the caller imports
    # model.checkpoint alone, and a package path still reaches the bioimage.io reader.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from napari_finetune.model.checkpoint import load_checkpoint\n"
        f"ckpt = load_checkpoint({str(package)!r})\n"
        f"assert ckpt.channel_names == {CHANNELS!r}, ckpt.channel_names\n"
        "assert 'bioimageio' in ckpt.metadata\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
