"""Compiled runs on a CPU: the same seed and settings give the same bits.

Inductor's C++ code adds an embedding's gradient rows with atomic adds from every OpenMP thread at once: the
order of the additions to a row (a word seen twice, BERT's one token-type row) then depends on the threads'
timing, and two runs of one job differ in the last bits of their embeddings (up to 2e-9 after three steps of
the tiny BERT). With torch's deterministic algorithms on, inductor lowers those sums to torch's own `index_put_`,
which adds the rows of a CPU tensor in order. Dynamo guards on the setting, so it holds for the whole run
(a graph compiled with it and run without would compile again, with atomics)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.utils.deterministic


@contextlib.contextmanager
def deterministic_compiled_kernels(on: bool) -> Iterator[None]:
    """Torch's deterministic algorithms for the run, put back as found after; nothing when off or already on
    (the user's own setting, warn_only included, stands)."""
    if not on or torch.are_deterministic_algorithms_enabled():
        yield
        return
    fill = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    # warn_only: an operator with no deterministic kernel warns rather than stopping the run; and no NaN fill
    # of every new tensor, which costs time and changes no result
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]
