"""Several processes (gloo, CPU, 2 real ranks): one ladder agreed by every rank.

Each test starts real processes with the environment torchrun would give them
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``): the library
through ``ddp_rank.py``, the command line through ``python -m
napari_finetune.cli``. A timeout guards every wait, so a hang fails the test.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_setup import make_trainer

from napari_finetune import testing
from napari_finetune.trainer.build import make_sampler
from napari_finetune.trainer.distributed import per_rank_config
from napari_finetune.trainer.sync import LocalSync

# Ports picked then released: one test of this module at a time (see `resource`).
pytestmark = pytest.mark.resource

HERE = Path(__file__).parent
WAIT_S = 120  # far above a 5-step run of the tiny set-up (about 10 s here)


def _free_port() -> int:
    """A free port below the kernel's ephemeral range.

    The port is released before rank 0 binds it. A port the kernel hands out (port 0)
    could in that gap go to a socket of a test running beside this one (the LocalCluster,
    any connection); below the ephemeral range only an explicit bind takes it, and the
    tests that bind these are this module's, one at a time (marked ``resource``).
    """
    low = 32768  # Linux's default start of the range, where /proc is not there to say
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError):
        pass
    # SystemRandom: not reseeded per test, so a port in TIME_WAIT is not tried first again.
    for port in random.SystemRandom().sample(range(low - 8000, low), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low - 8000}..{low - 1}")


def _env(rank: int, port: int, world: int = 2) -> dict[str, str]:
    return {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }


def run_ranks(out: Path, *scenarios: str) -> dict[str, list[dict]]:
    """Both ranks of ``ddp_rank.py``, the scenarios one after another; what each wrote."""
    scenario = ", ".join(scenarios)
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "ddp_rank.py"), str(out), *scenarios],
            env=_env(rank, port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=WAIT_S)[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"the ranks of {scenario!r} did not finish within {WAIT_S} s (a hang)")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, text in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, text
    return {
        name: [torch.load(out / name / f"rank-{r}.pt", weights_only=False) for r in range(2)]
        for name in scenarios
    }


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory) -> dict[str, list[dict]]:
    """The default run's scenarios on one pair of processes (one start, one group)."""
    return run_ranks(tmp_path_factory.mktemp("ddp"), "plain", "oom", "nan", "validation")


@pytest.fixture(scope="module")
def plain(shared_runs) -> list[dict]:
    return shared_runs["plain"]


def _same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _steps(events: list) -> list[int]:
    return [step for kind, step, *_ in events if kind == "step"]


def test_ranks_whose_schedules_differ_check_at_the_same_steps_and_keep_the_same_weights(
    shared_runs,
):
    """A check is due on every rank when it is due on one (each rank's clock differs),
    so keep-best compares the same checks everywhere and the ranks end identical."""
    ranks = shared_runs["validation"]
    histories = [r["record"]["validation_history"] for r in ranks]
    assert [step for step, _ in histories[0]] == [1, 2, 3, 4, 5]
    assert histories[1] == histories[0]
    assert ranks[1]["record"]["weights_from_step"] == ranks[0]["record"]["weights_from_step"]
    _same_weights(ranks[0]["weights"], ranks[1]["weights"])


def test_two_ranks_train_as_one_process_on_both_ranks_samples(plain):
    _same_weights(plain[0]["weights"], plain[1]["weights"])
    assert plain[0]["record"]["ranks"] == 2 and _steps(plain[0]["events"]) == [1, 2, 3, 4, 5]
    # One process, 4 samples a step: rank 0's 2 and rank 1's 2, drawn as they drew them.
    ref = make_trainer(norm="none", steps=5, batch_size=4)
    ref.build()
    samplers = [
        make_sampler(ref.image, ref.corrections, ref.config, ref.normalization_range,
                     ref.out_channels, rank=rank)
        for rank in (0, 1)
    ]
    for _ in range(5):
        draws = [sampler.sample(2) for sampler in samplers]
        images = np.concatenate([d[0] for d in draws])
        labels = np.concatenate([d[1] for d in draws])
        list(ref.optimizer_step(images, labels))
    expected = ref.model.state_dict()
    for key, value in plain[0]["weights"].items():
        torch.testing.assert_close(value, expected[key], rtol=1e-4, atol=1e-6)
    start = make_trainer(norm="none").model.state_dict()
    assert all(not torch.allclose(start[k], expected[k]) for k in start)  # every weight moved


