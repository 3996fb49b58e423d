"""A mixture's training figures per source: each source's loss, examples and tokens, as the log rows and metrics.json
report them beside the shares the user asked for.

Per micro-batch the task's row losses (`Task.row_losses`) and each row's loss units and tokens are summed by source on
the device (no host sync); a step's sums join the window of the next log row once the step is done (a step redone
after running out of memory counts once; a non-finite step's loss is left out, as the run's loss leaves it). At a log
row the window is summed over processes, its examples and tokens added to the run's totals (`TrainState`), and each
source's mean loss per unit written with its realised shares so far.
"""

from __future__ import annotations

from typing import Any

import torch

from leantrain.run.checkpoint import TrainState

#: the window's rows: loss summed, its units, examples, tokens
LOSS, UNITS, EXAMPLES, TOKENS = range(4)


class SourceMeter:
    def __init__(self, names: list[str], rows: list[int], accelerator, state: TrainState):
        self.names, self.rows, self.accelerator = names, rows, accelerator
        device = accelerator.device
        self.dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
        self.window = torch.zeros((4, len(names)), dtype=self.dtype, device=device)
        if state.source_window:  # resumed: the checkpoint's part of the window (the whole job's, on the main process)
            self.window += torch.tensor(state.source_window, dtype=self.dtype, device=device).view(4, -1)
        if not state.source_examples:
            state.source_examples = [0.0] * len(names)
            state.source_tokens = [0.0] * len(names)
        self.step = torch.zeros_like(self.window)
        self.has_loss = True

    def step_started(self) -> None:
        self.step.zero_()

    def add(self, row_losses: torch.Tensor | None, batch: dict[str, Any]) -> None:
        source = batch["source"].to(self.window.device)
        nothing = torch.zeros_like(source, dtype=self.dtype)
        rows = torch.stack(
            [
                row_losses.detach().to(self.window.device, self.dtype) if row_losses is not None else nothing,
                batch["row_units"].to(self.window.device, self.dtype),
                torch.ones_like(source, dtype=self.dtype),
                batch["row_tokens"].to(self.window.device, self.dtype),
            ]
        )
        self.step.index_add_(1, source, rows)
        self.has_loss = self.has_loss and row_losses is not None

    def step_done(self, finite, counted=None) -> None:
        """`finite`: whether the step's loss counts (a device bool, never read here); `counted`: whether the step
        counts at all (--on-nan stop: a step after a bad one is undone), None: it does."""
        # the run's loss leaves a skipped step out; its examples were still drawn
        keep = torch.as_tensor(finite, device=self.step.device).to(self.dtype)
        self.step[LOSS] *= keep
        self.step[UNITS] *= keep
        if counted is not None:
            self.step *= torch.as_tensor(counted, device=self.step.device).to(self.dtype)
        self.window += self.step

    def log_row(self, state: TrainState) -> dict[str, dict[str, float | None]]:
        """Each source's figures for a log row: its loss since the last row, and its examples, tokens, realised
        shares and passes over its rows since the run began. Collective with several processes."""
        window = self.window
        if self.accelerator.num_processes > 1:
            window = self.accelerator.reduce(window.clone(), reduction="sum")
        loss, units, examples, tokens = window.tolist()
        self.window.zero_()
        state.source_window = []
        state.source_examples = [a + b for a, b in zip(state.source_examples, examples)]
        state.source_tokens = [a + b for a, b in zip(state.source_tokens, tokens)]
        return self.totals(state, loss, units)

    def totals(self, state: TrainState, loss=None, units=None) -> dict[str, dict[str, float | None]]:
        all_examples, all_tokens = sum(state.source_examples) or 1.0, sum(state.source_tokens) or 1.0
        out = {}
        for i, name in enumerate(self.names):
            row: dict[str, float | None] = {}
            if loss is not None:
                row["loss"] = loss[i] / units[i] if self.has_loss and units[i] else None
            row.update(
                examples=state.source_examples[i],
                tokens=state.source_tokens[i],
                share_examples=state.source_examples[i] / all_examples,
                share_tokens=state.source_tokens[i] / all_tokens,
                epochs=state.source_examples[i] / self.rows[i] if self.rows[i] else None,
            )
            out[name] = row
        return out

    def partial_sums(self) -> list[float]:
        """This process's window, flat: what a checkpoint keeps of a log row in progress."""
        return self.window.flatten().tolist()

    def set_partial_sums(self, values: list[float]) -> None:
        self.window.copy_(torch.tensor(values, dtype=self.dtype, device=self.window.device).view(4, -1))
