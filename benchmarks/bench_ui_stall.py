"""How long does napari's main thread freeze while the dock widget fine-tunes?

A 10 ms QTimer runs on the main thread during the whole run (from the click on
Fine-tune to the end of the final prediction); the gaps between its ticks are
the UI's stalls. Also timed: docking the widget (the pre-imports), the click
itself, the first Status and the first refreshed preview after the click.

Run under a display (Xvfb on a headless machine)::

    xvfb-run -a -s "-screen 0 1280x1024x24" .venv/bin/python benchmarks/bench_ui_stall.py
    ... --shape 32,128,128 --steps 20 --mode lora --preview 1 --diagnose

Uses the synthetic-em sample store and its pretrained checkpoint when the
sample is installed, otherwise a generated store and a random 3D UNet.
``--diagnose`` prints the main thread's stack during the longest stalls
(sampled by a watchdog thread). Goal: max gap < 50 ms.

``--walk`` times what a user does from the start instead, each step under the
10 ms heartbeat: open the sample (generated into an empty cache), dock the
widget, press Predict the moment the dock shows, paint, Fine-tune, Stop,
Export. Per step: its wall time, the longest main-thread gap, and napari's own
layer insertions (``layers.events.inserting`` to ``inserted``, ~0.28 s per
labels layer under Xvfb) timed apart; an idle window's gap is the floor.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _store_and_checkpoint(shape, tmp: Path) -> tuple[Path, Path, str]:
    from napari_finetune.samples.store import ensure_sample
    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    ckpt = sample_checkpoint_path()
    if ckpt.is_file():
        return ensure_sample("target", shape), ckpt, "synthetic-em sample + pretrained UNet"
    import torch

    from napari_finetune.model.checkpoint import save_checkpoint
    from napari_finetune.model.unet import UNet

    torch.manual_seed(0)
    path = save_checkpoint(tmp / "random_unet.pt", UNet(dims=3, out_channels=2),
                           {"channel_names": ["membrane", "mitochondria"]})
    return ensure_sample("target", shape), path, "synthetic-em sample + random UNet (no sample .pt)"


def _wait(app, condition, timeout_s: float = 1800) -> None:
    """Run Qt's own event loop (as napari does) until ``condition()`` holds.

    A Python loop of ``processEvents()`` + ``sleep`` would need the GIL for
    every iteration and inflate the gaps it is meant to measure.
    """
    from qtpy.QtCore import QEventLoop, QTimer

    if condition():
        return
    loop = QEventLoop()
    end = time.perf_counter() + timeout_s
    poll = QTimer()
    poll.setInterval(20)

    def check() -> None:
        if condition() or time.perf_counter() > end:
            loop.quit()

    poll.timeout.connect(check)
    poll.start()
    loop.exec_()
    poll.stop()
    if not condition():
        raise TimeoutError("the widget did not finish in time")


class Meter:
    """10 ms ticks on the main thread; optional watchdog that samples its stack when late."""

    def __init__(self, diagnose: bool) -> None:
        from qtpy.QtCore import QTimer

        self.ticks: list[float] = []
        self.stacks: list[tuple[float, float, str]] = []
        self.diagnose = diagnose
        self._running = False
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(lambda: self.ticks.append(time.perf_counter()))

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.ticks.append(self.t0)
        self._running = True
        self.timer.start()
        if self.diagnose:
            threading.Thread(target=self._watch, daemon=True).start()

    def stop(self) -> None:
        self.timer.stop()
        self._running = False

    def _watch(self) -> None:
        main = threading.main_thread().ident
        while self._running:
            time.sleep(0.02)
            lag = time.perf_counter() - self.ticks[-1]
            if lag > 0.1:
                frame = sys._current_frames().get(main)
                stack = "".join(traceback.format_stack(frame)[-5:]) if frame else ""
                self.stacks.append((lag * 1000, time.perf_counter() - self.t0, stack))

    def gaps_ms(self) -> np.ndarray:
        return np.diff(np.asarray(self.ticks)) * 1000


class Insertions:
    """Time napari spends inserting each layer (``inserting`` to ``inserted``)."""

    def __init__(self, viewer) -> None:
        self.times: list[float] = []
        self._t = 0.0
        viewer.layers.events.inserting.connect(self._inserting)
        viewer.layers.events.inserted.connect(self._inserted)

    def _inserting(self, *_: object) -> None:
        self._t = time.perf_counter()

    def _inserted(self, *_: object) -> None:
        self.times.append(time.perf_counter() - self._t)


def walk(args: argparse.Namespace) -> int:
    """The user's walk, step by step; prints one table (see the module's docstring)."""
    import napari
    from qtpy.QtWidgets import QApplication

    shape = tuple(int(s) for s in args.shape.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="bench-walk-"))
    # An empty cache: the first opening generates the sample, as on a user's first day.
    os.environ["NAPARI_FINETUNE_CACHE"] = str(tmp / "cache")
    os.environ["NAPARI_FINETUNE_SAMPLE_SHAPE"] = ",".join(map(str, shape))
    viewer = napari.Viewer()
    app = QApplication.instance()
    insertions = Insertions(viewer)
    rows: list[tuple[str, str, str, str]] = []
    box: dict = {}

    def step(name: str, action, done, settle_s: float = 0.3, timeout_s: float = 600) -> None:
        insertions.times.clear()
        meter = Meter(False)
        meter.start()
        t = time.perf_counter()
        action()  # on the main thread, as a click is: its time is the gap after t0
        _wait(app, done, timeout_s)
        wall = time.perf_counter() - t
        end = time.perf_counter()
        # The turns that follow, and at least one tick: a blocking action's whole time is
        # the gap between the meter's start and that tick.
        _wait(app, lambda: time.perf_counter() - end > settle_s and meter.ticks[-1] > end)
        meter.stop()
        gaps = meter.gaps_ms()
        ins = insertions.times
        rows.append((name, f"{wall:.2f} s", f"{gaps.max():.0f} ms",
                     f"{len(ins)}: {1000 * sum(ins):.0f} ms (max {1000 * max(ins):.0f})"
                     if ins else "-"))

    idle = Meter(False)
    idle.start()
    _wait(app, lambda: time.perf_counter() - idle.t0 > args.idle)
    idle.stop()
    rows.append(("idle window (the floor)", f"{args.idle:.1f} s",
                 f"{idle.gaps_ms().max():.0f} ms", "-"))

    step("open the sample (first time: generated)",
         lambda: viewer.open_sample("napari-finetune", "synthetic-em"), lambda: True)

    def dock() -> None:
        _, box["w"] = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")

    step("dock the widget", dock, lambda: True, settle_s=0.0)  # Predict comes at once
    w = box["w"]
    names = [f"{c} prediction" for c in ("membrane", "mitochondria")]

    def predicted() -> bool:
        return (w.controller.session.prediction is not None and w.state.busy is None
                and all(n in viewer.layers for n in names))

    clicks = {"n": 0}

    def click_predict() -> None:
        # The moment the dock shows; a disabled button drops the click (Qt), as for a user.
        clicks["n"] += 1
        b = w.predict_button
        box["at_click"] = "enabled" if b.isEnabled() else "disabled: dropped"
        b.click()
        if getattr(w.state, "queued", False):
            box["at_click"] = "queued"

    def predict_done() -> bool:
        if predicted():
            return True
        # A dropped click: the user clicks again once the button is enabled and idle.
        if (w.state.info is not None and w.state.busy is None and w.state.running == 0
                and w.predict_button.isEnabled() and not getattr(w.state, "queued", False)
                and w.controller.session.prediction is None):
            clicks["n"] += 1
            w.predict_button.click()
        return False

    step("Predict clicked as the dock shows (to layers shown)", click_predict, predict_done)
    rows[-1] = (rows[-1][0] + f" [first click {box['at_click']}; {clicks['n']} click(s)]",
                *rows[-1][1:])

    def paint() -> None:
        w.new_corrections_button.click()
        layer = w.corrections_combo.value  # the new one, which the user paints into
        layer.brush_size = 7
        truth = np.asarray(viewer.layers["ground truth"].data)
        rng = np.random.default_rng(0)
        for _ in range(12):
            z, y, x = (int(rng.integers(0, n)) for n in shape)
            layer.paint((z, y, x), 1 + int(truth[z, y, x]))

    step("New corrections layer + 12 strokes", paint, lambda: w.state.busy is None, 1.0)
    s = w.settings
    s.steps.value, s.batch_size.value, s.mode.value = args.steps, args.batch, args.mode
    s.preview_interval.value, s.device.value = args.preview, args.device
    step("Fine-tune (click to the first step)", w.finetune_button.click,
         lambda: any(st.kind == "step" for st in w.state.statuses))
    region_at: list[float] = []

    def region_seen(event) -> None:  # the region in view, predicted before the rest
        if type(event).__name__ == "RegionPredicted":
            region_at.append(time.perf_counter())

    w.controller.session.events.job_event.connect(region_seen)
    clicked = time.perf_counter()
    step("Stop (to the weights kept and the prediction redone)", w.stop_button.click,
         lambda: w.state.busy is None and w.state.running == 0, 1.0)
    if region_at:  # a build that predicts the view first
        rows[-1] = (rows[-1][0] + f" [view shown after {region_at[0] - clicked:.2f} s]",
                    *rows[-1][1:])
    from napari_finetune._qt import results

    target = str(tmp / "exported.pt")
    step("Export (results.export, no file dialog)",
         lambda: results.export(w.controller, target),
         lambda: w.state.busy is None and Path(target).exists())

    print(f"# bench_ui_stall --walk: image {shape}; {args.mode}; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f}")
    head = ("step", "wall", "longest gap", "napari layer insertions")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    for r in [head, tuple("-" * n for n in widths), *rows]:
        print("| " + " | ".join(f"{c:<{n}}" for c, n in zip(r, widths, strict=True)) + " |")
    if w.state.errors:
        print("errors:", *w.state.errors, sep="\n  ")
    viewer.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="32,128,128", help="sample shape z,y,x")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--mode", choices=["lora", "full"], default="lora")
    parser.add_argument("--preview", type=float, default=1.0, help="preview interval, s")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--idle", type=float, default=5.0,
                        help="seconds measured with nothing running first (the machine's floor)")
    parser.add_argument("--no-predict", action="store_true",
                        help="click Fine-tune before any Predict (the click adds the layers)")
    parser.add_argument("--diagnose", action="store_true")
    parser.add_argument("--walk", action="store_true",
                        help="time the user's walk: open the sample, dock, Predict, paint, "
                             "Fine-tune, Stop, Export")
    args = parser.parse_args(argv)
    if args.walk:
        return walk(args)
    shape = tuple(int(s) for s in args.shape.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="bench-ui-"))
    os.environ.setdefault("NAPARI_FINETUNE_CACHE", str(tmp / "cache"))

    import napari
    from qtpy.QtWidgets import QApplication

    store, ckpt, what = _store_and_checkpoint(shape, tmp)
    viewer = napari.Viewer()
    app = QApplication.instance()
    viewer.open(str(store), plugin="napari-finetune")
    t = time.perf_counter()
    _, widget = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")
    dock_s = time.perf_counter() - t
    widget.checkpoint_edit.setText(str(ckpt))
    widget.checkpoint_edit.editingFinished.emit()  # as Return in the field does
    _wait(app, lambda: widget.state.info is not None and widget.state.running == 0)
    predict_s, predict_gap = float("nan"), float("nan")
    if not args.no_predict:
        predict_meter = Meter(False)
        predict_meter.start()
        t = time.perf_counter()
        widget.predict_button.click()
        _wait(app, lambda: widget.state.busy is None)
        predict_s = time.perf_counter() - t
        predict_meter.stop()
        predict_gap = float(predict_meter.gaps_ms().max())

    names = [f"{c} prediction" for c in widget.state.info.channel_names]
    had_layers = all(n in viewer.layers for n in names)
    corrections_meter = Meter(False)
    corrections_meter.start()
    t = time.perf_counter()
    widget.new_corrections_button.click()
    new_layer_ms = (time.perf_counter() - t) * 1000
    layer = widget.corrections_combo.value  # the new one (the store may hold older ones)
    # The widget adds the prediction layers now (one per event-loop turn), not at the click.
    _wait(app, lambda: all(n in viewer.layers for n in names)
          and viewer.layers.selection.active is layer)
    ready = time.perf_counter()
    _wait(app, lambda: time.perf_counter() - ready > 0.5)  # the turns after the last layer
    corrections_meter.stop()
    corrections_gaps = np.sort(corrections_meter.gaps_ms())[::-1]  # longest first
    layer.brush_size = 7
    truth = np.asarray(viewer.layers["ground truth"].data) if "ground truth" in viewer.layers \
        else None
    rng = np.random.default_rng(0)
    for _ in range(12):  # strokes where the ground truth says what is there
        z, y, x = (int(rng.integers(0, s)) for s in shape)
        value = 1 + int(truth[z, y, x]) if truth is not None else 2
        layer.paint((z, y, x), value)
    s = widget.settings
    s.steps.value = args.steps
    s.batch_size.value = args.batch
    s.mode.value = args.mode
    s.preview_interval.value = args.preview
    s.device.value = args.device

    idle = Meter(False)
    idle.start()
    _wait(app, lambda: time.perf_counter() - idle.t0 > args.idle)
    idle.stop()
    idle_gaps = idle.gaps_ms()

    meter = Meter(args.diagnose)
    meter.start()
    t = time.perf_counter()
    widget.finetune_button.click()
    click_ms = (time.perf_counter() - t) * 1000
    _wait(app, lambda: widget.state.busy is None and widget.state.running == 0)
    meter.stop()
    total_s = time.perf_counter() - meter.t0
    gaps = meter.gaps_ms()
    statuses = widget.state.statuses
    steps = [st for st in statuses if st.kind == "step"]
    timings = widget.state.timings
    last = statuses[-1] if statuses else None
    rate = (len(steps) - 1) / (steps[-1].elapsed_s - steps[0].elapsed_s) if len(steps) > 1 else 0

    print(f"# bench_ui_stall: {what}; image {shape}; {args.mode}, {args.steps} steps, batch "
          f"{args.batch}, preview every {args.preview} s; "
          f"{'no Predict before the click; ' if args.no_predict else ''}{os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f}")
    rows = [
        ("dock the widget (pre-imports)", f"{dock_s * 1000:.0f} ms"),
        ("whole-volume Predict (adds the prediction layers)",
         f"{predict_s:.2f} s, longest gap {predict_gap:.0f} ms"),
        ("New corrections layer: click handler", f"{new_layer_ms:.0f} ms"),
        ("  then: longest gap" + ("" if had_layers else " (adds the prediction layers)"),
         f"{corrections_gaps[0]:.1f} ms (next: "
         f"{', '.join(f'{g:.0f}' for g in corrections_gaps[1:4])} ms)"),
        ("Fine-tune click handler", f"{click_ms:.0f} ms"),
        ("click -> first Status", f"{timings.get('first_status_s', float('nan')):.2f} s"),
        ("click -> first refreshed preview",
         f"{timings.get('first_preview_s', float('nan')):.2f} s"),
        ("previews applied", str(widget.state.previews)),
        ("run", f"{last.kind if last else '-'} at step {last.step if last else 0}, "
                f"{rate:.2f} steps/s, {total_s:.1f} s incl. final predict"),
        ("idle gap max / p99 / median", f"{idle_gaps.max():.1f} / "
         f"{np.percentile(idle_gaps, 99):.1f} / {np.median(idle_gaps):.1f} ms"),
        ("main-thread gap max", f"{gaps.max():.1f} ms"),
        ("main-thread gap p99", f"{np.percentile(gaps, 99):.1f} ms"),
        ("main-thread gap median", f"{np.median(gaps):.1f} ms"),
        ("gaps > 50 ms", f"{int((gaps > 50).sum())} of {gaps.size}"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if widget.state.errors:
        print("errors:", *widget.state.errors, sep="\n  ")
    if args.diagnose:
        seen = set()
        for lag, at, stack in sorted(meter.stacks, reverse=True)[:20]:
            if stack not in seen:
                seen.add(stack)
                print(f"--- {lag:.0f} ms late at t={at:.2f} s:\n{stack}")
    viewer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
