"""How long does a worker's garbage collection freeze napari, with and without a run's freeze?

Recovery from an out-of-memory error and every autobatch profile point call
``gc.collect()`` in the training thread; a full collection holds the GIL, so
napari's main thread waits for it. This opens napari with the synthetic-em
sample and the Fine-tune widget (its checkpoint read), then a worker thread
collects ``--collections`` times, ``--gap`` seconds apart, while a 10 ms QTimer
on the main thread measures its own gaps: once as before any run, once while
:func:`napari_finetune.trainer.collector.hide_existing_objects` holds (as it
does for the whole of a run).

    xvfb-run -a -s "-screen 0 1280x1024x24" .venv/bin/python benchmarks/bench_gc_pause.py
    ... --shape 32,256,256 --collections 5 --gap 0.2
"""

from __future__ import annotations

import argparse
import gc
import os
import threading
import time

import numpy as np
from bench_ui_stall import Meter
from markdown_table import print_header, print_table


def collect_in_a_worker(app, collections: int, gap_s: float) -> tuple[list[float], np.ndarray]:
    """(each collection's seconds in the worker, the main thread's timer gaps in ms)."""
    took: list[float] = []

    def work() -> None:
        for _ in range(collections):
            time.sleep(gap_s)
            start = time.perf_counter()
            gc.collect()
            took.append(time.perf_counter() - start)

    meter = Meter(diagnose=False)  # the UI-stall benchmark's 10 ms ticks
    worker = threading.Thread(target=work)
    meter.start()
    worker.start()
    while worker.is_alive():
        app.processEvents()
        time.sleep(0.002)
    meter.stop()
    return took, meter.gaps_ms()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="32,256,256", help="sample shape z,y,x")
    parser.add_argument("--collections", type=int, default=5)
    parser.add_argument("--gap", type=float, default=0.2, help="seconds between collections")
    args = parser.parse_args()
    os.environ["NAPARI_FINETUNE_SAMPLE_SHAPE"] = args.shape
    import napari
    from qtpy.QtWidgets import QApplication

    from napari_finetune.trainer import collector

    viewer = napari.Viewer()
    viewer.open_sample("napari-finetune", "synthetic-em")
    _, dock = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")
    app = QApplication.instance()
    deadline = time.monotonic() + 120
    while dock.panel is None and time.monotonic() < deadline:  # built in later turns
        app.processEvents()
        time.sleep(0.02)
    widget = dock.panel
    while (widget.state.info is None or widget.state.running) and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.02)
    import napari_finetune.trainer.loop  # noqa: F401 (what a run imports, before it starts)

    gc.unfreeze()  # as a user's process is: nothing frozen yet
    rows = []
    for name, frozen in (("as before a run", False), ("while a run holds the freeze", True)):
        held = collector.hide_existing_objects() if frozen else False
        try:
            took, gaps = collect_in_a_worker(app, args.collections, args.gap)
        finally:
            collector.show_again(held)
        rows.append([name, f"{len(gc.get_objects()):,}",
                     f"{1000 * min(took):.2f}", f"{1000 * max(took):.2f}",
                     f"{gaps.max():.0f}", str(int((gaps > 50).sum()))])
    print_header(f"Full gc.collect() in a worker thread, napari with the sample {args.shape} "
                 f"and the widget docked; {args.collections} collections {args.gap} s apart")
    print_table(["", "objects tracked", "collect min ms", "collect max ms",
                 "longest main-thread gap ms", "gaps > 50 ms"], rows)
    viewer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
