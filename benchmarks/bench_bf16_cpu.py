"""Non-finite gradients under CPU bf16 autocast: how often, where, and what changes it.

Torch only (no trainer code): the sample UNet (or a small one) trained in a
plain loop, seeded random batches ``x = randn(B, 1, D, H, W)``, targets
``rand > 0.5`` over 2 channels, BCE-with-logits, AdamW lr 1e-3, a few steps,
under ``torch.autocast("cpu", dtype=torch.bfloat16)`` or in fp32. Every run is
a fresh process (``subprocess``): the glitch was seen to differ between fresh
processes, never within one. Measured:

1. How often: per setting, the fresh runs whose gradient total norm is
   non-finite or above 1e19 at some step, and how many distinct loss
   trajectories the same seed gave (1 = run-to-run identical).
2. Where: in every run, forward hooks check each module's output, full
   backward hooks find the first module in backward order whose grad_input
   is non-finite or huge while its grad_output is fine, and each parameter's
   gradient is checked; the first culprit and its input shape are reported.
3. What changes it: 1 vs 2 threads, ``torch.use_deterministic_algorithms``,
   oneDNN off (``torch.backends.mkldnn.enabled = False``), fused vs plain
   AdamW, and oneDNN without AMX (``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``,
   this machine's CPU has AMX-BF16 tiles); with the median step time.
4. The single op: the UNet's bottleneck convolutions, forward and backward on
   fixed random bf16 inputs, called repeatedly in fresh processes: non-finite
   results and distinct results across calls and thread counts.

    python benchmarks/bench_bf16_cpu.py [--runs 8] [--steps 8] [--quick]

Hooks run in every run (the step times include them, the same for every
setting); the model's in-place ReLUs are made out-of-place so that full
backward hooks can see them, which changes no value.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any

import torch
from markdown_table import print_header, print_table

# the first convolution's input needs no gradient: its full backward hook says so, harmlessly
warnings.filterwarnings("ignore", message="Full backward hook is firing")

HUGE = 1e19  # a healthy gradient here is below 1e2; the trainer note saw 2.9e35

# name -> (worker settings, extra environment)
SETTINGS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "fp32, 2 threads": ({"bf16": False}, {}),
    "bf16, 2 threads": ({}, {}),
    "bf16, 1 thread": ({"threads": 1}, {}),
    "bf16, deterministic algorithms": ({"deterministic": True}, {}),
    "bf16, oneDNN off": ({"mkldnn": False}, {}),
    "bf16, fused AdamW": ({"fused": True}, {}),
    "bf16, oneDNN without AMX": ({}, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}),
}


def bad(t: torch.Tensor) -> bool:
    """Whether ``t`` holds a non-finite value or one above ``HUGE`` in magnitude."""
    if not t.is_floating_point() or t.numel() == 0:
        return False
    return not bool(t.detach().float().abs().max() <= HUGE)  # NaN compares False


def build_model(spec: str | dict[str, Any]) -> torch.nn.Module:
    """The sample checkpoint's UNet (``"sample"``) or a ``UNet(**spec)``."""
    if spec == "sample":
        from napari_finetune.model.checkpoint import load_checkpoint
        from napari_finetune.samples.synthetic_em import sample_checkpoint_path

        return load_checkpoint(sample_checkpoint_path()).model
    from napari_finetune.model.unet import UNet

    return UNet(**spec)


