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
10 ms heartbeat: open the sample (into an empty cache: its first opening; the
sample a user opens unless ``--shape`` says another), dock the widget, press
Predict the moment the dock shows, paint, Fine-tune, Stop, Objects, Export, and
close napari while a prediction runs.
Per step: its wall time, the longest main-thread gap, the longest gap less
napari's own layer work in it (building an Image or Labels layer and adding it
to the viewer, timed apart: :class:`NapariLayerWork`), and that work; an idle
window's gap is the floor.
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


def _panel(dock):
    """The dock's panel (buttons, state), None until built; the dock itself before the
    dock built its panel in later event-loop turns (main before h/dock)."""
    return dock.panel if hasattr(dock, "panel_ready") else dock


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

    def __init__(self, diagnose: bool, watch: GilWatch | None = None) -> None:
        from qtpy.QtCore import QTimer

        self.ticks: list[float] = []
        self.stacks: list[tuple[float, float, str]] = []
        self.diagnose = diagnose
        self._running = False
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(lambda: self.ticks.append(time.perf_counter()))
        if watch is not None:
            self.timer.timeout.connect(watch.tick)

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


class NapariLayerWork:
    """The main thread's time in napari's own layer code, to be told apart from the plugin's.

    Three kinds of interval: a layer's construction (``Image.__init__``,
    ``Labels.__init__``, wrapped for the walk), its addition
    (``LayerList.insert``, which ``viewer.add_layer``, ``add_image`` and
    ``layers.append`` all end in: the ``inserting``/``inserted`` events and the
    canvas's visual, made by a handler of ``inserted``) and its removal
    (``LayerList.__delitem__`` and ``clear``: ``viewer.close()`` removes every
    layer, each removal ending in napari's own ``gc.collect()``). All are
    napari's code on data already in memory; opening a sample calls them after
    the plugin's function returned, in the same main-thread turn, so a
    heartbeat alone would charge them to the plugin.
    """

    def __init__(self) -> None:
        from napari.components import LayerList
        from napari.layers import Image, Labels

        self.built: list[tuple[float, float]] = []
        self.added: list[tuple[float, float]] = []
        self.removed: list[tuple[float, float]] = []
        self._undo: list[tuple[type, str, object]] = []
        self._depth: dict[str, list[int]] = {}
        for owner, name, into in ((Image, "__init__", self.built),
                                  (Labels, "__init__", self.built),
                                  (LayerList, "insert", self.added),
                                  (LayerList, "__delitem__", self.removed),
                                  (LayerList, "clear", self.removed)):
            self._wrap(owner, name, into)

    def _wrap(self, owner: type, name: str, into: list[tuple[float, float]]) -> None:
        real = owner.__dict__.get(name)  # None: inherited (deleted again at the restore)
        inner = getattr(owner, name)
        # One count for both removals: ``clear`` deletes through ``__delitem__``.
        depth = self._depth.setdefault("removal", [0]) if into is self.removed else [0]

        def timed(*args: object, **kwargs: object) -> object:
            if threading.current_thread() is not threading.main_thread() or depth[0]:
                return inner(*args, **kwargs)  # a removal inside ``clear``: counted there
            t = time.perf_counter()
            depth[0] += 1
            try:
                return inner(*args, **kwargs)
            finally:
                depth[0] -= 1
                into.append((t, time.perf_counter()))

        setattr(owner, name, timed)
        self._undo.append((owner, name, real))

    def clear(self) -> None:
        self.built.clear()
        self.added.clear()
        self.removed.clear()

    def restore(self) -> None:
        for owner, name, real in reversed(self._undo):
            if real is None:
                delattr(owner, name)
            else:
                setattr(owner, name, real)

    def intervals(self) -> list[tuple[float, float]]:
        """All intervals, nested ones (a Labels layer built inside ``add_labels``) merged."""
        merged: list[list[float]] = []
        for a, b in sorted(self.built + self.added + self.removed):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return [(a, b) for a, b in merged]

    def summary(self) -> str:
        """"n built: ms; n added: ms (max)", or "-" when napari made no layer."""
        parts = []
        for what, spans in (("built", self.built), ("added", self.added),
                            ("removed", self.removed)):
            ms = [1000 * (b - a) for a, b in spans]
            if ms:
                parts.append(f"{len(ms)} {what}: {sum(ms):.0f} ms (max {max(ms):.0f})")
        return "; ".join(parts) or "-"


