"""The precision probe's comparison with fp32: the measure, the fault, the run and its record."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from engine_setup import make_trainer

from napari_finetune import testing as faults
from napari_finetune.model.checkpoint import load_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.trainer.environment import numeric_stack, run_environment
from napari_finetune.trainer.oom_recovery import iter_probe
from napari_finetune.trainer.precision_check import (
    MIN_OUTPUT_COSINE,
    captured_outputs,
    cosine,
    judge,
    relative_error,
)
from napari_finetune.trainer.sync import LocalSync


def first_conv(model: torch.nn.Module) -> torch.nn.Conv3d:
    return next(m for m in model.modules() if isinstance(m, torch.nn.Conv3d))


# --- the measure ----------------------------------------------------------------------


def test_cosine_of_identical_is_one_and_of_negated_is_minus_one():
    a = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    assert cosine(a, a.clone()) == pytest.approx(1.0, abs=1e-12)
    assert cosine(a, -a) == pytest.approx(-1.0, abs=1e-12)
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])) == pytest.approx(0.0)
    # Several tensors are one vector: (1, 0 | 0) against (1, 0 | 1) is 1/sqrt(2).
    pair = cosine([torch.tensor([1.0, 0.0]), torch.tensor([0.0])],
                  [torch.tensor([1.0, 0.0]), torch.tensor([1.0])])
    assert pair == pytest.approx(1 / math.sqrt(2))
    assert cosine(torch.zeros(3), torch.zeros(3)) == 1.0
    assert cosine(torch.zeros(3), torch.ones(3)) == 0.0
    assert math.isnan(cosine(torch.tensor([float("nan"), 1.0]), torch.ones(2)))
    # bf16 inputs are measured in float64: identical bf16 tensors give exactly 1.
    b = torch.randn(1000).bfloat16()
    assert cosine(b, b.clone()) == pytest.approx(1.0, abs=1e-12)


def test_relative_error_on_hand_made_tensors():
    ref = torch.tensor([3.0, 4.0])  # norm 5
    assert relative_error(ref + torch.tensor([0.0, 0.5]), ref) == pytest.approx(0.1)
    assert relative_error(ref, ref) == 0.0
    assert relative_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert relative_error(torch.ones(2), torch.zeros(2)) == math.inf


@pytest.mark.parametrize(("angle_cosine", "agree"), [(0.999, True), (0.995, True), (0.98, False),
                                                      (0.83, False), (-1.0, False)])
def test_judge_agrees_above_the_output_threshold_only(angle_cosine, agree):
    e1, e2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    tilted = angle_cosine * e1 + math.sqrt(1 - angle_cosine**2) * e2
    grads = [torch.ones(3)]
    check = judge("bfloat16", [tilted], [e1], grads, [g.clone() for g in grads])
    assert check.output_cosine == pytest.approx(angle_cosine)
    assert check.grad_cosine == pytest.approx(1.0)
    assert check.agree is agree and (check.output_cosine >= MIN_OUTPUT_COSINE) is agree
    if agree:
        assert check.verdict.startswith("bf16 agrees with fp32 on this model (output cosine ")
    else:
        assert check.verdict.startswith(
            f"bf16 disagrees with fp32 on this model: output cosine {angle_cosine:.5g} "
            "(at least 0.99 expected; relative error "
        ) and check.verdict.endswith("; training in fp32")


def test_judge_disagrees_when_only_the_gradient_turned():
    out = [torch.tensor([1.0, 2.0])]
    check = judge("float16", out, [o.clone() for o in out], [torch.tensor([1.0, 1.0])],
                  [torch.tensor([1.0, -1.0])])
    assert check.output_cosine == pytest.approx(1.0) and check.grad_cosine == pytest.approx(0.0)
    assert not check.agree and "gradient cosine 0" in check.verdict
    assert check.to_dict()["agree"] is False and check.to_dict()["dtype"] == "float16"


def test_captured_outputs_are_copies_of_the_trained_forwards_only():
    model = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2)
    with captured_outputs(model) as outputs:
        y = model(x)
        with torch.no_grad():  # a teacher that is the student's own module
            model(x)
        y.detach().mul_(0.0)  # the training code's buffers may be reused
    model(x)  # after the block: not collected
    assert len(outputs) == 1
    assert torch.equal(outputs[0], model(x).detach())  # a copy: the in-place zeroing missed it


# --- the fault --------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["negate", "flip", "noise"])
def test_wrong_under_autocast_is_finite_wrong_and_only_under_autocast(how):
    conv = torch.nn.Conv3d(1, 3, 3, padding=1)
    x = torch.rand(2, 1, 4, 8, 8)
    with torch.no_grad():
        clean = conv(x)
        fault = faults.wrong_under_autocast(conv, how)
        assert torch.equal(conv(x), clean) and fault.count == 0  # fp32 runs clean
        state = torch.get_rng_state()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            wrong = conv(x).float()
        assert torch.equal(torch.get_rng_state(), state)  # no random state drawn
        with torch.autocast("cpu", dtype=torch.bfloat16):
            right = conv(x).float()
        fault.remove()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            right = conv(x).float()
    assert fault.count == 2 and torch.isfinite(wrong).all()
    assert cosine(right, clean) > 0.999
    assert cosine(wrong, clean) < 0.9


def test_wrong_under_autocast_names_its_choices():
    with pytest.raises(ValueError, match="negate"):
        faults.wrong_under_autocast(torch.nn.Conv3d(1, 1, 1), "transpose")


# --- the run and its record ---------------------------------------------------------


def healthy_bf16_trainer(**overrides):
    """A UNet that trains in bf16 on the CPU: 8 features at 16^3.

    Not the tests' usual 4x8x8 patch: at a bottleneck of 2x4x4 voxels or less,
    CPU bf16 gave huge or non-finite gradients in some runs and not in others
    (torch 2.13; 1 run in 6 of the same seeds), which the probe rightly calls
    non-finite. 16^3 (a 4^3 bottleneck) ran clean 8 times out of 8.
    """
    torch.manual_seed(0)
    model = UNet(dims=3, in_channels=1, out_channels=2, depth=2, features=8)
    settings = dict(mixed_precision=True, cpu_bf16=True, batch_size=2, steps=2,
                    patch_shape=(16, 16, 16))
    return make_trainer(model=model, **{**settings, **overrides})


def test_finite_but_wrong_bf16_trains_in_fp32_and_says_so(tmp_path):
    trainer = healthy_bf16_trainer()
    trainer.build()
    fault = faults.wrong_under_autocast(first_conv(trainer.model), "negate")
    events = list(trainer.run())
    assert fault.count == 1  # the probe's bf16 pass only: training ran in fp32
    probe = [e.message for e in events if e.kind == "probe"][-1]
    assert probe.startswith(
        "precision probe: bf16 disagrees with fp32 on this model: output cosine "
    ) and probe.endswith("; training in fp32")
    assert not trainer.precision.enabled and trainer.precision.fell_back
    assert trainer.steps_done == 2
    run = load_checkpoint(trainer.export(tmp_path / "out.pt")).metadata["run"]
    check = run["precision_check"]
    assert check["dtype"] == "bfloat16" and check["agree"] is False
    assert check["output_cosine"] < 0.5 and check["output_rel_error"] > 1.0
    assert f"output cosine {check['output_cosine']:.5g} (at least 0.99 expected" in probe
    assert check["verdict"] in probe
    assert run["final_dtype"] == "float32" and run["fell_back_to_fp32"] is True
    assert run["degraded"]["fell_back_to_fp32"] is True  # a resumed run probes again
    assert run["mixed_precision"] == "fp32 (bf16 given up: it disagreed with fp32 in the probe)"


def test_healthy_bf16_keeps_bf16_and_records_the_agreement(tmp_path):
    trainer = healthy_bf16_trainer()
    events = list(trainer.run())
    probe = [e.message for e in events if e.kind == "probe"][-1]
    assert trainer.precision.enabled and not trainer.precision.fell_back
    run = load_checkpoint(trainer.export(tmp_path / "out.pt")).metadata["run"]
    check = run["precision_check"]
    assert check["agree"] is True and check["dtype"] == "bfloat16"
    assert check["output_cosine"] >= 0.999 and check["output_rel_error"] < 0.05
    assert check["grad_cosine"] >= 0.9
    assert check["verdict"].startswith("bf16 agrees with fp32 on this model (output cosine ")
    assert probe.startswith("precision probe passed") and check["verdict"] in probe
    assert run["final_dtype"] == "bfloat16"


@pytest.mark.parametrize("wrong", [False, True], ids=["healthy", "finite-but-wrong"])
def test_under_the_cuda_fake_bf16_is_compared_and_kept_or_dropped(tmp_path, wrong):
    """The CUDA path (bf16 chosen by capability 9.0, autocast on "cuda") under FakeCuda.

    The fake computes on the CPU, where a CUDA autocast casts nothing: its healthy
    bf16 pass equals fp32 exactly, so this checks the path and the verdicts, not
    bf16's numbers (the CPU tests with ``cpu_bf16`` do that).
    """
    from napari_finetune.testing.cuda import FakeCuda

    with FakeCuda(tensors_on_host=True):
        # Drawn on the training thread: the fake's host tensors are this thread's.
        trainer = healthy_bf16_trainer(
            cpu_bf16=False, device="cuda", prefetch_steps=0, autobatch=False
        )
        trainer.build()
        assert trainer.precision.dtype_name == "bfloat16" and trainer.device.type == "cuda"
        if wrong:
            fault = faults.wrong_under_autocast(first_conv(trainer.model), device_type="cuda")
        events = list(trainer.run())
    probe = [e.message for e in events if e.kind == "probe"][-1]
    check = trainer.state.precision_check
    assert events[-1].kind == "finished" and trainer.steps_done == 2
    if wrong:
        assert fault.count == 1 and not check.agree
        assert probe.endswith("; training in fp32") and trainer.precision.fell_back
    else:
        assert check.agree and check.output_cosine == pytest.approx(1.0)
        assert probe.startswith("precision probe passed") and trainer.precision.enabled


def test_a_lora_run_compares_the_student_not_its_adapters_off_teacher():
    trainer = healthy_bf16_trainer(mode="lora", distillation=0.5)
    trainer.build()
    assert trainer.state.teacher is not None
    passes: list[bool] = []
    trainer.model.register_forward_hook(lambda *_: passes.append(torch.is_grad_enabled()))
    probe = [m for _, m in iter_probe(trainer.state, trainer.parts, trainer.sampler)]
    # Student and adapters-off teacher through the same module, in each precision.
    assert passes == [True, False, True, False]
    check = trainer.state.precision_check
    assert check.agree and check.output_cosine >= 0.999 and check.verdict in probe[-1]


def test_an_fp32_run_makes_no_comparison(tmp_path):
    trainer = make_trainer(batch_size=2, steps=1)
    list(trainer.run())
    run = load_checkpoint(trainer.export(tmp_path / "out.pt")).metadata["run"]
    assert run["precision_check"] is None and run["final_dtype"] == "float32"


class OtherRankDisagrees(LocalSync):
    """Alone, but answers the probe's third agreed question (any disagreement?) with yes."""

    def __init__(self) -> None:
        self.asked: list[bool] = []

    def any(self, flag: bool) -> bool:
        self.asked.append(bool(flag))
        return len(self.asked) == 3 or bool(flag)


