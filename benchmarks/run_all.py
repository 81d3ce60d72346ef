"""Re-measure the tables of docs/benchmarks.md: every benchmark, one after another.

Each script runs in its own process (``--quick`` picks the settings of a few
minutes each) and its tables are printed under one line that says the commit,
the date, the machine and its load average when it started
(``markdown_table.measured_under``), so a table pasted into the docs carries
where it came from. The napari benchmark runs under ``xvfb-run`` when there is
no display. A script that fails is reported and the others still run; the exit
code says whether all passed.

    python benchmarks/run_all.py --quick              # make bench
    python benchmarks/run_all.py --only predict throughput
    python benchmarks/run_all.py --list
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from markdown_table import measured_under

HERE = Path(__file__).resolve().parent

# name: (script, arguments of the full run, arguments of the quick run, needs a display)
BENCHMARKS: dict[str, tuple[str, list[str], list[str], bool]] = {
    "throughput": ("bench_trainer_throughput.py", ["--rounds", "9", "--block", "20"],
                   ["--rounds", "4", "--block", "10"], False),
    "sampling": ("bench_sampling.py", [], ["--rounds", "1", "--steps", "4"], False),
    "oom-ladder": ("bench_oom_ladder.py", [], ["--steps", "60", "--shrink-at", "30",
                                               "--grow-at", "45"], False),
    "predict": ("bench_predict.py", [], ["--quick"], False),
    "time-to-quality": ("bench_time_to_quality.py", [], ["--quick"], False),
    "ddp": ("bench_ddp.py", [], ["--steps", "6"], False),
    "ui-stall": ("bench_ui_stall.py", [], ["--shape", "16,64,64", "--steps", "5", "--idle", "2"],
                 True),
    "gc-pause": ("bench_gc_pause.py", [], ["--shape", "16,128,128"], True),
    # Needs the package index on its first run (the wheels holding the volumes).
    "real": ("bench_real.py", [], ["--quick"], False),
    "probe": ("bench_probe.py", ["--repeats", "7"], ["--repeats", "3"], False),
    "gpu": ("bench_gpu.py", [], [], False),
}


def command(name: str, quick: bool) -> list[str]:
    """The command line of one benchmark."""
    script, full, fast, display = BENCHMARKS[name]
    argv = [sys.executable, str(HERE / script), *(fast if quick else full)]
    if display and not os.environ.get("DISPLAY") and shutil.which("xvfb-run"):
        argv = ["xvfb-run", "-a", "-s", "-screen 0 1280x1024x24", *argv]
    return argv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few minutes per benchmark")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=None)
    parser.add_argument("--list", action="store_true", help="print the commands and stop")
    args = parser.parse_args()
    names = args.only or [n for n in BENCHMARKS if n != "gpu"]  # gpu: on a GPU machine only
    if args.list:
        for name in names:
            print(f"{name}: {' '.join(command(name, args.quick))}")
        return 0
    failed = []
    for name in names:
        argv = command(name, args.quick)
        print(f"## {name}\n\n`{' '.join(argv[argv.index(sys.executable) + 1:])}`, measured "
              f"at {measured_under()}\n", flush=True)
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=HERE)
        took = time.perf_counter() - started
        print(f"\n({name}: exit {done.returncode}, {took:.0f} s)\n", flush=True)
        if done.returncode != 0:
            failed.append(name)
    if failed:
        print(f"run_all.py: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
