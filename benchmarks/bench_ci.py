"""Time `.ci/run` on clean clones, phase by phase, commits interleaved.

CI runs `.ci/run` on a clean clone of main on a fresh machine, and its goal is 8
minutes. This script does the same here for one or more commits: each round clones
the repository into a temporary folder, checks the commit out and runs `.ci/run`
there (new venv; uv's download cache is shared, as on a CI machine that keeps one),
reading its output line by line. It prints one row per run and, with several runs,
the median per commit.

The machine's speed drifts by 15-20 % over an hour, so two commits are compared in
interleaved rounds (A B A B ...) rather than one after the other, and the CPU
seconds of the run (user + system of every process it started) are printed beside
the wall time: they move much less with the machine's speed than the wall time does.

    python benchmarks/bench_ci.py                     # HEAD, once
    python benchmarks/bench_ci.py 9a6b55b HEAD --rounds 2

The phases are those of `make test`, in the order it prints their pytest summaries:
the Qt 5 parallel run (and, beside it, the resource tests and mypy), the serial
tests, then the Qt 6 parallel and serial runs. "install + lint" is the time until
import-linter's verdict: apt check, venv, uv installs, ruff and the contracts.
"""

from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from markdown_table import print_header, print_table

# The pytest summaries `make test` prints, in its order.
PHASES = ["Qt 5 parallel", "resource (beside)", "serial", "Qt 6 parallel", "Qt 6 serial"]
_SUMMARY = re.compile(r"^=+ (?P<counts>.*?) in (?P<seconds>[\d.]+)s(?: \([\d:]+\))? =+$")
_CONTRACTS = re.compile(r"^Contracts: \d+ kept, \d+ broken\.")


@dataclass
class CiRun:
    """What one `.ci/run` printed, and when."""

    commit: str
    seconds: float = 0.0  # wall time of the whole run
    cpu_seconds: float = 0.0  # user + system of every process it started
    install_lint: float | None = None  # seconds until import-linter's verdict
    phases: dict[str, float] = field(default_factory=dict)  # pytest's own "in N s"
    counts: dict[str, str] = field(default_factory=dict)  # "785 passed, 2 skipped, ..."
    mypy: str = ""
    returncode: int | None = None


def read_run(timed_lines: Iterable[tuple[float, str]], commit: str) -> CiRun:
    """The phases of one run from its output lines, each with its seconds since the start.

    Parameters
    ----------
    timed_lines
        ``(seconds since the run started, line)`` in the order printed.
    commit
        What the run tested, for the table.

    Returns
    -------
    CiRun
        Install-and-lint time, each pytest summary under its phase's name, mypy's verdict.
        The wall time, CPU time and exit code are the caller's to fill in.
    """
    run = CiRun(commit)
    summaries = 0
    for seconds, line in timed_lines:
        line = line.rstrip()
        if run.install_lint is None and _CONTRACTS.match(line):
            run.install_lint = seconds
        elif line.startswith(("Success: no issues", "Found ")) and "source file" in line:
            run.mypy = line
        elif (match := _SUMMARY.match(line)) and summaries < len(PHASES):
            name = PHASES[summaries]
            run.phases[name] = float(match["seconds"])
            run.counts[name] = match["counts"].strip()
            summaries += 1
    return run


def time_ci(repo: Path, commit: str, timeout: float) -> CiRun:
    """Clone ``repo``, check out ``commit`` and run its `.ci/run`, read as it prints."""
    with tempfile.TemporaryDirectory(prefix="bench-ci-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True, timeout=300)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True,
                       timeout=60)
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        timed: list[tuple[float, str]] = []
        proc = subprocess.Popen([str(clone / ".ci" / "run")], cwd=clone, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                timed.append((time.monotonic() - start, line))
                if time.monotonic() - start > timeout:
                    proc.kill()
                    break
        finally:
            returncode = proc.wait()
        seconds = time.monotonic() - start
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        run = read_run(timed, commit)
        run.seconds = seconds
        run.cpu_seconds = (cpu_after.ru_utime - cpu_before.ru_utime
                           + cpu_after.ru_stime - cpu_before.ru_stime)
        run.returncode = returncode
        if returncode != 0:
            sys.stderr.write("".join(line for _, line in timed[-40:]))
        return run


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def row(run: CiRun, round_number: int) -> list[str]:
    """One table row: wall and CPU seconds, then each phase."""
    result = "passed" if run.returncode == 0 else f"FAILED (rc {run.returncode})"
    return [run.commit, str(round_number), _s(run.seconds), _s(run.cpu_seconds),
            _s(run.install_lint), *(_s(run.phases.get(name)) for name in PHASES), result]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commits", nargs="*", default=["HEAD"],
                        help="commits to time, interleaved in each round (default: HEAD)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds before a run is killed (CI's hard limit is 90 minutes)")
    args = parser.parse_args()

    # Short hashes, resolved once, so that HEAD means the same commit in every round.
    commits = [subprocess.run(["git", "-C", str(args.repo), "rev-parse", "--short", c],
                              capture_output=True, text=True, check=True).stdout.strip()
               for c in args.commits]
    print_header("## .ci/run on a clean clone (benchmarks/bench_ci.py)")
    header = ["commit", "round", "total s", "CPU s", "install + lint s",
              *(f"{p} s" for p in PHASES), "result"]
    runs: list[CiRun] = []
    rows: list[list[str]] = []
    for number in range(1, args.rounds + 1):
        for commit in commits:
            run = time_ci(args.repo, commit, args.timeout)
            runs.append(run)
            rows.append(row(run, number))
            print(" | ".join(rows[-1]), flush=True)
    print()
    print_table(header, rows)
    if args.rounds > 1:
        medians = []
        for commit in commits:
            mine = [r for r in runs if r.commit == commit]
            medians.append([commit, f"{len(mine)} runs",
                            _s(statistics.median(r.seconds for r in mine)),
                            _s(statistics.median(r.cpu_seconds for r in mine))])
        print_table(["commit", "runs", "median total s", "median CPU s"], medians)
    last = runs[-1]
    for name in PHASES:
        print(f"{name}: {last.counts.get(name, '-')}")
    print(f"mypy: {last.mypy or '-'}")
    return 0 if all(r.returncode == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
