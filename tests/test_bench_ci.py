"""``benchmarks/bench_ci.py`` reads the phases of `.ci/run` from what it prints.

The lines below are what `.ci/run` printed at 532b785 (the pytest summaries, their
headings and neighbours, mypy's verdict, import-linter's), in its order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

PRINTED = """\
All checks passed!
Contracts: 3 kept, 0 broken.
============================= slowest 15 durations =============================
14.86s call     tests/_qt/test_shutdown.py::test_shutdown_case[close-then-exit]
=========== 785 passed, 2 skipped, 25 warnings in 168.24s (0:02:48) ============
=============================== warnings summary ===============================
========== 42 passed, 803 deselected, 1 warning in 136.24s (0:02:16) ===========
type check (beside the tests):
Success: no issues found in 116 source files
================ 7 passed, 838 deselected, 1 warning in 21.51s =================
=========================== short test summary info ============================
================= 1 failed, 67 passed, 2 warnings in 36.64s ====================
================= 3 passed, 75 deselected, 1 warning in 12.93s =================
CI finished in 276 s
"""


@pytest.fixture
def bench_ci(monkeypatch):
    """``bench_ci`` imported as the script imports it (its folder on ``sys.path``)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_ci

    return bench_ci


def test_each_pytest_summary_is_its_phase_in_make_tests_order(bench_ci):
    timed = [(float(i), line) for i, line in enumerate(PRINTED.splitlines(keepends=True))]
    run = bench_ci.read_run(timed, "532b785")
    assert run.install_lint == 1.0  # the contracts' line, the second printed
    assert run.phases == {"Qt 5 parallel": 168.24, "resource (beside)": 136.24,
                          "serial": 21.51, "Qt 6 parallel": 36.64, "Qt 6 serial": 12.93}
    assert run.counts["Qt 6 parallel"] == "1 failed, 67 passed, 2 warnings"
    assert run.mypy == "Success: no issues found in 116 source files"


def test_a_run_that_stopped_early_has_only_the_phases_it_reached(bench_ci):
    lines = PRINTED.splitlines()[:5]  # up to the first summary
    run = bench_ci.read_run(list(enumerate(lines)), "HEAD")
    assert list(run.phases) == ["Qt 5 parallel"]
    assert run.mypy == ""
    run.seconds, run.cpu_seconds, run.returncode = 200.0, 390.0, 2
    assert bench_ci.row(run, 1) == ["HEAD", "1", "200", "390", "1", "168", "-", "-", "-", "-",
                                    "FAILED (rc 2)"]