def test_a_disagreement_on_another_rank_counts_here():
    trainer = healthy_bf16_trainer()
    trainer.build()
    sync = OtherRankDisagrees()
    lines = [m for _, m in iter_probe(trainer.state, trainer.parts, trainer.sampler, sync=sync)]
    # Asked: out of memory? non-finite? disagrees? fp32 out of memory (compare smaller)?
    # -- this rank said no to each.
    assert sync.asked == [False, False, False, False]
    check = trainer.state.precision_check
    assert not check.agree and check.output_cosine > 0.999  # healthy here
    assert lines[-1].startswith("precision probe: bf16 disagrees with fp32 on another rank")
    assert not trainer.precision.enabled


# --- the numeric stack ----------------------------------------------------------------


def test_the_record_names_the_numeric_stack():
    stack = run_environment("cpu")["numeric"]
    assert stack == numeric_stack()
    assert stack["torch"] == str(torch.__version__)
    assert stack["cuda"] == torch.version.cuda
    assert stack["tf32_matmul"] is torch.backends.cuda.matmul.allow_tf32
    assert stack["tf32_cudnn"] is torch.backends.cudnn.allow_tf32
    assert stack["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    if torch.backends.cudnn.is_available():
        assert stack["cudnn"] == torch.backends.cudnn.version()
    else:
        assert stack["cudnn"] is None


def test_the_numeric_stack_follows_tf32_switches():
    # Not monkeypatch: the matmul switch is a property of torch's cuBLAS module,
    # which monkeypatch cannot put back. Setting the old switches also moves the
    # newer fp32_precision settings ("none" -> "ieee"), which changed later
    # tests' CPU bf16 numbers: those are put back too.
    newer = [
        (module, module.fp32_precision)
        for module in (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
        if hasattr(module, "fp32_precision")
    ]
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = False
        stack = numeric_stack()
        assert stack["tf32_matmul"] is True and stack["tf32_cudnn"] is False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = True
        stack = numeric_stack()
        assert stack["tf32_matmul"] is False and stack["tf32_cudnn"] is True
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
        for module, value in newer:
            module.fp32_precision = value
    assert [(m, m.fp32_precision) for m, _ in newer] == newer


def test_the_environment_imports_without_napari_qt_zarr_or_dask():
    import subprocess

    code = (
        "import sys; from napari_finetune.trainer.environment import run_environment; "
        "run_environment('cpu'); "
        "print([m for m in ('napari', 'qtpy', 'zarr', 'dask') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]"


class OtherRankFp32OutOfMemory(LocalSync):
    """Alone, but answers "did the fp32 pass run out of memory anywhere?" (the probe's
    fourth agreed question) with yes, once."""

    def __init__(self) -> None:
        self.asked: list[bool] = []

    def any(self, flag: bool) -> bool:
        self.asked.append(bool(flag))
        return len(self.asked) == 4 or bool(flag)


def test_an_fp32_pass_out_of_memory_on_another_rank_compares_smaller_here_too():
    """Each comparison holds collectives: a rank that went on alone would leave the others
    waiting in theirs."""
    trainer = healthy_bf16_trainer()
    trainer.build()
    sync = OtherRankFp32OutOfMemory()
    lines = [m for _, m in iter_probe(trainer.state, trainer.parts, trainer.sampler, sync=sync)]
    assert "precision probe: the fp32 pass ran out of memory; comparing at micro-batch 1" in lines
    check = trainer.state.precision_check
    assert check.compared and check.agree and trainer.precision.enabled