class GilWatch:
    """Every thread's stack at the moment the main thread is late: who holds the GIL.

    A sampler thread looks every 20 ms; when the main thread's last heartbeat
    (:meth:`tick`) is ``late_s`` old it writes every thread's Python stack
    (``sys._current_frames``) to ``path``, at most once per gap. The sampler
    needs the GIL to run, so a stack is where the holder was when it let go,
    in the same call as a rule. (``faulthandler.dump_traceback_later``, the C
    watchdog used before, dumps while the holder holds it, but its all-threads
    dump walks thread states that a thread starting or ending frees: a walk
    ended in "Segmentation fault".) The next heartbeat writes
    ``# late <ms> at <s> in <step>`` after the stacks.
    """

    def __init__(self, path: Path, late_s: float = 0.12) -> None:
        self.path, self.late_s = path, late_s
        self.step = "-"
        self._out = path.open("w")
        self.t0 = time.perf_counter()
        self._last = float("inf")  # paused until the first step's heartbeat
        self._dumped = False
        self._lock = threading.Lock()
        threading.Thread(target=self._sample, name="gil-watch", daemon=True).start()

    def tick(self) -> None:
        now = time.perf_counter()
        with self._lock:
            if now - self._last > self.late_s:
                self._out.write(f"# late {1000 * (now - self._last):.0f} ms at "
                                f"{self._last - self.t0:.2f} s in {self.step}\n")
                self._out.flush()
            self._last, self._dumped = now, False

    def _sample(self) -> None:
        names = {}
        while True:
            time.sleep(0.02)
            with self._lock:
                late = time.perf_counter() - self._last
                if late <= self.late_s or self._dumped:
                    continue
                self._dumped = True
                frames = sys._current_frames()
                names = {t.ident: t.name for t in threading.enumerate()}
                self._out.write(f"## {1000 * late:.0f} ms late, in {self.step}\n")
                for ident, frame in frames.items():
                    self._out.write(f"Thread {names.get(ident, ident)}:\n")
                    self._out.write("".join(traceback.format_stack(frame)[-30:]))
                del frames

    def pause(self) -> None:
        """No dumps between steps (the walk's own waits)."""
        with self._lock:
            self._last = float("inf")


class FullCollections:
    """Python's full (generation 2) garbage collections, in any thread: each holds the GIL
    over every tracked object (napari with torch imported: ~560,000, 1.2 s at load 11)."""

    def __init__(self, out=None) -> None:
        import gc

        self.spans: list[float] = []
        self._start = 0.0
        self._out = out  # with --gil-dump: who set each one off, and how much it walked
        self.step = ""
        gc.callbacks.append(self._seen)

    def _seen(self, phase: str, info: dict) -> None:
        import gc

        if info.get("generation") != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
            if self._out is not None:
                # Who allocates when the collection starts: its thread's stack (its caller,
                # when gc.collect() is called), and the objects it walks (not frozen ones).
                self._out.write(
                    f"## full collection in {self.step}: thread "
                    f"{threading.current_thread().name}; frozen {gc.get_freeze_count()}, "
                    f"tracked {sum(gc.get_count())} young\n"
                    + "".join(traceback.format_stack()[-14:-1]))
        else:
            self.spans.append(1000 * (time.perf_counter() - self._start))
            if self._out is not None:
                self._out.write(f"# the collection took {self.spans[-1]:.0f} ms, "
                                f"collected {info.get('collected')}\n")
                self._out.flush()

    def summary(self) -> str:
        """"n: longest ms" of the collections since the last call (and forgets them)."""
        spans, self.spans = self.spans, []
        return f"{len(spans)}: longest {max(spans):.0f} ms" if spans else "0"


def gaps_outside_ms(ticks: list[float], spans: list[tuple[float, float]]) -> np.ndarray:
    """Each heartbeat gap less the part of it spent inside ``spans`` (merged, sorted)."""
    out = []
    for a, b in zip(ticks[:-1], ticks[1:], strict=True):
        inside = sum(max(0.0, min(b, e) - max(a, s)) for s, e in spans)
        out.append(1000 * (b - a - inside))
    return np.asarray(out)


