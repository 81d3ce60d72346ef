"""A napari session as a user drives it, ended one way; run by test_shutdown.py in a subprocess.

Usage::

    python shutdown_app.py CASE STORE CHECKPOINT OUT_DIR

Opens STORE with the plugin's reader, docks the widget, reads CHECKPOINT,
makes a corrections layer and paints, then ends as CASE says:

``close-mid-run``       Fine-tune, wait for the first optimizer step, close the viewer.
``quit-mid-run``        Fine-tune, wait for the first step, ``QApplication.quit()``.
``stroke-then-close``   a stroke, half a second, another stroke, close at once
                        (well inside the autosave delay).
``remove-dock-mid-run`` Fine-tune, wait for the first step, remove the dock, wait for
                        the run to end, close the viewer.
``close-mid-predict``   Predict, wait for the prediction's job to begin, close the viewer
                        (from a script: ``viewer.close()`` then the process' own exit).
``exit-without-close``  a stroke, then the script ends with napari open (no close, no
                        event loop of its own): the interpreter's exit ends the session.
``close-then-exit``     as ``close-mid-run``, in a script that runs no event loop of its
                        own (``processEvents`` until the first step), so the process
                        exits right after the close, with the step still computing.

Everything is driven from Qt timers inside ``napari.run()``, as a user's
clicks would be. What the painting was when the session ended goes to
``OUT_DIR/expected.npy``; one line per milestone goes to stdout. A session
that has not ended after 120 s exits with code 3.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

CASES = ("close-mid-run", "quit-mid-run", "stroke-then-close", "remove-dock-mid-run",
         "close-then-exit", "close-mid-predict", "exit-without-close")


T0 = time.monotonic()


def say(line: str) -> None:
    print(f"{time.monotonic() - T0:6.2f} s  {line}", flush=True)


def main(case: str, store: str, checkpoint: str, out: Path) -> None:
    import napari
    from qtpy.QtCore import QTimer
    from qtpy.QtWidgets import QApplication

    viewer = napari.Viewer()
    viewer.open(store, plugin="napari-finetune")
    dock, shown = viewer.window.add_plugin_dock_widget("napari-finetune", "Fine-tune")
    while shown.panel is None:  # built in a later event-loop turn, once imported
        QApplication.processEvents()
        time.sleep(0.01)
    widget = shown.panel
    widget.checkpoint_edit.setText(checkpoint)
    widget.checkpoint_edit.editingFinished.emit()
    state = widget.state
    plan: list = []  # (condition, action) pairs, done in order from a polling timer
    started = time.monotonic()

    def layer():
        return viewer.layers["corrections"]

    def record_and(action):
        """What is painted now is what the store must hold after ``action`` ends the session."""
        def run() -> None:
            np.save(out / "expected.npy", np.asarray(layer().data))
            action()
        return run

    def paint_first() -> None:
        widget.new_corrections_button.click()
        layer().brush_size = 5
        for z in (6, 8):
            layer().paint((z, 24, 24), 3)
            layer().paint((z, 8, 40), 1)
        say("painted")

    def start_run() -> None:
        s = widget.settings
        s.steps.value = 100_000
        s.batch_size.value = 1
        s.mode.value = "full"
        s.device.value = "cpu"
        s.preview_interval.value = 0.2
        widget.finetune_button.click()
        say("fine-tune clicked")

    def stepped() -> bool:
        return any(st.kind == "step" for st in state.statuses)

    def second_stroke() -> None:
        layer().paint((10, 40, 44), 3)
        say("second stroke")

    def close() -> None:
        say("closing")
        viewer.close()

    def quit_app() -> None:
        say("quitting")
        QApplication.instance().quit()

    def remove_dock() -> None:
        say("removing dock")
        viewer.window.remove_dock_widget(dock)

    t: dict[str, float] = {}
    plan.append((lambda: state.info is not None, paint_first))
    if case == "stroke-then-close":
        plan.append((lambda: True, lambda: t.setdefault("first", time.monotonic())))
        plan.append((lambda: time.monotonic() - t["first"] > 0.5, second_stroke))
        plan.append((lambda: True, record_and(close)))
    elif case == "exit-without-close":
        def stroke_last() -> None:
            # Well inside the autosave delay: only the exit can save this stroke.
            second_stroke()
            np.save(out / "expected.npy", np.asarray(layer().data))

        plan.append((lambda: True, stroke_last))
    elif case == "close-mid-predict":
        def predict() -> None:
            widget.predict_button.click()
            say("predict clicked")

        plan.append((lambda: True, predict))
        plan.append((lambda: state.busy is not None and state.running > 0, record_and(close)))
    else:
        plan.append((lambda: True, start_run))
        finish = {"close-mid-run": close, "close-then-exit": close, "quit-mid-run": quit_app,
                  "remove-dock-mid-run": remove_dock}[case]
        plan.append((stepped, record_and(finish)))
        if case == "remove-dock-mid-run":
            plan.append((lambda: state.busy is None, lambda: say("run ended")))
            plan.append((lambda: True, close))

    def tick() -> None:
        if time.monotonic() - started > 120:
            say("timed out")
            sys.stdout.flush()
            import os

            os._exit(3)
        while plan and plan[0][0]():
            action = plan.pop(0)[1]
            action()
            if action is not second_stroke:
                return  # one action per event-loop turn, except: close at once after a stroke

    if case in ("close-then-exit", "close-mid-predict", "exit-without-close"):
        app = QApplication.instance()
        while plan:
            app.processEvents()
            tick()
            time.sleep(0.01)
    else:
        poll = QTimer()
        poll.setInterval(20)
        poll.timeout.connect(tick)
        poll.start()
        napari.run()
        poll.stop()
    kinds = [st.kind for st in state.statuses]
    say(f"event loop ended; jobs still counted {state.running}; statuses {kinds}")


if __name__ == "__main__":
    name, store_path, ckpt_path, out_dir = sys.argv[1:5]
    if name not in CASES:
        raise SystemExit(f"unknown case {name!r}; one of {', '.join(CASES)}")
    main(name, store_path, ckpt_path, Path(out_dir))
