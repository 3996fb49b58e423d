"""Writing a benchmark's results: NAME.json (the data and its context) and NAME.md (the page, with the context
table every results page ends with)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def machine_context(**extra: Any) -> dict[str, Any]:
    """The context row every results page ends with: the CPU (name, family and model, matmul instruction sets),
    Python, torch, transformers and the time; `extra` first (threads, a command...)."""
    import platform
    import time

    import torch
    import transformers

    from leantrain.parallel import cpu_model

    return {
        "cpu": cpu_model(), **extra, "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }  # fmt: skip


def write_results(out: Path, name: str, page: list[str], context: dict[str, Any], data: dict[str, Any]) -> str:
    """Write out/NAME.json and out/NAME.md (`page` then the context table); returns the page's text."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"context": context, **data}, indent=2) + "\n")
    text = "\n".join([*page, "", "| context | |", "|---|---|", *[f"| {k} | {v} |" for k, v in context.items()], ""])
    (out / f"{name}.md").write_text(text)
    return text
