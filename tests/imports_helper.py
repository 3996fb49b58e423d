"""Which heavy libraries a piece of code imports, run in a fresh interpreter (this one has imported everything)."""

from __future__ import annotations

import ast
import subprocess
import sys


def imported(code: str, *modules: str) -> list[str]:
    """The top-level packages among `modules` that `code` leaves imported in a fresh Python, sorted."""
    probe = f"{code}\nimport sys\nprint(sorted({{m.split('.')[0] for m in sys.modules}} & {set(modules)!r}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return ast.literal_eval(out.strip())
