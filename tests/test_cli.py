"""The command line end to end on tiny real stores and checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from napari_finetune.cli import main
from napari_finetune.model.checkpoint import load_checkpoint, save_checkpoint
from napari_finetune.model.unet import UNet

CHANNELS = ["membrane", "mitochondria"]


def make_store(path: Path, shape=(16, 40, 40)) -> Path:
    """A real NGFF 0.5 store with a uint8 image (through ome-zarr-py)."""
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    rng = np.random.default_rng(0)
    image = (rng.random(shape) * 200 + 20).astype(np.uint8)
    group = zarr.group(store=parse_url(str(path), mode="w").store)
    write_image(image, group, axes="zyx", scaler=None)
    return path


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, expected=1):
    assert code == expected
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "error" in lines[0]


@pytest.mark.serial  # a bound on the start-up time
def test_help_is_fast_and_imports_no_torch():
    code = (
        "import sys, time; t = time.perf_counter(); from napari_finetune.cli import main; "
        "rc = main(['--help']); "
        "assert rc == 0; assert 'torch' not in sys.modules and 'peft' not in sys.modules; "
        "print(time.perf_counter() - t)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert float(result.stdout.strip().splitlines()[-1]) < 2.0


@pytest.mark.parametrize("command", ["demo", "train", "predict", "export", "info"])
def test_every_command_has_help(capsys, command):
    code, out, _ = run_cli(capsys, command, "--help")
    assert code == 0 and out.startswith("usage: napari-finetune " + command)


def test_bad_usage_exits_2(capsys):
    code, _, err = run_cli(capsys, "predict")
    assert code == 2 and "required" in err
    code, _, err = run_cli(
        capsys, "train", "x.zarr", "--checkpoint", "m.pt", "--out", "o.pt", "--mode", "bogus"
    )
    assert code == 2 and "invalid choice" in err


def test_info(capsys, checkpoint):
    code, out, _ = run_cli(capsys, "info", checkpoint)
    assert code == 0
    assert "membrane (boundary), mitochondria (object)" in out and "UNet" in out


def test_info_missing_and_corrupt_are_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "info", tmp_path / "nope.pt")
    assert_one_line_error(code, err)
    assert "not found" in err
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    code, _, err = run_cli(capsys, "info", bad)
    assert_one_line_error(code, err)


def test_predict_writes_labels(capsys, store, checkpoint):
    from napari_finetune.data.normalization import intensity_range
    from napari_finetune.io.omezarr import load_corrections, open_volume
    from napari_finetune.predict import predict_block

    code, out, err = run_cli(
        capsys,
        "predict",
        checkpoint,
        store,
        "--block-shape",
        "8",
        "16",
        "16",
        "--halo",
        "8",
        "8",
        "8",
        "--device",
        "cpu",
        "--quiet",
    )
    assert code == 0, err
    assert "prediction-membrane" in out and "prediction-mitochondria" in out
    volume = open_volume(store)
    assert {"prediction-membrane", "prediction-mitochondria"} <= set(volume.label_names)
    ckpt = load_checkpoint(checkpoint)
    image = np.asarray(volume.data)
    low, high = intensity_range(image, ckpt.normalization)
    # GroupNorm: blocks see different statistics than one call, so compare loosely.
    reference = predict_block(ckpt.model, (image - low) / (high - low)) > 0.5
    for c, name in enumerate(CHANNELS):
        written = load_corrections(store, f"prediction-{name}")
        assert written.shape == image.shape and set(np.unique(written)) <= {0, 1}
        assert (written == reference[c]).mean() > 0.95


def test_predict_errors_are_one_line(capsys, tmp_path, checkpoint, store):
    code, _, err = run_cli(capsys, "predict", checkpoint, tmp_path / "missing.zarr")
    assert_one_line_error(code, err)
    code, _, err = run_cli(
        capsys, "predict", checkpoint, store, "--block-shape", "8", "8", "--halo", "1", "1", "1"
    )
    assert_one_line_error(code, err)
    assert "same number of axes" in err


def test_export_from_factory_and_torchscript(capsys, tmp_path):
    model = UNet(dims=2, depth=1, features=4, out_channels=2).eval()
    weights = tmp_path / "weights.pt"
    torch.save(model.state_dict(), weights)
    out = tmp_path / "wrapped.pt"
    code, stdout, err = run_cli(
        capsys,
        "export",
        weights,
        "--factory",
        "napari_finetune.model.unet:UNet",
        "--kwargs",
        json.dumps({"dims": 2, "depth": 1, "features": 4, "out_channels": 2}),
        "--channel-names",
        "a",
        "b",
        "--out",
        out,
        "--torchscript",
    )
    assert code == 0, err
    ckpt = load_checkpoint(out)
    assert ckpt.channel_names == ["a", "b"]
    x = torch.rand(1, 1, 20, 24)
    scripted = torch.jit.load(str(out.with_suffix(".torchscript.pt")))
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x))
        torch.testing.assert_close(ckpt.model(x), model(x))


def test_export_resave_with_new_normalization(capsys, tmp_path, checkpoint):
    out = tmp_path / "copy.pt"
    code, _, err = run_cli(
        capsys,
        "export",
        checkpoint,
        "--out",
        out,
        "--normalization",
        '{"method": "fixed", "low": 0, "high": 255}',
    )
    assert code == 0, err
    ckpt = load_checkpoint(out)
    assert ckpt.normalization == {"method": "fixed", "low": 0, "high": 255}
    assert ckpt.channel_names == CHANNELS


def test_export_errors_are_one_line(capsys, tmp_path, checkpoint):
    code, _, err = run_cli(
        capsys, "export", checkpoint, "--out", tmp_path / "o.pt", "--normalization", "{oops"
    )
    assert_one_line_error(code, err)
    assert "JSON" in err
    code, _, err = run_cli(capsys, "export", checkpoint)
    assert_one_line_error(code, err)
    code, _, err = run_cli(capsys, "export", tmp_path / "none.pt", "--torchscript")
    assert_one_line_error(code, err)
    weights = tmp_path / "w.pt"
    torch.save(UNet(dims=2, depth=1, features=4).state_dict(), weights)
    code, _, err = run_cli(
        capsys, "export", weights, "--factory", "no_such_pkg:Net", "--out", tmp_path / "o.pt"
    )
    assert_one_line_error(code, err)
    assert "no_such_pkg" in err


TRAIN_FAST = ["--patch-shape", "8", "16", "16", "--batch-size", "2", "--device", "cpu", "-q"]


def test_train_exports_a_checkpoint_with_the_run(capsys, tmp_path, painted_store, checkpoint):
    out = tmp_path / "tuned.pt"
    code, stdout, err = run_cli(
        capsys,
        "train",
        painted_store,
        "-c",
        checkpoint,
        "-o",
        out,
        "--steps",
        "2",
        "--no-hold-other-channels",
        *TRAIN_FAST,
    )
    assert code == 0, err
    assert "[probe 0/2] fp32 (mixed precision off)" in stdout
    assert "batch 2 x accumulation 1" in stdout and "hold on the other channels off" in stdout
    assert not any(word in stdout for word in ("dtype=", "True", "False"))
    assert "finished after 2/2 steps" in stdout
    run = load_checkpoint(out).metadata["run"]
    assert run["steps_done"] == 2 and run["painted_voxels"] == 200
    assert run["config"]["hold_other_channels"] is False


def test_train_errors_are_one_line(capsys, tmp_path, store, painted_store, checkpoint):
    out = tmp_path / "tuned.pt"
    code, _, err = run_cli(
        capsys, "train", store, "-c", checkpoint, "-o", out, "--corrections", "nope", *TRAIN_FAST
    )
    assert_one_line_error(code, err)
    code, _, err = run_cli(
        capsys,
        "train",
        store,
        "-c",
        checkpoint,
        "-o",
        tmp_path / "no" / "dir" / "o.pt",
        *TRAIN_FAST,
    )
    assert_one_line_error(code, err)
    code, _, err = run_cli(
        capsys, "train", store, "-c", checkpoint, "-o", out, "--learning-rate", "-1", *TRAIN_FAST
    )
    assert_one_line_error(code, err)
    assert "learning_rate" in err
    assert not out.exists()


def test_train_nothing_painted_is_one_line(capsys, tmp_path, store, checkpoint):
    from napari_finetune.io.omezarr import save_corrections

    save_corrections(store, np.zeros((16, 40, 40), np.uint8))
    code, _, err = run_cli(
        capsys, "train", store, "-c", checkpoint, "-o", tmp_path / "o.pt", *TRAIN_FAST
    )
    assert_one_line_error(code, err)
    assert "nothing is painted" in err


def test_simulated_painting_respects_budget_slices_and_truth():
    from napari_finetune.cli.simulate import (
        prediction_errors,
        simulate_corrections,
        split_slices,
    )

    rng = np.random.default_rng(0)
    truth = rng.integers(0, 3, (12, 30, 30)).astype(np.uint8)
    probs = rng.random((2, 12, 30, 30)).astype(np.float32)
    painted_z, held_out = split_slices(12)
    assert max(painted_z) < held_out.start == 6
    corr = simulate_corrections(truth, probs, painted_z, 0.01, seed=3)
    assert (corr > 0).sum() <= 0.01 * truth.size and (corr > 0).sum() > 0.009 * truth.size
    mask = corr > 0
    assert (corr[mask] == truth[mask] + 1).all()
    assert not mask[[z for z in range(12) if z not in painted_z]].any()
    # Most strokes land on the model's errors.
    assert prediction_errors(probs, truth)[mask].mean() > 0.5
    np.testing.assert_array_equal(corr, simulate_corrections(truth, probs, painted_z, 0.01, 3))


def test_demo_quick(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("NAPARI_FINETUNE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    code, stdout, err = run_cli(capsys, "demo", "--quick", "--out", out, "--steps", "2", "-q")
    assert code == 0, err
    assert "[probe 0/2] fp32 (mixed precision off)" in stdout
    assert "foreground IoU on held-out" in stdout
    results = json.loads((out / "results.json").read_text())
    assert 0 < results["painted_fraction"] <= 0.01 and results["steps"] == 2
    assert len(results["iou_before"]) == len(results["iou_after"]) == 2
    assert (out / "before_after.png").stat().st_size > 10_000
    tuned = load_checkpoint(out / "finetuned.pt")
    assert tuned.metadata["run"]["painted_voxels"] == results["painted_voxels"]
    # The objects rows: cells against the store's cell truth, mitochondria against the
    # visible blobs, before and after, with their counts.
    assert "objects on held-out slices" in stdout
    rows = {r["channel"]: r for r in results["objects"]}
    assert rows["membrane"]["measure"] == "adapted Rand error"
    assert rows["mitochondria"]["measure"] == "F1 (IoU > 0.5)"
    for row in rows.values():
        assert 0 <= row["before"] <= 1 and 0 <= row["after"] <= 1 and row["true"] > 0
        counts = (row["before_count"], row["after_count"], row["true"])
        assert all(type(n) is int for n in counts), row
        # The table printed the same counts the results keep: "objects before/after/true".
        line = next(x for x in stdout.splitlines() if x.startswith(row["channel"])
                    and row["measure"] in x)
        assert line.endswith("   {}/{}/{}".format(*counts)), (line, row)
        # The sample shows objects, and both models find some.
        assert min(counts) > 0, row
    # A second volume nobody painted: masks and objects of both models, and its figure.
    second = results["second_volume"]
    assert "second volume, never painted" in stdout
    assert second["channels"] == ["membrane", "mitochondria"]
    for when in ("before", "after"):
        cells = second[when]["objects"]["membrane"]
        assert 0 <= cells["adapted_rand_error"] <= 1 and cells["voi_merge"] >= 0
        assert cells["n_true"] > 0 and 0 <= second[when]["objects"]["mitochondria"]["f1"] <= 1
    # "before" is the pretrained model (the run trains the sample checkpoint's model in
    # place: scoring it again after the run gave the tuned model's figures twice).
    assert second["before"]["iou"] != second["after"]["iou"]
    assert Path(second["figure"]).stat().st_size > 10_000
    # F1 = 2 matches / (found + true): each score is a whole number of matches of its counts.
    mito = rows["mitochondria"]
    for when in ("before", "after"):
        matches = mito[when] * (mito[f"{when}_count"] + mito["true"]) / 2
        assert abs(matches - round(matches)) < 0.02, mito
        assert round(matches) <= min(mito[f"{when}_count"], mito["true"]), mito


def test_2d_train_and_predict(capsys, tmp_path):
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    from napari_finetune.io.omezarr import load_corrections, save_corrections

    store = tmp_path / "plane.zarr"
    image = (np.random.default_rng(0).random((60, 70)) * 255).astype(np.uint8)
    write_image(
        image, zarr.group(store=parse_url(str(store), mode="w").store), axes="yx", scaler=None
    )
    corrections = np.zeros(image.shape, np.uint8)
    corrections[5:15, 5:15] = 1
    corrections[30:40, 30:40] = 2
    save_corrections(store, corrections)
    model = UNet(dims=2, depth=2, features=4, out_channels=1)
    ckpt = save_checkpoint(tmp_path / "m2d.pt", model, {"channel_names": ["cells"]})
    out = tmp_path / "t2d.pt"
    # No --patch-shape: a 2D volume gets a 2D default patch.
    code, _, err = run_cli(
        capsys,
        "train",
        store,
        "-c",
        ckpt,
        "-o",
        out,
        "--steps",
        "1",
        "--mode",
        "full",
        "--device",
        "cpu",
        "-q",
    )
    assert code == 0, err
    # The default patch fitted to the 60x70 image and the UNet's multiple of 4, as the widget does.
    run_config = load_checkpoint(out).metadata["run"]["config"]
    assert run_config["patch_shape"] == [60, 68]
    code, _, err = run_cli(capsys, "predict", out, store, "--name", "p", "-q")
    assert code == 0, err
    assert load_corrections(store, "p-cells").shape == (60, 70)


def make_scaled_store(path: Path, shape, scale: dict[str, float] | None) -> Path:
    """A real NGFF 0.5 store whose scale (nm) ome-zarr-py writes, or none, with corrections."""
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    from napari_finetune.io.omezarr import save_corrections

    rng = np.random.default_rng(0)
    image = (rng.random(shape) * 200 + 20).astype(np.uint8)
    group = zarr.group(store=parse_url(str(path), mode="w").store)
    units = {axis: "nanometer" for axis in "zyx"} if scale else None
    write_image(image, group, axes="zyx", scale_factors=[], scale=scale, axes_units=units)
    corrections = np.zeros(shape, np.uint8)
    corrections[4, 5:15, 5:15] = 1
    corrections[6, 20:25, 20:30] = 2
    save_corrections(path, corrections)
    return path


ONE_STEP = ["--steps", "1", "--batch-size", "1", "--device", "cpu", "-q",
            "--validation-fraction", "0"]


def test_train_on_anisotropic_voxels_takes_an_isotropic_patch_and_records_it(
        capsys, tmp_path, checkpoint):
    aniso = make_scaled_store(tmp_path / "sstem.zarr", (32, 128, 128),
                              {"z": 40.0, "y": 8.0, "x": 8.0})
    out = tmp_path / "tuned.pt"
    code, _, err = run_cli(capsys, "train", aniso, "-c", checkpoint, "-o", out, *ONE_STEP)
    assert code == 0, err
    metadata = load_checkpoint(out).metadata
    # 16 x 88 x 88 voxels = 640 x 704 x 704 nm, multiples of the depth-2 UNet's 4.
    assert metadata["run"]["config"]["patch_shape"] == [16, 88, 88]
    assert metadata["run"]["config"]["voxel_size"] == [40.0, 8.0, 8.0]

    # The same volume without a scale: today's patch, no voxel size recorded.
    plain = make_scaled_store(tmp_path / "plain.zarr", (32, 128, 128), None)
    out_plain = tmp_path / "plain.pt"
    code, _, err = run_cli(capsys, "train", plain, "-c", checkpoint, "-o", out_plain, *ONE_STEP)
    assert code == 0, err
    run = load_checkpoint(out_plain).metadata["run"]
    assert run["config"]["patch_shape"] == [32, 64, 64] and run["config"]["voxel_size"] is None

    # --voxel-size for a store without a scale.
    out_given = tmp_path / "given.pt"
    code, _, err = run_cli(capsys, "train", plain, "-c", checkpoint, "-o", out_given,
                           "--voxel-size", "40,8,8", *ONE_STEP)
    assert code == 0, err
    run = load_checkpoint(out_given).metadata["run"]
    assert run["config"]["voxel_size"] == [40.0, 8.0, 8.0]
    assert run["config"]["patch_shape"] == [16, 88, 88]


def test_predict_at_another_voxel_size_says_so_in_one_line(capsys, tmp_path, checkpoint):
    trained = tmp_path / "trained.pt"
    ckpt = load_checkpoint(checkpoint)
    save_checkpoint(trained, ckpt.model, {**ckpt.metadata,
                                          "run": {"config": {"voxel_size": [40, 8, 8]}}})
    same = make_scaled_store(tmp_path / "same.zarr", (8, 32, 32), {"z": 40.0, "y": 8.0, "x": 8.0})
    finer = make_scaled_store(tmp_path / "finer.zarr", (8, 32, 32), {"z": 40.0, "y": 4.0, "x": 4.0})
    code, _, err = run_cli(capsys, "predict", trained, same, "--device", "cpu", "-q")
    assert code == 0, err
    assert "warning" not in err
    code, out, err = run_cli(capsys, "predict", trained, finer, "--device", "cpu", "-q")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "voxel size" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning:")
    assert "40 x 8 x 8" in warnings[0] and "40 x 4 x 4" in warnings[0]
    assert "wrote" in out  # a warning, not an error
    # --voxel-size says the volume's voxel size where its scale does not.
    plain = make_scaled_store(tmp_path / "plain.zarr", (8, 32, 32), None)
    code, _, err = run_cli(capsys, "predict", trained, plain, "--device", "cpu", "-q")
    assert code == 0 and "voxel size" not in err
    code, _, err = run_cli(capsys, "predict", trained, plain, "--device", "cpu", "-q",
                           "--voxel-size", "40,4,4")
    assert code == 0 and "warning:" in err


def test_predict_instances_measures_distances_in_the_stores_scale(
        capsys, tmp_path, checkpoint, monkeypatch):
    import napari_finetune.predict.store as predict_store

    given = []
    real = predict_store.blockwise_instances

    def recording(*args, **kwargs):
        given.append(kwargs.get("voxel_size"))
        return real(*args, **kwargs)

    monkeypatch.setattr(predict_store, "blockwise_instances", recording)
    aniso = make_scaled_store(tmp_path / "sstem.zarr", (8, 32, 32),
                              {"z": 40.0, "y": 8.0, "x": 8.0})
    plain = make_scaled_store(tmp_path / "plain.zarr", (8, 32, 32), None)
    for store in (aniso, plain):
        code, _, err = run_cli(capsys, "predict", checkpoint, store, "--instances",
                               "--role", "membrane=boundary", "--device", "cpu", "-q")
        assert code == 0, err
    # Both channels with a role (membrane, mitochondria), first store then second.
    assert given == [(40.0, 8.0, 8.0)] * 2 + [None] * 2


def test_a_shipped_model_is_named_not_searched_for(capsys):
    """``info starter`` describes the starter that ships with the package; a path that is
    neither a file nor a shipped name is the usual one-line error."""
    code, out, err = run_cli(capsys, "info", "starter")
    assert code == 0, err
    assert "starter_unet.pt" in out and "boundaries (boundary), objects (object)" in out
    code, _, err = run_cli(capsys, "info", "startr")
    assert_one_line_error(code, err)
    assert "startr" in err
