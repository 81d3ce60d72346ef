"""Run Python code in a subprocess where some packages cannot be imported.

For the tests that prove a part of the package runs on a machine without them
(a GPU server, a cluster worker): the code's own imports, and everything they
pull in, meet an ImportError for each blocked top-level package.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

PREAMBLE = """
import importlib.abc
import sys

BLOCKED = set({blocked!r})


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not installed on this machine")
        return None


sys.meta_path.insert(0, Blocker())
"""

EPILOGUE = """
leaked = sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED)
assert not leaked, leaked
print("ran without them")
"""


def run_without(blocked: list[str], body: str, timeout: float = 300) -> None:
    """Run ``body`` with ``blocked`` unimportable; fail with its stderr if it fails.

    The run also fails when a blocked package was imported anyway (it cannot
    be, but a module could have been put in ``sys.modules`` by hand).
    """
    script = PREAMBLE.format(blocked=blocked) + textwrap.dedent(body) + EPILOGUE
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ran without them")