def walk(args: argparse.Namespace) -> int:
    """The user's walk, step by step; prints one table (see the module's docstring)."""
    import napari
    from qtpy.QtWidgets import QApplication

    from napari_finetune.samples import sample_shape

    tmp = Path(tempfile.mkdtemp(prefix="bench-walk-"))
    # An empty cache: the sample's first opening, as on a user's first day.
    os.environ["NAPARI_FINETUNE_CACHE"] = str(tmp / "cache")
    if args.shape:  # else the sample a user opens (no environment variable)
        os.environ["NAPARI_FINETUNE_SAMPLE_SHAPE"] = args.shape
    shape = sample_shape()
    viewer = napari.Viewer()
    app = QApplication.instance()
    napari_work = NapariLayerWork()
    rows: list[tuple[str, ...]] = []
    box: dict = {}

    watch = GilWatch(Path(args.gil_dump)) if args.gil_dump else None
    collections = FullCollections(watch._out if watch is not None else None)

    def step(name: str, action, done, settle_s: float = 0.3, timeout_s: float = 600) -> None:
        if watch is not None:
            watch.step = name
        collections.step = name
        napari_work.clear()
        collections.summary()  # forgets those before the step
        meter = Meter(False, watch)
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
        if watch is not None:
            watch.pause()
        gaps = meter.gaps_ms()
        outside = gaps_outside_ms(meter.ticks, napari_work.intervals())
        rows.append((name, f"{wall:.2f} s", f"{gaps.max():.0f} ms", f"{outside.max():.0f} ms",
                     napari_work.summary(), collections.summary()))

    idle = Meter(False)
    idle.start()
    _wait(app, lambda: time.perf_counter() - idle.t0 > args.idle)
    idle.stop()
    floor = f"{idle.gaps_ms().max():.0f} ms"
    rows.append(("idle window (the floor)", f"{args.idle:.1f} s", floor, floor, "-", "-"))

    step("open the sample (first time: empty cache)",
         lambda: viewer.open_sample("napari-finetune", "synthetic-em"), lambda: True)

    def dock() -> None:
        _, box["w"] = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")

    # To the panel shown (its modules are imported in a thread, then it is built); Predict
    # comes at once.
    step("dock the widget", dock, lambda: _panel(box["w"]) is not None, settle_s=0.0)
    w = _panel(box["w"])
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

    painted = {"n": 0}

    def paint() -> None:
        from qtpy.QtCore import QTimer

        w.new_corrections_button.click()
        layer = w.corrections_combo.value  # the new one, which the user paints into
        layer.brush_size = 7
        truth = np.asarray(viewer.layers["ground truth"].data)
        rng = np.random.default_rng(0)

        def stroke() -> None:
            # One stroke per event-loop turn, as a user's mouse events come (12 in one
            # call measured their sum, ~15 ms each, as one gap).
            z, y, x = (int(rng.integers(0, n)) for n in shape)
            layer.paint((z, y, x), 1 + int(truth[z, y, x]))
            painted["n"] += 1
            if painted["n"] < 12:
                QTimer.singleShot(20, stroke)

        QTimer.singleShot(20, stroke)

    step("New corrections layer + 12 strokes (one a turn)", paint,
         lambda: painted["n"] == 12 and w.state.busy is None, 1.0)
    s = w.settings
    s.steps.value, s.batch_size.value, s.mode.value = args.steps, args.batch, args.mode
    s.preview_interval.value, s.device.value = args.preview, args.device
    step("Fine-tune (click to the first step)", w.finetune_button.click,
         lambda: any(st.kind == "step" for st in w.state.statuses))

    def steps_done() -> int:
        return sum(st.kind == "step" for st in w.state.statuses)

    # The run going on, previews and all: the goal's 100 ms above the idle floor.
    first = steps_done()
    step(f"training runs ({args.running_steps} more steps)", lambda: None,
         lambda: steps_done() >= first + args.running_steps
         or w.state.busy is None, settle_s=0.0)
    at: dict[str, float] = {}

    def seen(event) -> None:  # when the run ended, the view and the rest were shown
        name = type(event).__name__
        if name == "RegionPredicted":  # the view comes in tiles, its centre first
            at.setdefault("first tile shown", time.perf_counter())
            at["view shown"] = time.perf_counter()  # the last tile's
        elif name == "Progress" and event.what == "predict":
            at.setdefault("predicting", time.perf_counter())

    def busy_seen(busy) -> None:
        at.setdefault("run ended" if busy is None else f"busy {busy}", time.perf_counter())

    session = w.controller.session
    session.events.job_event.connect(seen)
    session.events.busy.connect(busy_seen)
    clicked = time.perf_counter()
    step("Stop (to the weights kept and the prediction redone)", w.stop_button.click,
         lambda: w.state.busy is None and w.state.running == 0, 1.0)
    session.events.job_event.disconnect(seen)
    session.events.busy.disconnect(busy_seen)
    # After the click: the step in progress and the run's close, the prediction's first
    # block, the view (the slice on screen) in the layers.
    said = "; ".join(f"{k} after {v - clicked:.2f} s"
                     for k, v in sorted(at.items(), key=lambda kv: kv[1]))
    rows[-1] = (rows[-1][0] + f" [{said}]", *rows[-1][1:])

    def objects_done() -> bool:
        text = w.objects_label.text()
        return (text != "computing objects…" and w.state.busy is None
                and w.state.running == 0)

    def click_objects() -> None:
        box["objects_enabled"] = w.objects_button.isEnabled()
        w.objects_button.click()

    step("Objects (to the objects layers shown)", click_objects, objects_done, 1.0)
    rows[-1] = (rows[-1][0] + f" [{w.objects_label.text()[:60]}"
                + ("" if box["objects_enabled"] else "; button disabled") + "]", *rows[-1][1:])
    from napari_finetune._qt import results

    target = str(tmp / "exported.pt")
    step("Export (results.export, no file dialog)",
         lambda: results.export(w.controller, target),
         lambda: w.state.busy is None and Path(target).exists())

    errors = list(w.state.errors)  # the close below may clear the widget's state
    # Closing napari while a prediction runs: the close waits for the job to end (the
    # Session's Stop ends a prediction between batches) and blocks the main thread.
    box["predicting"] = False

    def predicting() -> bool:  # the job has begun: the user closes in the middle of it
        return w.state.busy is not None and w.state.running > 0

    w.predict_button.click()
    _wait(app, predicting, 120)
    threads_before = {t.ident for t in threading.enumerate()}
    close_work, spent = w.close_work, []

    def timed_close_work(wait_s: float) -> bool:  # the plugin's share of the close
        t = time.perf_counter()
        try:
            return close_work(wait_s)
        finally:
            spent.append(time.perf_counter() - t)

    w.close_work = timed_close_work
    step("close napari during a prediction", viewer.close, lambda: True, settle_s=0.3)
    left = [t.name for t in threading.enumerate()
            if t.ident in threads_before and t.name.startswith("napari-finetune")]
    rows[-1] = (rows[-1][0] + (f" [still running: {', '.join(left)}" if left
                               else " [its threads ended")
                + f"; the widget's close_work {1000 * sum(spent):.0f} ms]", *rows[-1][1:])

    print(f"# bench_ui_stall --walk: image {shape}; {args.mode}; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f}")
    head = ("step", "wall", "longest gap", "longest gap outside napari's layer work",
            "napari's layer work (main thread)", "full GC collections (any thread)")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, tuple("-" * n for n in widths), *rows]:
        print("| " + " | ".join(f"{c:<{n}}" for c, n in zip(r, widths, strict=True)) + " |")
    if errors:
        print("errors:", *errors, sep="\n  ")
    napari_work.restore()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default=None,
                        help="sample shape z,y,x (default: 32,128,128; with --walk, the "
                             "sample a user opens, 64,256,256)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--running-steps", type=int, default=3,
                        help="with --walk: the steps timed after the first, the run going on")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--mode", choices=["lora", "full"], default="lora")
    parser.add_argument("--preview", type=float, default=1.0, help="preview interval, s")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--idle", type=float, default=5.0,
                        help="seconds measured with nothing running first (the machine's floor)")
    parser.add_argument("--no-predict", action="store_true",
                        help="click Fine-tune before any Predict (the click adds the layers)")
    parser.add_argument("--diagnose", action="store_true")
    parser.add_argument("--gil-dump", default=None, metavar="FILE",
                        help="with --walk: every thread's stack into FILE whenever the main "
                             "thread's heartbeat is 120 ms late (GilWatch)")
    parser.add_argument("--walk", action="store_true",
                        help="time the user's walk: open the sample, dock, Predict, paint, "
                             "Fine-tune, Stop, Objects, Export, close while predicting")
    args = parser.parse_args(argv)
    if args.walk:
        return walk(args)
    shape = tuple(int(s) for s in (args.shape or "32,128,128").split(","))
    tmp = Path(tempfile.mkdtemp(prefix="bench-ui-"))
    os.environ.setdefault("NAPARI_FINETUNE_CACHE", str(tmp / "cache"))

    import napari
    from qtpy.QtWidgets import QApplication

    store, ckpt, what = _store_and_checkpoint(shape, tmp)
    viewer = napari.Viewer()
    app = QApplication.instance()
    viewer.open(str(store), plugin="napari-finetune")
    t = time.perf_counter()
    _, dock = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")
    _wait(app, lambda: _panel(dock) is not None)
    widget = _panel(dock)
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
