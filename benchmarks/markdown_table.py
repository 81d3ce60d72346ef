"""The table format every benchmark prints (pastes into docs/benchmarks.md as is)."""

from __future__ import annotations


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """Print a Markdown table and a blank line."""
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def measured_under() -> str:
    """One line: the commit, the date, the machine and its load, for the table below it."""
    import datetime
    import os
    import platform
    import subprocess

    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, cwd=os.path.dirname(__file__) or ".")
        commit = done.stdout.strip() if done.returncode == 0 else ""
    except OSError:
        commit = ""
    commit = commit or os.environ.get("NAPARI_FINETUNE_COMMIT", "unknown")
    try:
        load = "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "load average unknown"
    memory = ""
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"commit {commit}, {now}, {platform.machine()} {os.cpu_count()} cores{memory}, "
            f"python {platform.python_version()}, {load}")


def print_header(title: str) -> None:
    """Print ``title`` and the line saying where and when the tables below were measured."""
    print(title)
    print(f"measured at {measured_under()}\n")
