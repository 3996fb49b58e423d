"""--freeze: parameters that keep their pretrained values, with no gradient and no optimizer state.

`embeddings` names the model's input embedding table (`get_input_embeddings()`: BERT's word embeddings, a Llama's
`embed_tokens`), the largest tensor of a small encoder; anything else is a glob over parameter names as
`named_parameters()` spells them (`bert.encoder.layer.[0-2].*`). On a CPU the word embeddings cost a fine-tuning
step more than their share: their gradient is a dense table as large as the weights (MiniLM's 11.7 M numbers, a
tenth of them touched by a batch) and AdamW updates every number of it. Frozen, a MiniLM step at batch 16 runs
12-22% faster, at the same accuracy on the default job's tweets (`benchmarks/results/quickstart.md`).
"""

from __future__ import annotations

import fnmatch
from typing import Any

from leantrain.errors import ConfigError

#: --freeze's value that freezes nothing
NOTHING = "none"
#: --freeze's name for the model's input embedding table
EMBEDDINGS = "embeddings"


def patterns(spec: str | None) -> list[str]:
    """The comma-separated names of --freeze; `none` (or nothing) is none."""
    names = [p.strip() for p in (spec or "").split(",") if p.strip()]
    return [] if names == [NOTHING] else names


def apply(model: Any, spec: str | None) -> str | None:
    """Freeze what `spec` names in `model`; returns what was done, for the log, or None for nothing. Refused in one
    line: a name that matches no parameter, or one that would leave nothing to train."""
    names = patterns(spec)
    if not names:
        return None
    named = dict(model.named_parameters())
    frozen: dict[str, Any] = {}
    for name in names:
        if name == EMBEDDINGS:
            table = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
            weight = getattr(table, "weight", None)
            found = {n: p for n, p in named.items() if p is weight}
        else:
            found = {n: p for n, p in named.items() if fnmatch.fnmatchcase(n, name)}
        if not found:
            example = next(iter(named), "")
            raise ConfigError(
                f"--freeze {name}: no parameter of the model is named so; give embeddings or a glob over names such "
                f"as {example.rsplit('.', 1)[0]}.*"
            )
        frozen.update(found)
    if len(frozen) == len(named):
        raise ConfigError(f"--freeze {spec}: that is every parameter, so nothing would train; freeze fewer")
    for parameter in frozen.values():
        parameter.requires_grad_(False)
    count = sum(p.numel() for p in frozen.values())
    total = sum(p.numel() for p in named.values())
    tied = _tied_to_output(model, frozen.values())
    return (
        f"frozen (--freeze {spec}): {len(frozen)} tensor{'s' if len(frozen) > 1 else ''}, {count / 1e6:.1f} M of "
        f"{total / 1e6:.1f} M parameters"
        + ("; the output layer shares the embedding table, so it stays as it was too" if tied else "")
    )


def _tied_to_output(model: Any, frozen: Any) -> bool:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return weight is not None and any(p is weight for p in frozen)