class Watch:
    """Hooks that remember the first bad forward output, grad_input and parameter grad."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.step = 0
        self.found: dict[str, Any] = {}
        self.shapes: dict[str, list[int]] = {}
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.ReLU):
                # full backward hooks refuse outputs modified in place
                module.inplace = False
            if len(list(module.children())) == 0:
                module.register_forward_hook(self._forward(name))
                module.register_full_backward_hook(self._backward(name))
        for name, p in model.named_parameters():
            p.register_hook(self._param(name))

    def _note(self, kind: str, what: dict[str, Any]) -> None:
        # only the first of each kind: later ones are the first one spreading
        self.found.setdefault(kind, {"step": self.step, **what})

    def _forward(self, name: str):
        def hook(module, inputs, output):
            self.shapes[name] = list(inputs[0].shape)
            if bad(output) and not any(bad(i) for i in inputs if torch.is_tensor(i)):
                self._note("forward", {"module": name, "type": type(module).__name__,
                                       "input_shape": self.shapes[name],
                                       "input_dtype": str(inputs[0].dtype)})
        return hook

    def _backward(self, name: str):
        def hook(module, grad_input, grad_output):
            out_ok = not any(bad(g) for g in grad_output if g is not None)
            if out_ok and any(bad(g) for g in grad_input if g is not None):
                self._note("backward", {"module": name, "type": type(module).__name__,
                                        "input_shape": self.shapes.get(name)})
        return hook

    def _param(self, name: str):
        def hook(grad):
            if bad(grad):
                value = grad.detach().float().abs().max().item()
                self._note("param", {"param": name, "max": value})
        return hook


def train_run(config: dict[str, Any]) -> dict[str, Any]:
    """One short training run in this process under ``config``; the settings it applies stay.

    Parameters
    ----------
    config : dict
        ``model`` ("sample" or UNet kwargs), ``shape`` (B, D, H, W), ``steps``,
        ``seed``, ``bf16``, ``threads``, ``deterministic``, ``mkldnn``, ``fused``.

    Returns
    -------
    dict
        ``losses`` and ``norms`` per step (a norm is None when non-finite),
        ``bad_step`` (first step with a bad norm, or None), ``where`` (what the
        hooks found first), ``step_s`` (median seconds per step).
    """
    torch.set_num_threads(config.get("threads", 2))
    torch.use_deterministic_algorithms(config.get("deterministic", False))
    torch.backends.mkldnn.enabled = config.get("mkldnn", True)
    torch.manual_seed(config.get("seed", 0))
    model = build_model(config.get("model", "sample"))
    watch = Watch(model) if config.get("watch", True) else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=config.get("fused", False))
    generator = torch.Generator().manual_seed(config.get("seed", 0))
    b, *spatial = config.get("shape", (2, 16, 64, 64))
    bf16 = config.get("bf16", True)
    losses: list[float | None] = []
    norms: list[float | None] = []
    times: list[float] = []
    bad_step = None
    for step in range(config.get("steps", 8)):
        if watch:
            watch.step = step
        x = torch.randn(b, 1, *spatial, generator=generator)
        y = torch.rand(b, 2, *spatial, generator=generator) > 0.5
        start = time.perf_counter()
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), y.float())
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
        optimizer.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item() if math.isfinite(loss.item()) else None)
        norms.append(norm if math.isfinite(norm) else None)
        if bad_step is None and not (math.isfinite(norm) and norm <= HUGE):
            bad_step = step
    return {"losses": losses, "norms": norms, "bad_step": bad_step,
            "where": watch.found if watch else {}, "step_s": statistics.median(times)}


def op_run(config: dict[str, Any]) -> dict[str, Any]:
    """One bottleneck convolution, forward + backward on fixed bf16 inputs, ``calls`` times.

    Returns the count of calls with a non-finite or huge result, the number of
    distinct results (hashes of output, grad_input, grad_weight), and the
    largest relative error of the first call against fp32.
    """
    torch.set_num_threads(config.get("threads", 2))
    torch.backends.mkldnn.enabled = config.get("mkldnn", True)
    g = torch.Generator().manual_seed(1)
    cin, cout = config["channels"]
    x32 = torch.randn(*config["input"], generator=g)
    w32 = torch.randn(cout, cin, 3, 3, 3, generator=g) / math.sqrt(27 * cin)
    b32 = torch.randn(cout, generator=g) * 0.1
    gy = torch.randn(config["input"][0], cout, *config["input"][2:], generator=g)

    def once(dtype: torch.dtype) -> list[torch.Tensor]:
        # fresh leaves each call: the same values, no state carried between calls
        x = x32.to(dtype).detach().clone().requires_grad_()
        w = w32.to(dtype).detach().clone().requires_grad_()
        y = torch.nn.functional.conv3d(x, w, b32.to(dtype), padding=1)
        y.backward(gy.to(dtype))
        return [y.detach(), x.grad, w.grad]

    reference = once(torch.float32)
    hashes, n_bad = set(), 0
    first = None
    for _ in range(config.get("calls", 50)):
        result = once(torch.bfloat16)
        first = first or result
        n_bad += any(bad(t) for t in result)
        hashes.add(hashlib.sha1(b"".join(t.float().numpy().tobytes() for t in result)).hexdigest())
    rel = max(float((a.float() - r).norm() / r.norm())
              for a, r in zip(first, reference, strict=True))
    return {"bad_calls": n_bad, "distinct": sorted(hashes), "rel_error": rel}


def fresh(kind: str, config: dict[str, Any], env: dict[str, str], timeout: float = 300) -> dict:
    """``train_run`` or ``op_run`` in a fresh python process (its own allocator, oneDNN state)."""
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", kind, json.dumps(config)],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **env},
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def rate_row(name: str, results: list[dict[str, Any]]) -> list[str]:
    """One row of the how-often table from the results of fresh runs of one setting."""
    ok = [r for r in results if "error" not in r]
    hit = [r for r in ok if r["bad_step"] is not None]
    trajectories = {json.dumps(r["losses"]) for r in ok}
    steps = sorted({r["bad_step"] for r in hit})
    errors = len(results) - len(ok)
    return [
        name, str(len(ok)) + (f" (+{errors} failed)" if errors else ""),
        f"{len(hit)}/{len(ok)}", ", ".join(map(str, steps)) or "-",
        str(len(trajectories)),
        f"{statistics.median(r['step_s'] for r in ok) * 1e3:.0f}" if ok else "-",
    ]


RATE_HEADER = ["setting", "fresh runs", "runs with a non-finite or > 1e19 grad norm",
               "first bad steps", "distinct loss trajectories (same seed)", "median step (ms)"]


def where_rows(name: str, results: list[dict[str, Any]]) -> list[list[str]]:
    """The hooks' first findings in the runs that went bad."""
    rows = []
    for i, r in enumerate(results):
        for kind, f in sorted(r.get("where", {}).items()):
            what = f.get("module") or f.get("param")
            detail = f.get("type", "") + (f" max {f['max']:.3g}" if "max" in f else "")
            shape = "x".join(map(str, f["input_shape"])) if f.get("input_shape") else "-"
            rows.append([name, str(i), str(f["step"]), kind, what, detail, shape])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per setting")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="3 runs x 4 steps, fewer op calls")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, config = args.worker[0], json.loads(args.worker[1])
        print(json.dumps((train_run if kind == "train" else op_run)(config)))
        return
    runs, steps, calls = (1, 4, 5) if args.quick else (args.runs, args.steps, 10)
    print_header(f"## CPU bf16 autocast: torch {torch.__version__}, sample UNet, "
                 f"batch 2x1x16x64x64, {steps} steps, {runs} fresh runs per setting")
    start = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in SETTINGS}
    # interleaved, so that the machine's load falls on every setting alike
    for _ in range(runs):
        for name, (config, env) in SETTINGS.items():
            results[name].append(fresh("train", {"steps": steps, **config}, env))
    print_table(RATE_HEADER, [rate_row(name, rs) for name, rs in results.items()])
    where = [row for name, rs in results.items() for row in where_rows(name, rs)]
    print_table(["setting", "run", "step", "found in", "module / parameter", "detail",
                 "input shape"], where or [["-", "-", "-", "none", f"no bad value in "
                                            f"{runs * len(SETTINGS)} runs", "-", "-"]])
    # the bottleneck of the sample UNet at 16x64x64 (2x8x8) and at 16x32x32 (2x4x4)
    ops = [("encoder 3 conv 2 (64->64)", [2, 64, 2, 8, 8], [64, 64]),
           ("encoder 3 conv 2 (64->64)", [2, 64, 2, 4, 4], [64, 64]),
           ("up_conv 0 (64->32)", [2, 64, 4, 16, 16], [64, 32])]
    rows = []
    for label, shape, channels in ops:
        for threads in (1, 2):
            outs = [fresh("op", {"input": shape, "channels": channels, "calls": calls,
                                 "threads": threads}, {}) for _ in range(2)]
            outs = [o for o in outs if "error" not in o]
            distinct = {h for o in outs for h in o["distinct"]}
            rows.append([label, "x".join(map(str, shape)), str(threads),
                         f"{len(outs)} x {calls}", str(sum(o["bad_calls"] for o in outs)),
                         str(len(distinct)),
                         f"{max(o['rel_error'] for o in outs):.2e}" if outs else "-"])
    print_table(["conv3d fwd+bwd, bf16", "input", "threads", "processes x calls",
                 "calls with a bad value", "distinct results (all processes)",
                 "rel. error vs fp32"], rows)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
