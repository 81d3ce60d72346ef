"""A run hides the objects that existed before it from the garbage collector, and only then."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

from engine_setup import make_trainer

from napari_finetune import testing
from napari_finetune.trainer import collector


class Node:
    """A reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_a_run_freezes_what_came_before_it_and_gives_it_back(unfrozen):
    cycle = Node()
    gone = weakref.ref(cycle)
    trainer = make_trainer(steps=2)
    run = trainer.run()
    first = next(run)
    assert gc.get_freeze_count() > 0, first.message
    del cycle
    gc.collect()
    assert gone() is not None  # hidden while the run lasts: its collections are cheap
    assert [e.kind for e in run][-1] == "finished"
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None  # handed back: collected as before the run


def test_the_failed_attempts_tensors_are_freed_while_the_freeze_holds(unfrozen):
    trainer = make_trainer(steps=1, batch_size=4, distillation=0.0, hold_other_channels=False)
    trainer.build()
    refs = []
    trainer.model.encoders[0].register_forward_hook(
        lambda module, args, output: refs.append(weakref.ref(output)))
    run = trainer.run()
    assert next(run).kind == "probe"
    assert gc.get_freeze_count() > 0
    refs.clear()
    testing.oom_in_backward_above_batch(trainer.model.head, 2, times=1)
    assert next(run).kind == "recovery"
    assert refs and all(r() is None for r in refs), "the failed attempt's tensors are alive"
    assert [e.kind for e in run] == ["step", "finished"]
    assert gc.get_freeze_count() == 0


def test_a_run_stopped_midway_gives_the_objects_back(unfrozen):
    run = make_trainer(steps=50).run()
    next(run)
    assert gc.get_freeze_count() > 0
    run.close()  # a napari worker that quit, an abandoned generator
    assert gc.get_freeze_count() == 0


def test_a_freeze_made_before_the_run_is_left_as_it_was(unfrozen):
    gc.freeze()  # a host that froze its own start-up objects
    cycle = Node()  # garbage made after the host's freeze, before the run
    gone = weakref.ref(cycle)
    del cycle
    trainer = make_trainer(steps=1)
    assert [e.kind for e in trainer.run()][-1] == "finished"
    assert gc.get_freeze_count() > 0  # the host's freeze still holds
    gc.collect()
    assert gone() is None  # and the run froze nothing of its own


def test_overlapping_holders_unfreeze_once_the_last_ends(unfrozen):
    first = collector.hide_existing_objects()
    second = collector.hide_existing_objects()
    assert first and second
    collector.show_again(first)
    assert gc.get_freeze_count() > 0  # the second still holds it
    collector.show_again(second)
    assert gc.get_freeze_count() == 0


# A user's process: no conftest, nothing frozen before the run.
FRESH_RUN = """
import gc, json, weakref
start = gc.get_freeze_count()
from engine_setup import make_trainer

class Node:
    def __init__(self):
        self.me = self

cycle = Node()
gone = weakref.ref(cycle)
run = make_trainer(steps=2).run()
first = next(run)
during = gc.get_freeze_count()
del cycle
gc.collect()
held = gone() is not None
kinds = [first.kind] + [e.kind for e in run]
after = gc.get_freeze_count()
gc.collect()
print(json.dumps(dict(start=start, during=during, held=held, kinds=kinds, after=after,
                      collected=gone() is None)))
"""


def test_a_run_in_a_fresh_process_freezes_while_it_lasts_and_unfreezes_after():
    here = Path(__file__).resolve().parent
    path = os.pathsep.join(
        [str(here), *filter(None, [os.environ.get("PYTHONPATH")]), *sys.path]
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", FRESH_RUN],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    seen = json.loads(stdout.strip().splitlines()[-1])
    assert seen["start"] == 0  # nothing frozen before the run, as in a user's process
    assert seen["during"] > 10_000, seen  # the run hid torch, numpy and the rest
    assert seen["held"], "a cycle made before the run was collected during it"
    assert seen["kinds"][-1] == "finished" and seen["kinds"].count("step") == 2, seen
    assert seen["after"] == 0, "the run did not hand the frozen objects back"
    assert seen["collected"], "the cycle made before the run was not collected after it"