def test_an_oom_on_one_rank_steps_every_rank_down_together(shared_runs, plain):
    ranks = shared_runs["oom"]
    _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    for rank in ranks:
        events = rank["events"]
        assert _steps(events) == [1, 2, 3, 4, 5]  # none lost, none doubled
        downs = [e for e in events if e[0] == "recovery" and e[5].startswith("out of memory")]
        assert len(downs) == 1 and downs[0][1] == 2
        assert downs[0][5].startswith("out of memory at step 3: batch 2 → 1, accumulation 1 → 2")
        assert events[-1][2:4] == (1, 2)
    # Cut 1 + 1 instead of 2, the same samples: the same weights as the run without OOM.
    for key, value in ranks[0]["weights"].items():
        torch.testing.assert_close(value, plain[0]["weights"][key], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_an_oom_after_one_ranks_optimizer_step_is_undone_on_every_rank(tmp_path, plain):
    ranks = run_ranks(tmp_path, "oom-after-step")["oom-after-step"]
    assert ranks[1]["fired"] == 1 and ranks[0]["fired"] == 0
    _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    for rank in ranks:
        assert _steps(rank["events"]) == [1, 2, 3, 4, 5]
    # Rank 0's applied update was put back too: step 3 counted once on both.
    for key, value in ranks[0]["weights"].items():
        torch.testing.assert_close(value, plain[0]["weights"][key], rtol=1e-4, atol=1e-6)


class _AnotherRankChoseOne(LocalSync):
    """This process alone, answering as if another rank's autobatch chose batch 1."""

    def smallest(self, value: int) -> int:
        return min(value, 1)


def test_autobatch_takes_the_smallest_micro_batch_of_the_ranks():
    trainer = make_trainer(batch_size=8, autobatch=True, sync=_AnotherRankChoseOne())
    trainer.build()
    with testing.MemoryBudget(10**9) as budget:
        trainer.memory_info = budget
        status = trainer.choose_micro_batch()
    assert trainer.autobatch_decision.applied and trainer.autobatch_decision.batch_size > 1
    assert (trainer.batch_size, trainer.accumulation) == (1, 8)
    assert status.message.endswith("micro-batch 1 × 8, the smallest of the ranks")


def test_a_nan_on_one_rank_sends_every_rank_to_fp32(shared_runs):
    ranks = shared_runs["nan"]
    assert ranks[0]["fired"] >= 1 and ranks[1]["fired"] == 0  # rank 0's NaN alone
    _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    for rank in ranks:
        events = rank["events"]
        assert _steps(events) == [1, 2, 3, 4, 5]
        probe = [e for e in events if e[0] == "probe"]
        assert probe[-1][5].startswith("precision probe: non-finite loss or gradients under")
        assert [e[4] for e in events if e[0] == "step"] == ["float32"] * 5
        assert rank["record"]["fell_back_to_fp32"] and rank["record"]["final_dtype"] == "float32"


def _read_lines(stream, lines: list[str]) -> None:
    for line in stream:
        lines.append(line)


def _read_chunks(stream, chunks: list[str]) -> None:
    # os.read returns what is there; a text stream's read(n) may wait for a full buffer.
    while chunk := os.read(stream.fileno(), 4096):
        chunks.append(chunk.decode(errors="replace"))


def _bar_steps(text: str) -> int:
    """The largest step count the tqdm bar has shown (``"  3/500"``)."""
    return max((int(n) for n in re.findall(r"(\d+)/500 \[", text)), default=0)


def _shown_lines(text: str) -> list[str]:
    """The lines a terminal shows, less the progress bar's."""
    shown = (line.rsplit("\r", 1)[-1] for line in text.splitlines())
    return [line for line in shown if line.strip() and not re.search(r"\d+/500 \[", line)]


def test_a_killed_rank_ends_the_other_with_one_line_not_a_hang(tmp_path, painted_store, checkpoint):
    out = tmp_path / "tuned.pt"
    port = _free_port()
    argv = [
        sys.executable, "-m", "napari_finetune.cli", "train", str(painted_store), "-c",
        str(checkpoint), "-o", str(out), "--steps", "500", "--patch-shape", "8", "16", "16",
        "--batch-size", "2", "--device", "cpu", "--collective-timeout", "20",
    ]  # not quiet: rank 0's bar shows its steps (rank 1 never draws one)
    procs = [
        subprocess.Popen(argv, env=_env(rank, port), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    try:
        stdout: list[str] = []
        stderr: list[str] = []
        readers = [
            threading.Thread(target=_read_lines, args=(procs[0].stdout, stdout), daemon=True),
            threading.Thread(target=_read_chunks, args=(procs[0].stderr, stderr), daemon=True),
        ]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + WAIT_S
        # Two applied steps, not a guessed time: under load a step can take seconds.
        while _bar_steps("".join(stderr)) < 2:
            assert time.monotonic() < deadline, "rank 0 never showed two steps"
            assert procs[0].poll() is None, "".join(stderr)
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGKILL)
        started = time.monotonic()
        code = procs[0].wait(timeout=60)
        took = time.monotonic() - started
        readers[1].join(timeout=30)
        err = "".join(stderr)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert code == 1, err
    lines = _shown_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "lost a process" in lines[0] and "rank 0 of 2 lost the other ranks" in lines[0]
    assert took < 30  # within the 20 s collective timeout and a margin: never a hang
    from napari_finetune.model.checkpoint import load_checkpoint

    # The last good step is kept: rank 0 had applied at least the two its bar showed.
    run = load_checkpoint(out).metadata["run"]
    done = run["steps_done"]
    assert 2 <= done < 500 and run["ended"].startswith(f"lost a process at step {done + 1}: ")
    assert lines[0].startswith(
        f"napari-finetune train: error: lost a process at step {done + 1} after {done}/500 steps: "
    )
    assert lines[0].endswith(f"; exported {out}")


def test_the_lost_line_names_the_failures_first_line_or_its_type():
    """A collective's error runs over many lines (gloo's context, frames): the line keeps
    the first one that says something, and the type's name when nothing does."""
    from napari_finetune.trainer.distributed import lost_line

    exc = RuntimeError("\n  [gloo] Connection closed by peer\nat frame 3\n")
    assert "lost the other ranks ([gloo] Connection closed by peer);" in lost_line(1, 2, exc)
    assert "lost the other ranks (RuntimeError);" in lost_line(1, 2, RuntimeError("  "))


def test_global_samples_are_shared_between_the_ranks():
    config = make_trainer(batch_size=4, accumulation=2).config
    assert per_rank_config(config, 2) is config
    shared = per_rank_config(config, 2, global_samples=8)
    assert (shared.batch_size, shared.accumulation) == (4, 1)
    odd = per_rank_config(config, 2, global_samples=6)
    assert (odd.batch_size, odd.accumulation) == (3, 1)
    with pytest.raises(ValueError, match="multiple of 2"):
        per_rank_config(config, 2, global_samples=7)
