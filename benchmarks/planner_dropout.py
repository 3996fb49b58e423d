"""The planner's memory with and without dropout: MiniLM in bf16 at length 128 (AdamW, no checkpointing), its
dropout as shipped (0.1) and at 0 (`--dropout 0`, the default job's), measured by `planner_measure` (the trainer's
step, resident high-water mark over the baseline) against the planner's prediction (without its one-off runtime
share, as `planner_accuracy.py` compares them).

    python benchmarks/planner_dropout.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.planner_measure import Trial, measure_trials
from leantrain.planner.memory import estimate, model_facts, with_dropout


def main() -> None:
    facts = model_facts(None)
    for rate in (None, 0.0):
        for batch in (16, 32):
            measured = measure_trials([Trial(None, "bf16", False, "adamw", batch, 1, 128, 3, dropout=rate)])[0]
            planned = with_dropout(facts, rate) if rate is not None else facts
            e = estimate(planned, batch, 128, "bf16", False, "adamw", 1, "cpu", flat=False)
            predicted, real = e.peak - e.runtime, measured["measured_peak_bytes"]
            print(
                f"dropout {'as shipped' if rate is None else rate} batch {batch}: measured {real / 2**20:.0f} MiB, "
                f"predicted {predicted / 2**20:.0f} MiB (activations {e.activations / 2**20:.0f}), "
                f"ratio {predicted / real:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
